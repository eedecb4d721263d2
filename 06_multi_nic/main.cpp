// 06_multi_nic: several NICs, chosen from the machine's topology, and pages striped over them.
//
// A p5 has 4 EFA NICs under each GPU's PCIe switch. hwloc tells which NICs, NUMA node and
// cores belong with which GPU (common/topology.hpp); the program opens one fabric, domain,
// CQ, AV and endpoint per chosen NIC, a "lane". CONNECT carries every lane's address and the
// region's key on every lane; lane i of the server writes to lane i of the client, page after
// page in turn, and the client counts completions over all lanes. --wait block sleeps in the
// provider's wait objects instead of spinning, which matters when the CPUs are also the
// network (tcp on a small machine). The walkthrough is in README.md.

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
#include <cstring>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "address.hpp"
#include "backoff.hpp"
#include "completion.hpp"
#include "cuda_memory.hpp"
#include "error.hpp"
#include "fabric_handles.hpp"
#include "host_buffer.hpp"
#include "mailbox.hpp"
#include "options.hpp"
#include "page_buffer.hpp"
#include "page_data.hpp"
#include "program.hpp"
#include "protocol.hpp"
#include "provider.hpp"
#include "provider_watch.hpp"
#include "reception.hpp"
#include "registration.hpp"
#include "report.hpp"
#include "text.hpp"
#include "topology.hpp"

using namespace common;

namespace {

constexpr const char* kProgram = "06_multi_nic";
constexpr size_t kRecvDepth = 8;  // receives each side keeps posted
constexpr uint64_t kMaxRequestsInFlight = 64;

using Clock = std::chrono::steady_clock;

// One posted operation. libfabric hands `context` back in the completion (FI_CONTEXT2 mode
// reserves it for the provider), and from it we find the whole Op again.
enum class OpKind { kRecv, kSend, kWrite };
struct Request;

struct Op {
  fi_context2 context{};
  OpKind kind = OpKind::kRecv;
  uint8_t* buffer = nullptr;
  size_t length = 0;
  void* desc = nullptr;             // local descriptor of the registered buffer (FI_MR_LOCAL)
  fi_addr_t peer = FI_ADDR_UNSPEC;  // where a SEND or WRITE goes: whom its failure concerns
  Request* request = nullptr;       // the request a WRITE in flight belongs to
  bool retired = false;             // replaced in the window while the provider held it
  uint64_t remote_offset = 0;       // where in the peer's region a WRITE goes
  size_t lane = 0;                  // the NIC a WRITE goes out on
};

Op* OpOf(void* context) {
  return reinterpret_cast<Op*>(context);
}

class Network {
 public:
  // `memory_path` says, once the domain is open, how GPU memory travels on this lane.
  static Network Open(FiInfoPtr nic, WaitMode wait,
                      const std::function<MemoryPath(const Network&)>& memory_path);
  std::vector<uint8_t> Address() const;
  fi_addr_t AddPeerAddress(std::span<const uint8_t> address);
  MrPtr Register(const PageBuffer& pages, uint64_t access) const;
  wire::RemoteRegion Advertise(fid_mr* mr, const void* data, size_t size) const;
  void PostRecv(Op& op);
  bool PostSend(Op& op, fi_addr_t dest);
  bool PostWrite(Op& op, fi_addr_t dest, const wire::RemoteRegion& region, uint64_t offset,
                 uint32_t immediate);
  // on_done(op, entry, source) for each completion, with op == nullptr for a remote write into
  // our memory (no operation of ours was posted for it); on_error(op, error) for a failure.
  template <typename OnDone, typename OnError>
  size_t PollCompletion(OnDone&& on_done, OnError&& on_error) {
    return ReadCompletions(
        cq.get(), true,
        [&](const fi_cq_data_entry& e, fi_addr_t source) {
          on_done(IsRemoteWrite(e) ? nullptr : OpOf(e.op_context), e, source);
        },
        [&](const CompletionError& e) { on_error(OpOf(e.op_context), e); });
  }

