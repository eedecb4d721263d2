// 07_full_p5: the whole engine. Every NIC of every GPU group, a data thread per group, and
// each optimization of the published ladder behind its own switch, so one binary measures
// what each one buys (--ladder runs them all, one table row each).
//
// The server is now an engine with many peers, as libfabric's RDM endpoints are meant to be
// used: its lanes (an endpoint, CQ and AV per NIC), source memory and data threads open once;
// a client is an entry in the lanes' AVs with its own region, keys and window, and the
// threads serve every client in turn. The client receives on a thread per group too, so that
// lanes and threads add rate at both ends. This file is the network, grown from 06's;
// engine.hpp says what the others hold, and README.md walks through them rung by rung.

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "address.hpp"
#include "engine.hpp"
#include "error.hpp"
#include "options.hpp"
#include "program.hpp"
#include "provider.hpp"
#include "provider_watch.hpp"
#include "topology.hpp"

namespace p5 {

// This machine's topology, or with --topology the machine that hwloc XML describes.
Topology LoadTopology(const Options& options) {
  return options.topology.empty() ? Topology::Load() : Topology::FromXml(options.topology);
}
// What the pages are in. A rehearsal (--topology) moves host memory: there is no such GPU here.
MemoryKind MemoryFor(const Options& options) {
  if (options.topology.empty()) return ResolveMemory(options.memory);
  if (IsGpu(options.memory))
    throw UsageError("--topology rehearses another machine with host memory: --memory " +
                     std::string(options.memory == MemoryKind::kCuda ? "cuda" : "cuda-vmm") +
                     " cannot go with it");
  return MemoryKind::kHost;
}

// The NICs to use, one fi_info each: the NICs of every group of the topology in group order
// (GPU 0's first), --nics of them, dealt in turn over all NICs when more lanes than NICs are
// asked for (several endpoints on one domain, as shm and loopback tcp need).
// `no_hmem` says why FI_HMEM was left out of the hints, if it was (the pages are then staged).
FiInfoPtr EngineHints(const Options& options, MemoryKind memory) {
  FiInfoPtr hints(fi_allocinfo());
  hints->ep_attr->type = FI_EP_RDM;           // reliable, unconnected: one endpoint talks to many
  hints->caps = FI_MSG | FI_SOURCE | FI_RMA;  // FI_SOURCE: completions name the sender
  // GPU memory: ask for providers that can take it (FI_HMEM), unless told to stage it.
  if (IsGpu(memory) && options.gpu_path != GpuPathMode::kStaged) hints->caps |= FI_HMEM;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  // The memory-registration modes this program honours (efa-direct asks for all of them).
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_HMEM;
  // Every lane is a domain of its own, and one thread alone uses it: the provider need not
  // lock anything for us.
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  return hints;
}
Plan FindNics(const Options& options, std::span<const uint8_t> peer, MemoryKind memory,
              std::string* no_hmem, bool print) {
  const FiInfoPtr hints = EngineHints(options, memory);
  std::vector<FiInfoPtr> domains = SelectDomains(*hints, options, peer, no_hmem);
  // Loopback is a NIC only when asked for by name, or when it is the only one.
  if (options.domain.empty() && domains.size() > 1)
    std::erase_if(domains,
                  [](const FiInfoPtr& d) { return std::string(d->domain_attr->name) == "lo"; });
  // In name order (mca2 before mca10), so lane i is the same-numbered NIC on both hosts.
  std::sort(domains.begin(), domains.end(), [](const FiInfoPtr& x, const FiInfoPtr& y) {
    const std::string a = x->domain_attr->name, b = y->domain_attr->name;
    return a.size() != b.size() ? a.size() < b.size() : a < b;
  });

  std::vector<NicDevice> nics;
  for (const auto& d : domains) {
    NicDevice nic{d->domain_attr->name, std::nullopt, LinkGbps(*d)};
    if (d->nic && d->nic->bus_attr && d->nic->bus_attr->bus_type == FI_BUS_PCI) {
      const fi_pci_attr& pci = d->nic->bus_attr->attr.pci;
      nic.pci = PciAddress{pci.domain_id, pci.bus_id, pci.device_id, pci.function_id};
    }
    nics.push_back(nic);
  }
  const Topology topology = LoadTopology(options);
  std::vector<PciAddress> seen;  // the GPUs this process sees, by CUDA device index
  if (IsThisSystem(topology)) {
    for (int g = 0; IsGpu(memory) && g < CudaDeviceCount(); ++g)
      if (auto pci = PciAddress::Parse(CudaPciBusId(g))) seen.push_back(*pci);
  } else {
    // --topology: a rehearsal of the machine the file describes (a p5: tests/data/p5.xml).
    // Its GPUs group the NICs, and lane k's NIC takes the place of that machine's k-th NIC
    // (by PCI address), so that NICs pair, group and get their threads and cores as there.
    // CUDA_VISIBLE_DEVICES's indices pick among its GPUs as CUDA would there.
    seen = VisibleOf(GpusOf(topology), std::getenv("CUDA_VISIBLE_DEVICES"));
    const std::vector<PciAddress> there = NicsOf(topology);
    for (size_t k = 0; k < nics.size() && k < there.size(); ++k) nics[k].pci = there[k];
  }
  // --gpus: some of those, each with its own NICs (GroupDevices leaves the others' out).
  std::vector<PciAddress> gpus = seen;
  std::vector<int> indices;
  if (!options.gpus.empty() && seen.empty())
    throw UsageError("invalid --gpus: this process uses no GPU (host memory, or none seen)");
  if (!options.gpus.empty()) {
    gpus.clear();
    for (int g : options.gpus) {
      if (static_cast<size_t>(g) >= seen.size())
        throw UsageError("invalid --gpus " + std::to_string(g) + ": this process sees " +
                         Plural(seen.size(), "GPU") + " (0-" + std::to_string(seen.size() - 1) +
                         ")");
      gpus.push_back(seen[g]);
      indices.push_back(g);
    }
  }
  Plan plan;
  plan.groups = GroupDevices(topology, gpus, nics, indices);
  size_t others = nics.size();
  for (const auto& group : plan.groups) others -= group.nics.size();
  if (print) {
    if (!IsThisSystem(topology))
      std::printf(
          "rehearsal of the machine in %s: its GPUs, cores and NICs' places, this "
          "host's NICs and host memory\n",
          options.topology.c_str());
    std::printf("%s\n", FormatTotals(plan.groups, nics).c_str());
    for (const auto& group : plan.groups) std::printf("  %s\n", FormatGroup(group, nics).c_str());
    if (others > 0)
      std::printf("  %s under GPUs this process does not use: left to their processes\n",
                  Plural(others, "other NIC").c_str());
  }
  std::vector<std::pair<size_t, size_t>> all;  // (group, NIC) in group order
  for (size_t g = 0; g < plan.groups.size(); ++g)
    for (size_t nic : plan.groups[g].nics) all.emplace_back(g, nic);
  if (all.empty()) throw Error("the topology has no NIC");
  const size_t lanes = options.nics > 0 ? options.nics : all.size();
  if (lanes > wire::kMaxLanes)
    throw UsageError("invalid --nics " + std::to_string(lanes) + " (at most " +
                     std::to_string(wire::kMaxLanes) + ")");
  for (size_t i = 0; i < lanes; ++i) {
    const auto [group, nic] = all[i % all.size()];
    plan.lanes.emplace_back(fi_dupinfo(domains[nic].get()));
    plan.group_of.push_back(group);
  }
  return plan;
}
// A data lane names no senders: without FI_SOURCE the provider looks nothing up per
// completion, and only the control endpoints (which must know who spoke) pay for it.
FiInfoPtr DataLane(const fi_info& nic) {
  FiInfoPtr info(fi_dupinfo(&nic));
  info->caps &= ~FI_SOURCE;
  info->rx_attr->caps &= ~FI_SOURCE;
  return info;
}
// Measured on the mini-cluster (README.md): over tcp, sleeping in the CQ's wait fd leaves
// the CPUs to the kernel's TCP stack, which carries the data, and wins; shm has no wait fd,
// and RDMA NICs are polled.
WaitMode ChooseWaitMode(WaitMode requested, const fi_info& nic) {
  if (requested != WaitMode::kAuto) return requested;
  const std::string provider = nic.fabric_attr->prov_name;
  return provider.rfind("tcp", 0) == 0 ? WaitMode::kBlock : WaitMode::kSpin;
}
// The window (-W) bounds what a lane has in flight only if a WRITE completes once the target
// has it: where the provider completes it earlier (Quirk::kCompletesBeforeDelivery), the
// WRITE asks for delivery; elsewhere the provider's default, cheaper by a third on 1.17's shm
// and tcp;ofi_rxm. Only the last WRITE of a doorbell's group asks for a completion at all
// (PostWrite, README.md).
uint64_t WriteCompletion(const fi_info& nic) {
  return Has(Quirk::kCompletesBeforeDelivery, nic) ? FI_DELIVERY_COMPLETE : 0;
}
// GPU pages that shm moves itself (CUDA IPC) report their own completions: FI_INJECT would
// send each through a host buffer of the provider's.
bool OneCompletionPerGroup(const fi_info& nic, const MemoryPath* pages) {
  return WriteCompletion(nic) != 0 &&
         (pages == nullptr || pages->path != PageBuffer::Path::kGpuDirect);
}
Network Network::Open(FiInfoPtr nic, WaitMode wait, const MemoryPath* pages, size_t cq_entries,
                      bool selective) {
  Network net;
  const uint64_t completion = WriteCompletion(*nic);
  static_cast<Endpoint&>(net) =
      Endpoint::Open(*nic, wait == WaitMode::kBlock, pages, cq_entries, selective);
  net.source = (net.info->caps & FI_SOURCE) != 0;
  net.write_completion = completion;
  net.selective = selective;
  net.reads_more = Has(Quirk::kReadsMore, *net.info);
  net.delivers_in_order = Has(Quirk::kDeliversInOrder, *net.info);
  return net;
}
// What the writer needs to reach our region: with FI_MR_VIRT_ADDR, remote addresses are
// virtual addresses; otherwise (tcp without it, for example) offsets from 0. The key is the
// provider's, or the random one common/registration chose for us.
wire::RemoteRegion Network::Advertise(fid_mr* mr, const void* data, size_t size) const {
  const bool virt = info->domain_attr->mr_mode & FI_MR_VIRT_ADDR;
  return {virt ? reinterpret_cast<uint64_t>(data) : 0, size, fi_mr_key(mr)};
}
void Network::PostRecv(Op& op) {
  op.kind = OpKind::kRecv;
  FI_CHECK(
      fi_recv(ep.get(), op.buffer, wire::kMaxMessageBytes, op.desc, FI_ADDR_UNSPEC, &op.context));
}
// False when the provider's queue is full (-FI_EAGAIN): poll completions, then try again.
bool Network::PostSend(Op& op, fi_addr_t dest) {
  op.kind = OpKind::kSend;
  op.peer = dest;
  const InProvider inside("fi_send");  // spins for good on a dead shm peer's lock
  ssize_t rc = fi_send(ep.get(), op.buffer, op.length, op.desc, dest, &op.context);
  if (rc == -FI_EAGAIN) return false;
  FI_CHECK(rc);
  return true;
}
// One RDMA WRITE of op's buffer to `offset` in the peer's region, carrying `immediate`.
// FI_MORE in `flags` tells the provider that more WRITEs follow at once: it may hold this one
// back and ring the NIC's doorbell once for all of them.
bool Network::PostWrite(Op& op, fi_addr_t dest, const wire::RemoteRegion& region, uint64_t offset,
                        uint32_t immediate, uint64_t flags) {
  op.kind = OpKind::kWrite;
  op.peer = dest;
  iovec iov{op.buffer, op.length};
  fi_rma_iov rma{region.address + offset, op.length, region.key};
  fi_msg_rma msg{&iov, &op.desc, 1, dest, &rma, 1, &op.context, op.immediate ? immediate : 0};
  // A WRITE that more follow at once (FI_MORE), small enough to be copied out as it is posted
  // (FI_INJECT), reports nothing where completions are selective: the group's last one does,
  // once delivered, and a peer's commands are taken in order (WriteCompletion).
  op.signaled = !selective || !(flags & FI_MORE) || op.length > info->tx_attr->inject_size;
  const uint64_t report =
      op.signaled ? FI_COMPLETION | write_completion | (op.delivered ? FI_DELIVERY_COMPLETE : 0)
                  : FI_INJECT;
  const InProvider inside("fi_writemsg");  // spins for good on a dead shm peer's lock
  // An unreported WRITE where FI_MORE means nothing: the provider's own inject call, its
  // shortest path (fabtests' fi_rma_bw posts every small WRITE so).
  const bool inject = !op.signaled && !reads_more;
  ssize_t rc =
      inject && op.immediate
          ? fi_inject_writedata(ep.get(), op.buffer, op.length, immediate, dest, rma.addr, rma.key)
      : inject
          ? fi_inject_write(ep.get(), op.buffer, op.length, dest, rma.addr, rma.key)
          : fi_writemsg(ep.get(), &msg, (op.immediate ? FI_REMOTE_CQ_DATA : 0) | report | flags);
  if (rc == -FI_EAGAIN) return false;
  FI_CHECK(rc);
  return true;
}
// --wait block: sleep until any lane's CQ has something, or `timeout_ms` passes.
// fi_trywait says whether sleeping is safe (nothing is already waiting to be read).
void WaitForCompletions(std::span<Network> lanes, int timeout_ms) {
  std::vector<pollfd> fds;
  for (auto& lane : lanes) {
    if (lane.wait_fd < 0) return;
    fid* cq = &lane.cq->fid;
    if (fi_trywait(lane.fabric.get(), &cq, 1) != FI_SUCCESS) return;
    fds.push_back({lane.wait_fd, POLLIN, 0});
  }
  poll(fds.data(), fds.size(), timeout_ms);
}
void PrintHeader(const char* role, const Plan& plan, WaitMode wait, const MemoryPath& memory,
                 std::optional<bool> emulated_write) {
  std::string domains;
  for (const auto& lane : plan.lanes)
    domains += std::string(domains.empty() ? "" : ",") + lane->domain_attr->name;
  // efa says whether the device writes, or its protocol emulates WRITE with messages.
  const char* writes = !emulated_write   ? ""
                       : *emulated_write ? "; efa emulates RDMA WRITE with messages "
                                           "(FI_OPT_EFA_EMULATED_WRITE: no device RDMA write)"
                                         : "; RDMA WRITE by the device (FI_OPT_EFA_EMULATED_WRITE "
                                           "false)";
  // The writer says when its WRITEs count as done, where it is not the provider's default.
  const bool delivery = std::string(role) == "server" && WriteCompletion(*plan.lanes[0]) != 0;
  const bool selective = delivery && OneCompletionPerGroup(*plan.lanes[0], &memory);
  // The writer says where --doorbell cannot save doorbells (Quirk::kReadsMore).
  const std::string more = std::string(role) == "server" && !Has(Quirk::kReadsMore, *plan.lanes[0])
                               ? std::string("; ") + plan.lanes[0]->fabric_attr->prov_name +
                                     " reads no FI_MORE: each WRITE goes out as it is posted"
                               : "";
  std::printf("%s %s: provider %s, %zu lane%s (%s), %s, pages in %s%s%s%s%s\n", kProgram, role,
              plan.lanes[0]->fabric_attr->prov_name, plan.lanes.size(),
              plan.lanes.size() == 1 ? "" : "s", domains.c_str(),
              wait == WaitMode::kBlock ? "blocking waits" : "spinning",
              DescribeMemoryPath(memory).c_str(), writes, more.c_str(),
              delivery ? "; WRITEs complete once delivered (FI_DELIVERY_COMPLETE)" : "",
              selective ? ", the last of each doorbell's group reporting for the group "
                          "(FI_SELECTIVE_COMPLETION)"
                        : "");
  std::fflush(stdout);
}
int ServerMain(const Options& options) {
  if (options.threads > wire::kMaxLanes)
    throw UsageError("invalid --threads " + std::to_string(options.threads) + " (0 to " +
                     std::to_string(wire::kMaxLanes) + ")");
  InstallStopHandlers(kProgram);
  // Over tcp;ofi_rxm every endpoint keeps receive buffers posted, 4096 of 16 KiB by default:
  // 64 MiB a session of one lane holds before it moves a byte, which 16 idle strangers turned
  // into a gigabyte. The server's data lanes receive no messages (they only WRITE), its
  // control endpoint a few small ones: 256 are plenty, unless the environment says otherwise.
  setenv("FI_OFI_RXM_MSG_RX_SIZE", "256", 0);
  const MemoryKind memory = MemoryFor(options);
  const Topology topology = LoadTopology(options);
  std::string no_hmem;
  const Plan plan = FindNics(options, {}, memory, &no_hmem, true);
  const WaitMode wait = ChooseWaitMode(options.wait, *plan.lanes[0]);
  // How GPU memory travels: asked of lane 0's provider once, for every session.
  Network probe = Network::Open(FiInfoPtr(fi_dupinfo(plan.lanes[0].get())), wait);
  const MemoryPath path = ChooseMemoryPath(probe.domain.get(), *probe.info, memory,
                                           options.gpu_path, no_hmem, options.dmabuf);
  const std::optional<bool> emulated = EmulatedWrite(probe.ep.get());
  PrintHeader("server", plan, wait, path, emulated);
  RequireDeviceWrites(path, emulated);
  // Control messages have an endpoint of their own on lane 0's NIC (service.cpp); the data
  // lanes are opened once, by the threads that drive them, for every client.
  Engine engine(options, plan, topology, wait, path);
  // Capacity, stated: clients of the default window share each lane's queue, as the engine
  // admits them (Engine::WindowRoom), and at most --max-clients.
  const uint64_t queue = plan.lanes[0]->tx_attr->size;
  const uint64_t turns = engine.WindowRoom(0) / queue;
  const uint64_t by_queue = engine.WindowRoom(0) / std::max<uint64_t>(options.window, 1);
  std::printf(
      "capacity: %s of -W %llu at once (%llu x a lane's queue of %llu WRITEs; "
      "--max-clients %llu); more are told busy at once\n",
      Plural(std::min<uint64_t>(by_queue, options.max_clients), "client").c_str(),
      static_cast<unsigned long long>(options.window), static_cast<unsigned long long>(turns),
      static_cast<unsigned long long>(queue), static_cast<unsigned long long>(options.max_clients));
  return service::Serve(options, *plan.lanes[0], wait, engine);
}
int ClientMain(const Options& options) {
  InstallStopHandlers(kProgram);  // Ctrl-C or SIGTERM: BYE, then exit (SayByeAndStop)
  const std::vector<uint8_t> peer = FromHex(options.peer);
  CheckClientOptions(options);
  if (options.ladder) return RunLadder(options, peer);
  PrintSummary(RunSession(options, peer, EngineFromOptions(options), options.warm, true),
               options.json);
  return kExitOk;
}
}  // namespace p5