  // Declared in creation order, so they are closed in reverse.
  FiInfoPtr info;
  FabricPtr fabric;
  DomainPtr domain;
  CqPtr cq;
  AvPtr av;
  EpPtr ep;
  MemoryPath memory;  // where our pages live and how they reach the NIC (common/registration)
  int wait_fd = -1;   // the CQ's file descriptor with --wait block
};

// The NICs to use, one fi_info each: the NICs of the first group of the topology (GPU 0's,
// or the host's), --nics of them, dealt in turn over the group's NICs when more lanes than
// NICs are asked for (several endpoints on one domain, as shm and loopback tcp need).
// `no_hmem` says why FI_HMEM was left out of the hints, if it was (the pages are then staged).
std::vector<FiInfoPtr> FindNics(const Options& options, std::span<const uint8_t> peer,
                                MemoryKind memory, std::string* no_hmem) {
  FiInfoPtr hints(fi_allocinfo());
  hints->ep_attr->type = FI_EP_RDM;           // reliable, unconnected: one endpoint talks to many
  hints->caps = FI_MSG | FI_SOURCE | FI_RMA;  // FI_SOURCE: completions name the sender
  // GPU memory: ask for providers that can take it (FI_HMEM), unless told to stage it.
  if (IsGpu(memory) && options.gpu_path != GpuPathMode::kStaged) hints->caps |= FI_HMEM;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  // The memory-registration modes this program honours (efa-direct asks for all of them).
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_HMEM;
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
  std::vector<PciAddress> gpus;
  for (int g = 0; IsGpu(memory) && g < CudaDeviceCount(); ++g)
    if (auto pci = PciAddress::Parse(CudaPciBusId(g))) gpus.push_back(*pci);
  const auto groups = GroupDevices(Topology::Load(), gpus, nics);
  std::printf("%s\n", FormatTotals(groups, nics).c_str());
  for (const auto& group : groups) std::printf("  %s\n", FormatGroup(group, nics).c_str());

  const DeviceGroup& group = groups.front();
  if (group.nics.empty()) throw Error("the first group has no NIC");
  const size_t lanes = options.nics > 0 ? options.nics : group.nics.size();
  if (lanes > wire::kMaxLanes)
    throw UsageError("invalid --nics " + std::to_string(lanes) + " (at most " +
                     std::to_string(wire::kMaxLanes) + ")");
  std::vector<FiInfoPtr> chosen;
  for (size_t i = 0; i < lanes; ++i)
    chosen.emplace_back(fi_dupinfo(domains[group.nics[i % group.nics.size()]].get()));
  return chosen;
}

// Measured on the mini-cluster (README.md): over tcp, sleeping in the CQ's wait fd leaves
// the CPUs to the kernel's TCP stack, which carries the data, and wins; shm has no wait fd,
// and RDMA NICs are polled.
WaitMode ChooseWaitMode(WaitMode requested, const fi_info& nic) {
  if (requested != WaitMode::kAuto) return requested;
  const std::string provider = nic.fabric_attr->prov_name;
  return provider.rfind("tcp", 0) == 0 ? WaitMode::kBlock : WaitMode::kSpin;
}

Network Network::Open(FiInfoPtr nic, WaitMode wait,
                      const std::function<MemoryPath(const Network&)>& memory_path) {
  Network net;
  net.info = std::move(nic);
  fid_fabric* fabric = nullptr;
  FI_CHECK(fi_fabric(net.info->fabric_attr, &fabric, nullptr));
  net.fabric.reset(fabric);
  fid_domain* domain = nullptr;
  FI_CHECK(fi_domain(net.fabric.get(), net.info.get(), &domain, nullptr));
  net.domain.reset(domain);
  net.memory = memory_path(net);

  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;  // with the immediate data of remote writes
  // Spin: we poll. Block: a file descriptor we can sleep on, for all lanes at once.
  cq_attr.wait_obj = wait == WaitMode::kBlock ? FI_WAIT_FD : FI_WAIT_NONE;
  fid_cq* cq = nullptr;
  int rc = fi_cq_open(net.domain.get(), &cq_attr, &cq, nullptr);
  if (rc != 0 && wait == WaitMode::kBlock)
    throw UsageError(std::string("--wait block: provider ") + net.info->fabric_attr->prov_name +
                     " has no file-descriptor wait object (" + fi_strerror(-rc) +
                     "); use --wait spin");
  FI_CHECK(rc);
  net.cq.reset(cq);
  if (wait == WaitMode::kBlock) FI_CHECK(fi_control(&net.cq->fid, FI_GETWAIT, &net.wait_fd));

  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  fid_av* av = nullptr;
  FI_CHECK(fi_av_open(net.domain.get(), &av_attr, &av, nullptr));
  net.av.reset(av);

  fid_ep* ep = nullptr;
  FI_CHECK(fi_endpoint(net.domain.get(), net.info.get(), &ep, nullptr));
  net.ep.reset(ep);
  FI_CHECK(fi_ep_bind(net.ep.get(), &net.cq->fid, FI_TRANSMIT | FI_RECV));
  FI_CHECK(fi_ep_bind(net.ep.get(), &net.av->fid, 0));
  // GPUDirect RDMA: this endpoint may not fall back to copying GPU pages with the CUDA API.
  RefuseCudaApi(net.ep.get(), net.memory);
  FI_CHECK(fi_enable(net.ep.get()));
  return net;
}

// Opens a lane per NIC; lane 0's domain is asked how GPU memory travels, for all of them,
// before any endpoint is enabled (a lane that moves it by GPUDirect RDMA refuses the CUDA API).
std::vector<Network> OpenLanes(const Options& options, std::span<const uint8_t> peer) {
  const MemoryKind memory = ResolveMemory(options.memory);
  std::string no_hmem;
  std::vector<Network> lanes;
  std::optional<MemoryPath> path;
  for (auto& nic : FindNics(options, peer, memory, &no_hmem)) {
    const WaitMode wait = ChooseWaitMode(options.wait, *nic);
    lanes.push_back(Network::Open(std::move(nic), wait, [&](const Network& lane) {
      if (!path)
        path = ChooseMemoryPath(lane.domain.get(), *lane.info, memory, options.gpu_path, no_hmem);
      return *path;
    }));
  }
  return lanes;
}

std::vector<uint8_t> Network::Address() const {
  size_t length = 0;
  fi_getname(&ep->fid, nullptr, &length);  // -FI_ETOOSMALL, and the length we need
  std::vector<uint8_t> address(length);
  FI_CHECK(fi_getname(&ep->fid, address.data(), &length));
  address.resize(length);
  return address;
}

fi_addr_t Network::AddPeerAddress(std::span<const uint8_t> address) {
  CheckAddress(address, *info);  // a peer's address has this provider's shape, or is refused
  fi_addr_t addr = FI_ADDR_UNSPEC;
  int inserted = fi_av_insert(av.get(), address.data(), 1, &addr, 0, nullptr);
  if (inserted != 1) throw Error("fi_av_insert: the peer address was not accepted");
  return addr;
}

// Registers the memory the NIC reads or writes (`pages.nic_data()`: GPU memory on the direct
// path, host or pinned host memory otherwise) for `access`: FI_REMOTE_WRITE for a region
// peers write into, FI_WRITE for pages we write from. (07 calls the same code in
// common/registration.cpp, RegisterPages.)
MrPtr Network::Register(const PageBuffer& pages, uint64_t access) const {
  iovec iov{pages.nic_data(), pages.size()};
  fi_mr_attr attr{};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = access;
  // The key a peer names to reach this memory. Where the provider picks keys (FI_MR_PROV_KEY:
  // efa) this is ignored; where we pick them (tcp, shm), keys 1, 2, 3... would let anyone who
  // knows our address guess them, so the key is random (fi_mr_key() tells it either way).
  attr.requested_key = RandomKey(info->domain_attr->mr_key_size);
  uint64_t flags = 0;
#ifdef FI_MR_DMABUF
  fi_mr_dmabuf dmabuf{};  // must outlive fi_mr_regattr: attr.dmabuf shares storage with mr_iov
#endif
  UniqueFd dmabuf_fd;
  if (pages.path() == PageBuffer::Path::kGpuDirect) {
    // GPU memory handed to the provider as it is: the kind of memory (FI_HMEM_CUDA) and the
    // GPU it lives on, so the provider (or the NIC's driver) can reach it there.
    const CudaBuffer& gpu = pages.gpu();
    gpu.MakeCurrent();  // a data thread may register before any CUDA call of its own
    attr.iface = FI_HMEM_CUDA;
    attr.device.cuda = gpu.device();
    // Device memory, never managed memory: shm then moves pages by CUDA IPC. CUDA IPC opens
    // cudaMalloc's allocations only, so VMM memory (--memory cuda-vmm) goes without the flag
    // and shm copies it through host memory.
    if (gpu.allocation() == GpuAllocation::kMalloc) flags |= FI_HMEM_DEVICE_ONLY;
#ifdef FI_MR_DMABUF
    // As a dmabuf where the driver exports one (libfabric >= 1.20): the NIC's kernel driver
    // then maps the GPU's pages itself, without the nvidia-peermem module.
    dmabuf_fd = gpu.ExportDmabuf(pages.nic_data(), pages.size());
    if (dmabuf_fd.get() >= 0) {
      dmabuf.fd = dmabuf_fd.get();
      dmabuf.len = pages.size();
      dmabuf.base_addr = pages.nic_data();
      attr.dmabuf = &dmabuf;
      flags |= FI_MR_DMABUF;
    }
#endif
  }
  fid_mr* mr = nullptr;
  FI_CHECK(fi_mr_regattr(domain.get(), &attr, flags, &mr));
  return MrPtr(mr);
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
bool Network::PostWrite(Op& op, fi_addr_t dest, const wire::RemoteRegion& region, uint64_t offset,
                        uint32_t immediate) {
  op.kind = OpKind::kWrite;
  op.peer = dest;
  const InProvider inside("fi_writedata");  // spins for good on a dead shm peer's lock
  ssize_t rc = fi_writedata(ep.get(), op.buffer, op.length, op.desc, immediate, dest,
                            region.address + offset, region.key, &op.context);
  if (rc == -FI_EAGAIN) return false;
  FI_CHECK(rc);
  return true;
}

// --wait block: sleep until any lane's CQ has something, or `timeout_ms` passes.
// fi_trywait says whether sleeping is safe (nothing is already waiting to be read).
void WaitForCompletions(std::vector<Network>& lanes, int timeout_ms) {
  std::vector<pollfd> fds;
  for (auto& lane : lanes) {
    if (lane.wait_fd < 0) return;
    fid* cq = &lane.cq->fid;
    if (fi_trywait(lane.fabric.get(), &cq, 1) != FI_SUCCESS) return;
    fds.push_back({lane.wait_fd, POLLIN, 0});
  }
  poll(fds.data(), fds.size(), timeout_ms);
}

// The control messages: receives kept posted, and a queue of messages to send that never
// makes us wait (common/mailbox.hpp).
using Mail = Mailbox<Network, Op>;
// The server's front desk: admission, tokens, departures and limits (common/reception.hpp).
using Desk = Reception<Network, Op>;

void PrintHeader(const char* role, const std::vector<Network>& lanes) {
  std::string domains;
  for (const auto& lane : lanes)
    domains += std::string(domains.empty() ? "" : ",") + lane.info->domain_attr->name;
  std::printf("%s %s: provider %s, %zu lane%s (%s), %s, pages in %s\n", kProgram, role,
              lanes[0].info->fabric_attr->prov_name, lanes.size(), lanes.size() == 1 ? "" : "s",
              domains.c_str(), lanes[0].wait_fd >= 0 ? "blocking waits" : "spinning",
              DescribeMemoryPath(lanes[0].memory).c_str());
  std::fflush(stdout);
}

// One TRANSFER being served: its source pages, registered, and how far its WRITEs got.
struct Request {
  fi_addr_t client = FI_ADDR_UNSPEC;  // the client's lane-0 address: its name
  uint64_t number = 0;                // the desk's name for the client, in the log
  Desk::Client dest;
  wire::Transfer transfer;
  PageBuffer source;
  std::vector<MrPtr> mrs;  // the source registered on every lane's domain
  uint64_t total = 0;      // pages x repeat
  uint64_t posted = 0, completed = 0, failed = 0;
  bool abandoned = false;  // its client left or failed: post no more, free once nothing is out
  Clock::time_point first_post{}, last_completion = Clock::now(), abandoned_at{};
  uint64_t in_flight() const { return posted - completed - failed; }
};

// Fills the request's source pages from its seed and registers them.
std::unique_ptr<Request> PrepareRequest(std::vector<Network>& lanes, const Desk::Client& client,
                                        fi_addr_t name, wire::Transfer transfer) {
  const size_t count = transfer.pages.size(), page_size = transfer.page_size;
  const uint64_t total = count * transfer.repeat;
  auto r = std::make_unique<Request>();
  r->client = name;
  r->number = client.number;
  r->dest = client;
  r->transfer = std::move(transfer);
  r->source = PageBuffer(count * page_size, lanes[0].memory, 0, Pages::kSmall);  // for one request
  r->total = total;
  HostBuffer staging;  // GPU memory is filled here first
  FillPages(r->source, 0, r->transfer.seed, r->transfer.pages, page_size, staging);
  for (size_t l = 0; l < r->dest.addresses.size(); ++l)
    r->mrs.push_back(lanes[l].Register(r->source, FI_WRITE));
  return r;
}

// Posts one prepared WRITE. If the provider's queue is full, or older WRITEs are already
// waiting, it joins the pending queue: order is kept and nothing spins.
void PostOrQueue(Network& net, Op* op, std::deque<Op*>& pending) {
  const Request& r = *op->request;
  if (!pending.empty() || !net.PostWrite(*op, r.dest.addresses[op->lane], r.dest.regions[op->lane],
                                         op->remote_offset, r.transfer.request_id))
    pending.push_back(op);
}

// Called after each poll: completions have freed room, so the oldest waiting WRITEs go first.
void DrainPending(Network& net, std::deque<Op*>& pending) {
  while (!pending.empty()) {
    Op* op = pending.front();
    const Request& r = *op->request;
    if (!net.PostWrite(*op, r.dest.addresses[op->lane], r.dest.regions[op->lane], op->remote_offset,
                       r.transfer.request_id))
      return;
    pending.pop_front();
  }
}

// Prepares WRITEs while the window has free Ops, one request after another in turn so that
// each makes progress, striping each request's pages over its lanes, and stops feeding a
// lane as soon as its provider pushes back.
void PostWrites(std::vector<Network>& lanes, std::list<std::unique_ptr<Request>>& active,
                std::vector<Op*>& free_writes, std::vector<std::deque<Op*>>& pending) {
  bool posted_any = true;
  while (!free_writes.empty() && posted_any) {
    posted_any = false;
    for (auto& r : active) {
      if (free_writes.empty()) return;
      if (r->posted == r->total || r->abandoned) continue;
      const size_t lane = r->posted % r->dest.addresses.size();
      if (!pending[lane].empty()) continue;
      const wire::Transfer& t = r->transfer;
      const size_t i = r->posted % t.pages.size();
      Op* op = free_writes.back();
      free_writes.pop_back();
      op->kind = OpKind::kWrite;
      op->buffer = static_cast<uint8_t*>(r->source.nic_data()) + i * t.page_size;
      op->length = t.page_size;
      op->desc = fi_mr_desc(r->mrs[lane].get());
      op->request = r.get();
      op->remote_offset = t.pages[i] * t.page_size;
      op->lane = lane;
      PostOrQueue(lanes[lane], op, pending[lane]);
      if (r->posted++ == 0) r->first_post = Clock::now();
      posted_any = true;
    }
  }
}

// Ends what is over: a request done (DONE to its client), one abandoned whose WRITEs have
// all come back, or one stuck (no WRITE completed for --timeout: its client is lost).
void FinishRequests(std::list<std::unique_ptr<Request>>& active, Desk& desk, Mail& mail,
                    const Options& options) {
  const auto limit =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.timeout_s));
  for (auto it = active.begin(); it != active.end();) {
    Request& r = **it;
    if (!r.abandoned && r.in_flight() > 0 && Clock::now() - r.last_completion > limit)
      desk.Lost(r.client, "no WRITE completed for " + FormatSeconds(options.timeout_s) + "");
    if (r.abandoned && r.in_flight() > 0 && r.source.size() > 0 &&
        Clock::now() - r.abandoned_at > limit) {
      // The provider will never complete these WRITEs (their peer is gone): the memory they
      // read goes back; the request stays, small, for completions that may still come.
      std::printf("client %llu: request %u: %llu WRITEs never completed; their pages freed\n",
                  static_cast<unsigned long long>(r.number), r.transfer.request_id,
                  static_cast<unsigned long long>(r.in_flight()));
      r.mrs.clear();
      r.source = PageBuffer();
    }
    if (r.abandoned ? r.in_flight() > 0 : r.completed < r.total) {
      ++it;
      continue;
    }
    const wire::Transfer& t = r.transfer;
    if (!r.abandoned) {
      std::printf("client %llu: request %u: wrote %zu pages of %llu bytes, %llu times\n",
                  static_cast<unsigned long long>(r.number), t.request_id, t.pages.size(),
                  static_cast<unsigned long long>(t.page_size),
                  static_cast<unsigned long long>(t.repeat));
      const wire::Done done{t.request_id, r.total,
                            static_cast<uint64_t>(r.first_post.time_since_epoch().count()),
                            static_cast<uint64_t>(r.last_completion.time_since_epoch().count())};
      mail.Send(r.client, done);
      desk.Seen(r.client);
    }
    it = active.erase(it);
  }
}

int ServerMain(const Options& options) {
  InstallStopHandlers(kProgram);
  std::vector<Network> lanes = OpenLanes(options, {});
  Network& net = lanes[0];  // control messages travel on lane 0
  const WaitMode wait = lanes[0].wait_fd >= 0 ? WaitMode::kBlock : WaitMode::kSpin;
  PrintHeader("server", lanes);
  const auto limit =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.timeout_s));

  Mail mail(net, kRecvDepth, kRecvDepth);
  std::list<std::unique_ptr<Request>> active;
  std::deque<Op> write_ops(options.window);  // a deque: it grows without moving its Ops
  std::vector<Op*> free_writes;
  for (auto& op : write_ops) free_writes.push_back(&op);
  std::vector<std::deque<Op*>> pending(lanes.size());  // per lane: WRITEs waiting for room
  // Who is a client and who stops being one (common/reception.hpp, README "The front desk").
  // A client that leaves, or is dropped, stops being written to at once, on every lane. Its
  // requests are abandoned: WRITEs of theirs the provider still holds are replaced in the window at
  // once, so other clients never wait for them (shm never completes a WRITE to a process that
  // died).
  Desk::Hooks hooks;
  hooks.leaving = [&](fi_addr_t client) {
    for (auto& r : active) {
      if (r->client != client || r->abandoned) continue;
      r->abandoned = true;
      r->abandoned_at = Clock::now();
      for (auto& queue : pending)
        std::erase_if(queue, [&](Op* op) {  // never posted: simply free again
          if (op->request != r.get()) return false;
          --r->posted;
          op->request = nullptr;
          free_writes.push_back(op);
          return true;
        });
      for (Op& op : write_ops) {
        if (op.request != r.get() || op.retired) continue;
        op.retired = true;
        free_writes.push_back(&write_ops.emplace_back());
      }
    }
  };
  hooks.busy = [&](fi_addr_t client) {  // a request of its is served, or WRITEs are out
    for (const auto& r : active)
      if (r->client == client && (!r->abandoned || (r->in_flight() > 0 && r->source.size() > 0)))
        return true;
    return false;
  };
  // Lane i of a client pairs with lane i of the server. shm (libfabric 1.17) crashes the next
  // client if we remove the entry of a lane that only ever received our WRITEs: there, keep
  // those (one AV slot per client and lane).
  const bool shm = std::string(net.info->fabric_attr->prov_name) == "shm";
  hooks.lanes = lanes.size();
  for (auto& lane : lanes) hooks.writers.push_back(lane.Address());  // ACCEPT names them
  hooks.open_lane = [&](size_t l, std::span<const uint8_t> a) {
    return lanes[l].AddPeerAddress(a);
  };
  hooks.close_lane = [&](size_t l, fi_addr_t a) {
    if (!shm) fi_av_remove(lanes[l].av.get(), &a, 1, 0);
  };
  Desk desk(net, mail, options, hooks);
  PublishAddress(desk.own_address(), options);
  auto on_done = [&](Op* op, const fi_cq_data_entry& done, fi_addr_t source) {
    if (op == nullptr) return;  // the server receives no remote writes
    if (op->kind == OpKind::kSend) mail.Sent(op);
    if (op->kind == OpKind::kWrite) {
      ++op->request->completed;
      op->request->last_completion = Clock::now();
      if (!op->retired) free_writes.push_back(op);
      op->request = nullptr;
    }
    if (op->kind != OpKind::kRecv) return;
    desk.Received({op->buffer, done.len}, source);
    net.PostRecv(*op);  // hand the buffer back before the next message needs it
  };
  // A failed operation concerns one peer: the desk drops that peer and we carry on.
  auto on_error = [&](Op* op, const CompletionError& error) {
    if (op == nullptr) {
      Diagnostic("a peer's operation on our memory failed: %s\n", error.text.c_str());
    } else if (op->kind == OpKind::kRecv) {  // too long for our buffer, or cut off
      Diagnostic("dropped a message: %s\n", error.text.c_str());
      net.PostRecv(*op);
    } else {
      desk.Lost(op->kind == OpKind::kWrite ? op->request->client : op->peer, error.text);
      if (op->kind == OpKind::kSend) mail.Sent(op);
      if (op->kind == OpKind::kWrite) {
        ++op->request->failed;
        if (!op->retired) free_writes.push_back(op);
        op->request = nullptr;
      }
    }
    std::fflush(stdout);
  };
  // Completions of every lane, then the messages waiting to go out; a peer that takes none
  // is lost.
  auto progress = [&] {
    size_t done = 0;
    for (auto& lane : lanes) done += lane.PollCompletion(on_done, on_error);
    for (fi_addr_t peer : mail.Flush(limit)) desk.Lost(peer, "does not take our messages");
    return done;
  };
  IdleBackoff backoff;  // --wait spin: an idle loop naps, so that it never takes a core
  // What a client holds already, checked before anything is allocated (OverLimits).
  auto over_limits = [&](fi_addr_t client, const wire::Transfer& t) {
    uint64_t requests = 0, bytes = 0, all = 0;
    for (const auto& r : active) {
      all += r->source.size();
      if (r->client != client || r->abandoned) continue;
      ++requests;
      bytes += r->source.size();
    }
    return OverLimits(options, t, requests, bytes, all);
  };

  while (desk.Open()) {
    const size_t completions = progress();
    desk.Tend();
    FinishRequests(active, desk, mail, options);
    for (size_t l = 0; l < lanes.size(); ++l) DrainPending(lanes[l], pending[l]);
    const size_t free_before = free_writes.size();
    PostWrites(lanes, active, free_writes, pending);
    if (completions > 0 || desk.Waiting() || free_writes.size() != free_before)
      backoff.Busy();
    else if (wait == WaitMode::kBlock)
      WaitForCompletions(lanes, 100);  // nothing to do until the network answers
    else
      backoff.Idle();  // --wait spin: 05's naps, so that an idle server holds no core
    // One request filled per round: its WRITEs start before the next one's.
    if (auto request = desk.Next()) {
      std::string why = over_limits(request->client, request->transfer);
      try {
        if (why.empty())
          active.push_back(PrepareRequest(lanes, *desk.Find(request->client), request->client,
                                          std::move(request->transfer)));
      } catch (const std::exception& e) {  // no memory for it
        why = e.what();
      }
      if (!why.empty()) desk.Refuse(request->client, request->transfer.request_id, why);
    }
    std::fflush(stdout);
  }
  std::printf("served %s\n", Plural(desk.served(), "client").c_str());
  std::fflush(stdout);
  for (auto& lane : lanes) lane.ep.reset();  // WRITEs still in the provider end with the
  return kExitOk;                            // endpoints, before their pages go
}