int main(int argc, char** argv) {
  using namespace p5;
  Options options;
  options.warmup = 16;
  // Its source pages, made once at start (every buffer holds the data set): a benchmark's
  // pages of 64 KiB to 4 MiB are many distinct ones in it.
  options.server_memory = 256ull << 20;
  const char* about =
      "Lesson 07: the full engine. Without an address: serve clients, several at once, on "
      "every NIC of every group. With the server's address: ask for the engine the switches "
      "describe (all optimizations on by default), send --requests requests of --pages random "
      "pages each, verify; --ladder measures each optimization in turn.";
  if (int rc = ParseCommandLine(argc, argv, about, kProgram,
                                kServeOptions | kTransferOptions | kWindowOptions | kWarmupOptions |
                                    kLaneOptions | kEngineOptions | kHostOptions,
                                options);
      rc >= 0)
    return rc;
  // --dmabuf off: libfabric's own CUDA registration takes a dmabuf where it can (efa from 2.x
  // tries one first for memory registered by address, efa_mr.c), unless told not to, before
  // its first fi_getinfo reads its parameters. A value the user set stands.
  if (options.dmabuf == DmabufMode::kOff) setenv("FI_HMEM_CUDA_USE_DMABUF", "0", 0);
  if (options.check) return RunProgram(kProgram, [&] { return RunCheck(options); });
  return RunProgram(
      kProgram, [&] { return options.peer.empty() ? ServerMain(options) : ClientMain(options); });
}