// --requests and --window, besides what the wire allows of a request (CheckRequestSize).
void CheckClientOptions(const Options& options) {
  CheckRequestSize(options);
  if (options.requests == 0 || options.requests > kMaxRequestsInFlight)
    throw UsageError("invalid --requests " + std::to_string(options.requests) + " (1 to " +
                     std::to_string(kMaxRequestsInFlight) + ")");
  if (options.window == 0) throw UsageError("invalid --window 0");
}

// The client's requests: `options.requests` of `options.pages` pages each, a share of one
// random sample of the region's pages (so each request's pages are its own).
std::vector<wire::Transfer> PlanRequests(const Options& options, uint64_t region_pages) {
  const uint64_t total_pages = options.pages * options.requests;
  const std::vector<uint32_t> all_pages = SamplePages(options.seed, total_pages, region_pages);
  std::vector<wire::Transfer> requests(options.requests);
  for (size_t r = 0; r < requests.size(); ++r) {
    requests[r].request_id = static_cast<uint32_t>(r + 1);
    requests[r].seed = options.seed;
    requests[r].page_size = options.page_size;
    requests[r].repeat = options.repeat;
    requests[r].pages.assign(all_pages.begin() + r * options.pages,
                             all_pages.begin() + (r + 1) * options.pages);
  }
  return requests;
}

// Every request got all its WRITEs (`arrived`, by request id), and every byte of its pages is
// what the seed says. Returns the bytes verified.
uint64_t VerifyRequests(const Options& options, PageBuffer& region,
                        const std::vector<wire::Transfer>& requests,
                        const std::vector<uint64_t>& arrived) {
  for (size_t r = 1; r < arrived.size(); ++r) {
    if (arrived[r] != requests[r - 1].pages.size() * options.repeat)
      throw Error("request " + std::to_string(r) + " received " + std::to_string(arrived[r]) +
                  " WRITEs");
  }
  region.SyncFromNic();
  std::span<uint8_t> view = region.HostView();
  uint64_t verified = 0;
  for (const auto& request : requests)
    verified += VerifyPages(view, request.pages, request.page_size, request.seed);
  return verified;
}

// Each lane's writer into that lane's AV before any WRITE is asked for (lane 0 has the
// server already), as efa-direct requires of a target; on every provider, so that the path a
// p5 on efa-direct takes is the one every test takes.
void AddWriters(std::vector<Network>& lanes, const std::vector<std::vector<uint8_t>>& writers) {
  if (writers.size() > lanes.size())
    throw Error("the server named " + std::to_string(writers.size()) + " writers for our " +
                std::to_string(lanes.size()) + " lanes");
  for (size_t l = 1; l < writers.size(); ++l) lanes[l].AddPeerAddress(writers[l]);
  std::printf("the server's writers are in our lanes' AVs: %zu of %zu lanes\n", writers.size(),
              lanes.size());
}

int ClientMain(const Options& options) {
  InstallStopHandlers(kProgram);  // Ctrl-C or SIGTERM: BYE, then exit (SayByeAndStop)
  const std::vector<uint8_t> peer = FromHex(options.peer);
  CheckClientOptions(options);
  const auto began = Clock::now();
  std::vector<Network> lanes = OpenLanes(options, peer);
  Network& net = lanes[0];  // control messages travel on lane 0
  const WaitMode wait = lanes[0].wait_fd >= 0 ? WaitMode::kBlock : WaitMode::kSpin;
  fi_addr_t server = net.AddPeerAddress(peer);
  PrintHeader("client", lanes);
  const auto limit =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.timeout_s));

  // The region has room for twice the pages asked for, so the chosen pages are scattered;
  // each request gets its own share of them.
  const uint64_t total_pages = options.pages * options.requests;
  const uint64_t region_pages = 2 * total_pages;
  PageBuffer region(region_pages * options.page_size, net.memory);
  // One region, registered on every lane's domain: each gives it its own key.
  std::vector<MrPtr> region_mrs;
  for (auto& lane : lanes) region_mrs.push_back(lane.Register(region, FI_REMOTE_WRITE));
  Mail mail(net, kRecvDepth, options.requests + 2);

  const std::vector<wire::Transfer> requests = PlanRequests(options, region_pages);

  uint64_t expected = total_pages * options.repeat;    // less what the server refuses
  std::vector<uint64_t> arrived(requests.size() + 1);  // per request id
  uint64_t arrived_total = 0;
  size_t done_count = 0, refused_count = 0;
  uint64_t server_first = UINT64_MAX, server_last = 0;  // the server's clock, from its DONEs
  Clock::time_point last_arrival;
  std::string refused;
  bool accepted = false;
  auto last_progress = Clock::now();
  // Only our server's messages count; anyone else's are dropped and counted. Each request is
  // answered once (DONE or ERROR): a second answer, or one for a request we never made, is no
  // answer of our server's.
  ServerFilter from_server(server, wire::NewToken());
  std::vector<bool> answered(requests.size() + 1, false);
  auto answers = [&](uint32_t id) {
    if (id == 0 || id > requests.size() || answered[id]) return false;
    answered[id] = true;
    return true;
  };
  auto on_done = [&](Op* op, const fi_cq_data_entry& entry, fi_addr_t source) {
    if (op == nullptr) {  // a remote WRITE landed in our region
      if (entry.data == 0 || entry.data > requests.size())
        throw Error("a WRITE arrived for unknown request " + std::to_string(entry.data));
      ++arrived[entry.data];  // never assume the last WRITE lands last: count them
      ++arrived_total;
      last_arrival = Clock::now();
    } else if (op->kind == OpKind::kSend) {
      mail.Sent(op);
    } else if (op->kind == OpKind::kRecv) {
      std::optional<wire::Message> message = from_server.Take({op->buffer, entry.len}, source);
      net.PostRecv(*op);
      if (!message) return;
      if (auto* accept = std::get_if<wire::Accept>(&*message); accept != nullptr && !accepted) {
        AddWriters(lanes, accept->writers);
        accepted = true;
        mail.Seal(server, accept->session);  // our TRANSFERs and BYE carry it
      } else if (auto* d = std::get_if<wire::Done>(&*message); d && answers(d->request_id)) {
        ++done_count;
        server_first = std::min(server_first, d->first_post_ns);
        server_last = std::max(server_last, d->last_completion_ns);
      } else if (auto* error = std::get_if<wire::ErrorReply>(&*message);
                 error && (error->request_id == 0 || answers(error->request_id))) {
        if (refused.empty())
          refused = "request " + std::to_string(error->request_id) + ": " + error->text;
        // The other requests are still being written: wait for them before saying BYE.
        if (error->request_id >= 1 && error->request_id <= requests.size()) {
          expected -= requests[error->request_id - 1].pages.size() * options.repeat;
          ++refused_count;
        }
      } else {
        from_server.Ignore("a message that answers nothing we asked");
      }
    }
  };
  auto on_error = [&](Op*, const CompletionError& error) {
    Abandon(kProgram, "an operation failed: " + error.text);
  };
  IdleBackoff backoff;
  auto progress = [&] {
    if (StopRequested())
      SayByeAndStop(
          mail, server, [&] { net.PollCompletion(on_done, on_error); }, kProgram);
    size_t done = 0;
    for (auto& lane : lanes) done += lane.PollCompletion(on_done, on_error);  // on every lane
    if (!mail.Flush(limit).empty())
      Abandon(kProgram, "no answer from the server within " + FormatSeconds(options.timeout_s) +
                            ": it takes none of our messages (is it running at that address?)");
    if (done > 0) {
      last_progress = Clock::now();
      backoff.Busy();
    } else if (wait == WaitMode::kBlock) {
      WaitForCompletions(lanes, 100);
    } else {
      backoff.Idle();
    }
    if (Clock::now() - last_progress > limit)
      Abandon(kProgram, "no answer from the server within " + FormatSeconds(options.timeout_s) +
                            " (is it running at that address?)");
  };
  auto send = [&](const wire::Message& message) { mail.Send(server, message); };

  wire::Connect connect;
  for (size_t l = 0; l < lanes.size(); ++l)
    connect.lanes.push_back(
        {lanes[l].Address(),
         lanes[l].Advertise(region_mrs[l].get(), region.nic_data(), region.size())});
  // Again until answered: the server answers a CONNECT once one came from the address it names.
  ConnectUntilAnswered(
      mail, server, from_server.token(), connect, [&] { return accepted || !refused.empty(); },
      progress, kProgram, options.timeout_s);
  if (!accepted) throw Error("the server refused the connection: " + refused);
  // The clock runs from the first request sent to the last WRITE landed: the server's work
  // (filling its pages) counts, and nothing a provider does with completions can shrink it.
  const auto start = Clock::now();
  for (const auto& request : requests) send(request);
  while (arrived_total < expected) progress();
  const double seconds = std::chrono::duration<double>(last_arrival - start).count();
  while (done_count + refused_count < requests.size()) progress();  // the server's own clock
  // Every DONE comes after the server's last completion: its span fits inside this one.
  const double until_done = std::chrono::duration<double>(Clock::now() - start).count();
  send(wire::Bye{});
  while (!mail.Idle()) progress();  // every message of ours has left
  if (!refused.empty()) throw Error("the server refused " + refused);
  const uint64_t verified = VerifyRequests(options, region, requests, arrived);

  Summary summary;
  summary.bytes = arrived_total * options.page_size;
  summary.writes = arrived_total;
  summary.seconds = seconds;
  summary.answered_seconds = until_done;
  summary.server_seconds = static_cast<double>(server_last - server_first) / 1e9;
  for (const auto& lane : lanes)  // --link-gbps is the rate of one NIC
    summary.link_gbps += options.link_gbps > 0 ? options.link_gbps : LinkGbps(*lane.info);
  summary.verified_bytes = verified;
  summary.lanes = static_cast<int>(lanes.size());
  summary.memory = MemoryWord(net.memory);
  summary.memory_why = net.memory.why;
  const std::string problem =
      ClockProblem(summary, std::chrono::duration<double>(Clock::now() - began).count());
  if (!problem.empty()) throw Error("figures that cannot be true: " + problem);
  summary.ignored_messages = from_server.ignored();
  PrintSummary(summary, options.json);
  if (from_server.ignored() > 0) std::printf("%s\n", from_server.Describe().c_str());
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  const char* about =
      "Lesson 06: several NICs from the topology, pages striped over them. Without an "
      "address: serve on --nics lanes. With the server's address: send --requests "
      "requests of --pages random pages each over every lane, verify.";
  if (int rc = ParseCommandLine(argc, argv, about, kProgram,
                                kServeOptions | kTransferOptions | kWindowOptions | kLaneOptions,
                                options);
      rc >= 0)
    return rc;
  return RunProgram(
      kProgram, [&] { return options.peer.empty() ? ServerMain(options) : ClientMain(options); });
}
