// 07_full_p5: the whole engine. Every NIC of every GPU group, a data thread per group, and
// each optimization of the published ladder behind its own switch, so one binary measures
// what each one buys (--ladder runs them all, one table row each).
//
// The server is now a service: clients come and go, several at once. Each CONNECT opens a
// session of its own - fresh endpoints on every lane, the client's engine settings, its own
// threads - and everything of it is freed when the client says BYE, dies (an error
// completion), or falls silent for --peer-timeout. A request only ever names pages of its
// sender's own region, so no client can reach another's memory. The walkthrough is in
// README.md.

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "address.hpp"
#include "error.hpp"
#include "fabric_handles.hpp"
#include "host_buffer.hpp"
#include "options.hpp"
#include "page_buffer.hpp"
#include "page_data.hpp"
#include "program.hpp"
#include "protocol.hpp"
#include "provider.hpp"
#include "report.hpp"
#include "topology.hpp"

using namespace common;

namespace {

constexpr const char* kProgram = "07_full_p5";
constexpr size_t kMessageBytes = wire::kMaxMessageBytes;  // every message buffer has this size
constexpr size_t kRecvDepth = 8;                          // receives each side keeps posted
constexpr size_t kCqBatch = 16;                           // completions read per fi_cq_read
constexpr uint64_t kMaxRequestsInFlight = 64;
constexpr uint32_t kWarmupRequest = 0xffffffff;  // the id of the untimed warmup request

using Clock = std::chrono::steady_clock;

// One posted operation. libfabric hands `context` back in the completion (FI_CONTEXT2 mode
// reserves it for the provider), and from it we find the whole Op again.
enum class OpKind { kRecv, kSend, kWrite };
struct Share;

struct Op {
  fi_context2 context{};
  OpKind kind = OpKind::kRecv;
  uint8_t* buffer = nullptr;
  size_t length = 0;
  void* desc = nullptr;        // local descriptor of the registered buffer (FI_MR_LOCAL)
  Share* share = nullptr;      // the part of a request a WRITE belongs to
  uint64_t remote_offset = 0;  // where in the peer's region a WRITE goes
  size_t lane = 0;             // the NIC a WRITE goes out on
};

Op* OpOf(void* context) {
  return reinterpret_cast<Op*>(context);
}

class Network {
 public:
  static Network Open(FiInfoPtr nic, WaitMode wait);
  std::vector<uint8_t> Address() const;
  fi_addr_t AddPeerAddress(std::span<const uint8_t> address);
  MrPtr RegisterMemory(void* data, size_t size, uint64_t access, const CudaBuffer* gpu = nullptr);
  bool TakesCudaMemory();
  wire::RemoteRegion Advertise(fid_mr* mr, const void* data, size_t size) const;
  void PostRecv(Op& op);
  bool PostSend(Op& op, fi_addr_t dest);
  bool PostWrite(Op& op, fi_addr_t dest, const wire::RemoteRegion& region, uint64_t offset,
                 uint32_t immediate, uint64_t flags);
  // Remote writes complete with op == nullptr: no operation of ours was posted for them.
  size_t PollCompletion(
      const std::function<void(Op*, const fi_cq_data_entry&, fi_addr_t)>& on_done);

  // Declared in creation order, so they are closed in reverse.
  FiInfoPtr info;
  FabricPtr fabric;
  DomainPtr domain;
  CqPtr cq;
  AvPtr av;
  EpPtr ep;
  uint64_t next_key = 1;  // keys we choose when the provider does not (no FI_MR_PROV_KEY)
  int wait_fd = -1;       // the CQ's file descriptor with --wait block
};

// The lanes: every group's NICs, group after group, and which group each lane belongs to.
struct Plan {
  std::vector<FiInfoPtr> lanes;
  std::vector<size_t> group_of;  // per lane
  std::vector<DeviceGroup> groups;
};

// The NICs to use, one fi_info each: the NICs of every group of the topology in group order
// (GPU 0's first), --nics of them, dealt in turn over all NICs when more lanes than NICs are
// asked for (several endpoints on one domain, as shm and loopback tcp need).
Plan FindNics(const Options& options, std::span<const uint8_t> peer, bool gpu_memory, bool print) {
  FiInfoPtr hints(fi_allocinfo());
  hints->ep_attr->type = FI_EP_RDM;           // reliable, unconnected: one endpoint talks to many
  hints->caps = FI_MSG | FI_SOURCE | FI_RMA;  // FI_SOURCE: completions name the sender
  if (gpu_memory) hints->caps |= FI_HMEM;     // ask for providers that can take GPU memory
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  // The memory-registration modes this program honours; efa asks for all of them.
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_HMEM;
  std::vector<FiInfoPtr> domains;
  try {
    domains = SelectDomains(*hints, options.provider, options.domain, peer);
  } catch (const UsageError&) {
    if (!gpu_memory) throw;
    hints->caps &= ~FI_HMEM;  // no HMEM provider: we will stage through host memory
    domains = SelectDomains(*hints, options.provider, options.domain, peer);
  }
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
  for (int g = 0; gpu_memory && g < CudaDeviceCount(); ++g)
    if (auto pci = PciAddress::Parse(CudaPciBusId(g))) gpus.push_back(*pci);
  Plan plan;
  plan.groups = GroupDevices(Topology::Load(), gpus, nics);
  if (print) {
    std::printf("%s\n", FormatTotals(plan.groups, nics).c_str());
    for (const auto& group : plan.groups) std::printf("  %s\n", FormatGroup(group, nics).c_str());
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

// Measured on the mini-cluster (README.md): over tcp, sleeping in the CQ's wait fd leaves
// the CPUs to the kernel's TCP stack, which carries the data, and wins; shm has no wait fd,
// and RDMA NICs are polled.
WaitMode ChooseWaitMode(WaitMode requested, const fi_info& nic) {
  if (requested != WaitMode::kAuto) return requested;
  const std::string provider = nic.fabric_attr->prov_name;
  return provider.rfind("tcp", 0) == 0 ? WaitMode::kBlock : WaitMode::kSpin;
}

Network Network::Open(FiInfoPtr nic, WaitMode wait) {
  Network net;
  net.info = std::move(nic);
  fid_fabric* fabric = nullptr;
  FI_CHECK(fi_fabric(net.info->fabric_attr, &fabric, nullptr));
  net.fabric.reset(fabric);
  fid_domain* domain = nullptr;
  FI_CHECK(fi_domain(net.fabric.get(), net.info.get(), &domain, nullptr));
  net.domain.reset(domain);

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
  FI_CHECK(fi_enable(net.ep.get()));
  return net;
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
  fi_addr_t addr = FI_ADDR_UNSPEC;
  int inserted = fi_av_insert(av.get(), address.data(), 1, &addr, 0, nullptr);
  if (inserted != 1) throw Error("fi_av_insert: the peer address was not accepted");
  return addr;
}

// GPU memory is registered with its interface and device (FI_HMEM_CUDA), as a dmabuf where
// both libfabric and the driver offer one: the NIC then reads and writes GPU memory directly.
MrPtr Network::RegisterMemory(void* data, size_t size, uint64_t access, const CudaBuffer* gpu) {
  fi_mr_attr attr{};
  iovec iov{data, size};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = access;
  attr.requested_key = next_key++;
  uint64_t flags = 0;
  UniqueFd dmabuf_fd;
  if (gpu != nullptr) {
    attr.iface = FI_HMEM_CUDA;
    attr.device.cuda = gpu->device();
#ifdef FI_MR_DMABUF
    fi_mr_dmabuf dmabuf{};
    dmabuf_fd = gpu->ExportDmabuf();
    if (dmabuf_fd.get() >= 0) {
      dmabuf.fd = dmabuf_fd.get();
      dmabuf.len = size;
      dmabuf.base_addr = data;
      attr.dmabuf = &dmabuf;
      flags |= FI_MR_DMABUF;
    }
#endif
  }
  fid_mr* mr = nullptr;
  FI_CHECK(fi_mr_regattr(domain.get(), &attr, flags, &mr));
  return MrPtr(mr);
}

// Offering FI_HMEM is not enough: a libfabric built without CUDA support (Debian's and
// Ubuntu's) refuses to register CUDA memory. Try once with a small buffer.
bool Network::TakesCudaMemory() {
  if (!(info->caps & FI_HMEM)) return false;
  CudaBuffer probe(1 << 20, 0);
  try {
    RegisterMemory(probe.data(), probe.size(), FI_REMOTE_WRITE, &probe);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// What the writer needs to reach our region: with FI_MR_VIRT_ADDR, remote addresses are
// virtual addresses; otherwise (tcp without it, for example) offsets from 0.
wire::RemoteRegion Network::Advertise(fid_mr* mr, const void* data, size_t size) const {
  const bool virt = info->domain_attr->mr_mode & FI_MR_VIRT_ADDR;
  return {virt ? reinterpret_cast<uint64_t>(data) : 0, size, fi_mr_key(mr)};
}

void Network::PostRecv(Op& op) {
  op.kind = OpKind::kRecv;
  FI_CHECK(fi_recv(ep.get(), op.buffer, kMessageBytes, op.desc, FI_ADDR_UNSPEC, &op.context));
}

// False when the provider's queue is full (-FI_EAGAIN): poll completions, then try again.
bool Network::PostSend(Op& op, fi_addr_t dest) {
  op.kind = OpKind::kSend;
  ssize_t rc = fi_send(ep.get(), op.buffer, op.length, op.desc, dest, &op.context);
  if (rc == -FI_EAGAIN) return false;
  FI_CHECK(rc);
  return true;
}

// One RDMA WRITE of op's buffer to `offset` in the peer's region, carrying `immediate`.
// FI_MORE in `flags` tells the provider that more WRITEs follow at once (a batch): it may
// hold this one back and ring the NIC once for all of them.
bool Network::PostWrite(Op& op, fi_addr_t dest, const wire::RemoteRegion& region, uint64_t offset,
                        uint32_t immediate, uint64_t flags) {
  op.kind = OpKind::kWrite;
  iovec iov{op.buffer, op.length};
  fi_rma_iov rma{region.address + offset, op.length, region.key};
  fi_msg_rma msg{&iov, &op.desc, 1, dest, &rma, 1, &op.context, immediate};
  ssize_t rc = fi_writemsg(ep.get(), &msg, FI_REMOTE_CQ_DATA | flags);
  if (rc == -FI_EAGAIN) return false;
  FI_CHECK(rc);
  return true;
}

size_t Network::PollCompletion(
    const std::function<void(Op*, const fi_cq_data_entry&, fi_addr_t)>& on_done) {
  fi_cq_data_entry entries[kCqBatch];
  fi_addr_t sources[kCqBatch];  // the sender's AV entry, or FI_ADDR_NOTAVAIL if not inserted
  ssize_t n = fi_cq_readfrom(cq.get(), entries, kCqBatch, sources);
  if (n == -FI_EAGAIN) return 0;
  if (n == -FI_EAVAIL) {
    fi_cq_err_entry err{};
    fi_cq_readerr(cq.get(), &err, 0);
    char detail[256] = "";
    fi_cq_strerror(cq.get(), err.prov_errno, err.err_data, detail, sizeof(detail));
    throw Error(std::string("operation failed: ") + fi_strerror(err.err) + " (" + detail + ")");
  }
  FI_CHECK(n);
  for (ssize_t i = 0; i < n; ++i) {
    Op* op = (entries[i].flags & FI_REMOTE_CQ_DATA) ? nullptr : OpOf(entries[i].op_context);
    on_done(op, entries[i], sources[i]);
  }
  return static_cast<size_t>(n);
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

// Message buffers of one side: receives kept posted, and send buffers handed out as needed.
struct Mailbox {
  Mailbox(Network& net, size_t sends)
      : buffers((kRecvDepth + sends) * kMessageBytes),
        mr(net.RegisterMemory(buffers.data(), buffers.size(), FI_RECV | FI_SEND)),
        recvs(kRecvDepth),
        sends(sends) {
    for (size_t i = 0; i < recvs.size() + sends; ++i) {
      Op& op = i < recvs.size() ? recvs[i] : this->sends[i - recvs.size()];
      op.buffer = buffers.data() + i * kMessageBytes;
      op.desc = fi_mr_desc(mr.get());
    }
    for (auto& op : recvs) net.PostRecv(op);
    for (auto& op : this->sends) free_sends.push_back(&op);
  }
  HostBuffer buffers;
  MrPtr mr;
  std::vector<Op> recvs, sends;
  std::vector<Op*> free_sends;
};

// Encodes a message into a free send buffer and SENDs it, polling while none is free.
void SendMessage(Network& net, Mailbox& mail, fi_addr_t dest, const wire::Message& message,
                 const std::function<void()>& progress) {
  const std::vector<uint8_t> bytes = wire::Encode(message);
  while (mail.free_sends.empty()) progress();
  Op* op = mail.free_sends.back();
  mail.free_sends.pop_back();
  std::memcpy(op->buffer, bytes.data(), bytes.size());
  op->length = bytes.size();
  while (!net.PostSend(*op, dest)) progress();
}

PageBuffer::Path ChoosePath(Network& net, MemoryKind memory) {
  if (memory == MemoryKind::kHost) return PageBuffer::Path::kHost;
  return net.TakesCudaMemory() ? PageBuffer::Path::kGpuDirect : PageBuffer::Path::kGpuStaged;
}

void PrintHeader(const char* role, const Plan& plan, WaitMode wait, PageBuffer::Path path) {
  std::string domains;
  for (const auto& lane : plan.lanes)
    domains += std::string(domains.empty() ? "" : ",") + lane->domain_attr->name;
  std::printf("%s %s: provider %s, %zu lane%s (%s), %s, pages in %s\n", kProgram, role,
              plan.lanes[0]->fabric_attr->prov_name, plan.lanes.size(),
              plan.lanes.size() == 1 ? "" : "s", domains.c_str(),
              wait == WaitMode::kBlock ? "blocking waits" : "spinning", PathName(path));
  std::fflush(stdout);
}

std::string DescribeEngine(const wire::Engine& e, size_t threads) {
  std::string s = std::to_string(threads) + " thread" + (threads == 1 ? "" : "s");
  s += (e.flags & wire::kEnginePin) ? ", pinned" : ", not pinned";
  s += (e.flags & wire::kEngineShard) ? ", sharded" : ", one shared state";
  s += ", batch " + std::to_string(e.batch);
  s += (e.flags & wire::kEngineLazy) ? ", lazy posting" : ", eager posting";
  s += (e.flags & wire::kEngineNuma) ? ", NUMA-bound" : ", no NUMA binding";
  s += ", window " + std::to_string(e.window) + " per lane";
  return s;
}

struct Received {
  std::vector<uint8_t> bytes;
  fi_addr_t source;
};

// One TRANSFER being served. The control thread makes it; each data thread serves the pages
// that go out on its lanes (its share), and the last one to finish hands it back.
struct Request {
  uint64_t client = 0;  // the session's number, for messages
  wire::Transfer transfer;
  std::atomic<size_t> shares_left{0};
};

// A data thread's part of a request: the pages striped onto its lanes, copied into memory of
// its own (its group's GPU, or host memory) and registered on its lanes' domains.
struct Share {
  std::shared_ptr<Request> request;
  std::vector<uint32_t> positions;     // indices into transfer.pages
  std::unique_ptr<PageBuffer> source;  // positions.size() pages, in that order
  std::vector<MrPtr> mrs;              // per lane of the thread
  uint64_t total = 0;                  // positions x repeat
  uint64_t posted = 0;
  uint64_t completed = 0;
};

struct Session;

// One data thread of a session and everything only it touches (the sharded state): its
// lanes' endpoints, its window of WRITEs, its queues and its counters.
struct Worker {
  Session* session = nullptr;
  size_t first_lane = 0;  // its lanes: first_lane .. first_lane + lane_count - 1
  size_t lane_count = 0;
  const DeviceGroup* group = nullptr;
  std::optional<unsigned> cpu;  // the core --pin puts it on
  // Declared before the shares, so that the shares' MRs close before their domains.
  std::vector<Network> lanes;
  std::vector<fi_addr_t> dest;  // per lane: the client's address in that lane's AV
  std::vector<Op> ops;
  std::vector<Op*> free_ops;
  std::vector<std::deque<Op*>> pending;  // per lane: WRITEs prepared, not yet posted
  std::list<std::unique_ptr<Share>> shares;
  uint64_t writes = 0, bytes = 0;  // sharded counters, summed when reporting
  uint64_t in_flight = 0;          // WRITEs of this thread's not yet completed
  Clock::time_point last_completion;
  std::mutex inbox_mutex;  // the control thread hands new shares over here
  std::condition_variable inbox_ready;
  std::vector<std::unique_ptr<Share>> inbox;
  std::atomic<bool> has_inbox{false};
  // For the control thread's watchdog: when the loop last went round, and whether it ended.
  std::atomic<Clock::rep> heartbeat{Clock::now().time_since_epoch().count()};
  std::atomic<bool> exited{false};
  std::atomic<pid_t> tid{0};
  std::thread thread;
};

// --no-shard: one window and one set of counters for all of a session's threads, behind a
// lock that every WRITE takes twice.
struct SharedState {
  std::mutex mutex;
  std::vector<Op> ops;
  std::vector<Op*> free_ops;
  uint64_t writes = 0, bytes = 0;
};

// Everything the server holds for one client, freed when the client goes.
struct Session {
  bool On(uint32_t flag) const { return engine.flags & flag; }

  uint64_t number = 0;                          // clients in order of arrival, for messages
  fi_addr_t control = FI_ADDR_UNSPEC;           // the client's lane-0 address in the control AV
  std::vector<std::vector<uint8_t>> addresses;  // per lane used
  std::vector<wire::RemoteRegion> regions;      // per lane used
  std::vector<size_t> owner;                    // per lane used: the worker that drives it
  wire::Engine engine;
  WaitMode wait = WaitMode::kSpin;
  double peer_timeout_s = 10;
  PageBuffer::Path path = PageBuffer::Path::kHost;
  const Plan* plan = nullptr;
  const Topology* topology = nullptr;
  SharedState shared;  // before the workers: their endpoints close first
  std::vector<std::unique_ptr<Worker>> workers;
  std::atomic<size_t> ready{0};  // workers whose lanes are open
  std::atomic<bool> stop{false};
  std::mutex mutex;  // guards failure and finished
  std::string failure;
  std::vector<std::shared_ptr<Request>> finished;
  // The control thread's alone.
  size_t open_requests = 0;
  Clock::time_point last_heard;
};

void Fail(Session& s, const std::string& why) {
  std::lock_guard lock(s.mutex);
  if (s.failure.empty()) s.failure = why;
  s.stop = true;
}

// Fills a share's source pages from the request's seed. Called by the data thread itself
// with --numa (its memory binding puts the pages on its node), by the control thread without.
void PrepareShare(Share& share, PageBuffer::Path path, int device) {
  const wire::Transfer& t = share.request->transfer;
  share.source = std::make_unique<PageBuffer>(share.positions.size() * t.page_size, path, device);
  HostBuffer page(t.page_size);
  for (size_t k = 0; k < share.positions.size(); ++k) {
    FillPage({page.data(), t.page_size}, t.seed, t.pages[share.positions[k]]);
    share.source->Write(k * t.page_size, {page.data(), t.page_size});
  }
  share.source->SyncToNic();
}

// --pin: the thread stays on one core of its group's NUMA node, its caches warm and its
// NICs' completions handled where their memory is.
void PinToGroupCore(const Worker& w) {
  std::string why;
  if (w.cpu && !PinThread(*w.session->topology, *w.cpu, why))
    std::printf("warning: not pinned: %s\n", why.c_str());
}

// --numa: what the thread allocates from here on (endpoints, queues, its pages) comes from
// its group's NUMA node.
void BindToGroupMemory(const Worker& w) {
  std::string why;
  if (!BindThreadMemory(*w.session->topology, w.group->numa, why))
    std::printf("warning: memory not bound: %s\n", why.c_str());
}

// Each data thread opens its own lanes: fresh endpoints for this client alone.
void OpenLanes(Worker& w) {
  Session& s = *w.session;
  for (size_t l = w.first_lane; l < w.first_lane + w.lane_count; ++l) {
    w.lanes.push_back(Network::Open(FiInfoPtr(fi_dupinfo(s.plan->lanes[l].get())), s.wait));
    w.dest.push_back(w.lanes.back().AddPeerAddress(s.addresses[l]));
  }
  w.pending.resize(w.lane_count);
  if (s.On(wire::kEngineShard)) {
    w.ops.resize(s.engine.window * w.lane_count);
    for (auto& op : w.ops) w.free_ops.push_back(&op);
  }
  w.last_completion = Clock::now();
}

// --shard: the thread's own window, no lock. --no-shard: the session's, behind its lock;
// each thread still takes no more than its lanes' share, so none starves the others.
Op* TakeOp(Worker& w) {
  std::vector<Op*>* free_ops = &w.free_ops;
  std::unique_lock<std::mutex> lock;
  if (!w.session->On(wire::kEngineShard)) {
    lock = std::unique_lock(w.session->shared.mutex);
    free_ops = &w.session->shared.free_ops;
    if (w.in_flight >= w.session->engine.window * w.lane_count) return nullptr;
  }
  if (free_ops->empty()) return nullptr;
  Op* op = free_ops->back();
  free_ops->pop_back();
  ++w.in_flight;
  return op;
}

void CountCompletion(Worker& w, Op* op) {
  --w.in_flight;
  if (w.session->On(wire::kEngineShard)) {
    ++op->share->completed;
    ++w.writes;
    w.bytes += op->length;
    w.free_ops.push_back(op);
    return;
  }
  SharedState& shared = w.session->shared;
  std::lock_guard lock(shared.mutex);
  ++op->share->completed;
  ++shared.writes;
  shared.bytes += op->length;
  shared.free_ops.push_back(op);
}

// New shares from the control thread: their pages filled (here with --numa) and registered
// on this thread's lanes.
void TakeNewShares(Worker& w) {
  std::vector<std::unique_ptr<Share>> fresh;
  {
    std::lock_guard lock(w.inbox_mutex);
    fresh.swap(w.inbox);
    w.has_inbox = false;
  }
  const Session& s = *w.session;
  for (auto& share : fresh) {
    if (!share->source) PrepareShare(*share, s.path, w.group->gpu.value_or(0));
    for (auto& lane : w.lanes)
      share->mrs.push_back(lane.RegisterMemory(
          share->source->nic_data(), share->source->size(), FI_WRITE,
          s.path == PageBuffer::Path::kGpuDirect ? &share->source->gpu() : nullptr));
    w.shares.push_back(std::move(share));
  }
}

// Hands a lane's prepared WRITEs to the provider, --batch at a time: FI_MORE on all but the
// last of each batch. Stops when the provider pushes back; the rest wait for the next poll.
void Flush(Worker& w, size_t lane) {
  const Session& s = *w.session;
  std::deque<Op*>& queue = w.pending[lane];
  while (!queue.empty()) {
    const size_t batch = std::min<size_t>(s.engine.batch, queue.size());
    for (size_t i = 0; i < batch; ++i) {
      Op* op = queue.front();
      const uint64_t more = i + 1 < batch ? FI_MORE : 0;
      if (!w.lanes[lane].PostWrite(*op, w.dest[lane], s.regions[w.first_lane + lane],
                                   op->remote_offset, op->share->request->transfer.request_id,
                                   more))
        return;
      queue.pop_front();
    }
  }
}

// Reads every lane's completions. --lazy: posting happens here, right after a lane's
// completions made room in its queue (progress in the CQ poll).
size_t PollLanes(Worker& w,
                 const std::function<void(Op*, const fi_cq_data_entry&, fi_addr_t)>& on_done) {
  size_t done = 0;
  for (size_t l = 0; l < w.lanes.size(); ++l) {
    done += w.lanes[l].PollCompletion(on_done);
    if (w.session->On(wire::kEngineLazy)) Flush(w, l);
  }
  return done;
}

// Prepares WRITEs while the window has free Ops, one share after another in turn. Page i
// of a request always goes out on lane i % lanes, so each thread owns its pages. Eager
// posting (--eager-post) hands each batch to the provider as soon as it is full.
void PostWrites(Worker& w) {
  const Session& s = *w.session;
  const bool eager = !s.On(wire::kEngineLazy);
  bool posted_any = true;
  while (posted_any) {
    posted_any = false;
    for (auto& share : w.shares) {
      if (share->posted == share->total) continue;
      Op* op = TakeOp(w);
      if (op == nullptr) {
        posted_any = false;
        break;
      }
      const wire::Transfer& t = share->request->transfer;
      const size_t k = share->posted % share->positions.size();
      const size_t lane = share->positions[k] % s.regions.size() - w.first_lane;
      op->kind = OpKind::kWrite;
      op->buffer = static_cast<uint8_t*>(share->source->nic_data()) + k * t.page_size;
      op->length = t.page_size;
      op->desc = fi_mr_desc(share->mrs[lane].get());
      op->share = share.get();
      op->remote_offset = t.pages[share->positions[k]] * t.page_size;
      op->lane = lane;
      w.pending[lane].push_back(op);
      if (eager && w.pending[lane].size() >= s.engine.batch) Flush(w, lane);
      ++share->posted;
      posted_any = true;
    }
  }
  if (eager)
    for (size_t l = 0; l < w.lanes.size(); ++l) Flush(w, l);
}

// Shares whose WRITEs all completed are freed; the last share of a request hands it back.
void FinishShares(Worker& w) {
  Session& s = *w.session;
  for (auto it = w.shares.begin(); it != w.shares.end();) {
    if ((*it)->completed < (*it)->total) {
      ++it;
      continue;
    }
    std::shared_ptr<Request> request = (*it)->request;
    it = w.shares.erase(it);  // closes its MRs, frees its pages
    if (--request->shares_left == 0) {
      std::lock_guard lock(s.mutex);
      s.finished.push_back(std::move(request));
    }
  }
}

// A data thread: set up where it belongs, then poll, post and retire until told to stop. An
// error completion (the client died) or silence fails the session, not the server.
void RunWorker(Worker& w) {
  Session& s = *w.session;
  w.tid = gettid();
  try {
    if (s.On(wire::kEnginePin)) PinToGroupCore(w);
    if (s.On(wire::kEngineNuma)) BindToGroupMemory(w);
    OpenLanes(w);
    ++s.ready;
    const std::function<void(Op*, const fi_cq_data_entry&, fi_addr_t)> on_done =
        [&w](Op* op, const fi_cq_data_entry&, fi_addr_t) {
          if (op != nullptr && op->kind == OpKind::kWrite) CountCompletion(w, op);
        };
    const auto timeout = std::chrono::duration<double>(s.peer_timeout_s);
    while (!s.stop) {
      w.heartbeat = Clock::now().time_since_epoch().count();
      if (w.has_inbox) TakeNewShares(w);
      const size_t done = PollLanes(w, on_done);
      PostWrites(w);
      FinishShares(w);
      const auto now = Clock::now();
      if (done > 0) w.last_completion = now;
      if (w.shares.empty()) {  // nothing to do: sleep until the control thread hands work over
        std::unique_lock lock(w.inbox_mutex);
        w.inbox_ready.wait_for(lock, std::chrono::milliseconds(100),
                               [&] { return !w.inbox.empty() || s.stop; });
        w.last_completion = Clock::now();
      } else if (now - w.last_completion > timeout) {
        throw Error("no WRITE completed for " + std::to_string(s.peer_timeout_s).substr(0, 4) +
                    " s");
      } else if (done == 0 && s.wait == WaitMode::kBlock) {
        WaitForCompletions(w.lanes, 100);
      }
    }
  } catch (const std::exception& e) {
    Fail(s, e.what());
  }
  w.exited = true;
}

// A data thread that has not gone round its loop for `limit` is stuck inside a provider
// call. libfabric 1.17's shm does that when a peer is killed while holding the spinlock of
// its shared-memory region: every later post to that peer spins forever.
std::string FindStuckThread(Session& s, std::chrono::duration<double> limit) {
  for (const auto& w : s.workers) {
    const Clock::time_point beat{Clock::duration(w->heartbeat.load())};
    if (!w->exited && Clock::now() - beat > limit)
      return "a data thread has been stuck in the provider for " +
             std::to_string(static_cast<int>(limit.count())) + " s";
  }
  return "";
}

// A CONNECT accepted: the client's session, its workers started and their lanes open. The
// lanes are dealt to the threads in contiguous blocks, which are the topology's groups when
// there is a thread per group.
std::unique_ptr<Session> OpenSession(const wire::Connect& connect, const Plan& plan,
                                     const Topology& topology, const Options& options,
                                     WaitMode wait, PageBuffer::Path path) {
  auto s = std::make_unique<Session>();
  const size_t used = std::min(plan.lanes.size(), connect.lanes.size());
  for (size_t l = 0; l < used; ++l) {
    s->addresses.push_back(connect.lanes[l].address);
    s->regions.push_back(connect.lanes[l].region);
  }
  s->engine = connect.engine;
  if (s->engine.window == 0) s->engine.window = static_cast<uint32_t>(options.window);
  s->wait = wait;
  s->peer_timeout_s = options.peer_timeout_s;
  s->path = path;
  s->plan = &plan;
  s->topology = &topology;
  size_t threads = s->engine.threads;
  if (threads == 0)  // one per group among the lanes used
    threads = std::set<size_t>(plan.group_of.begin(), plan.group_of.begin() + used).size();
  threads = std::min(threads, used);
  std::map<const DeviceGroup*, size_t> per_group;  // threads placed in each group so far
  for (size_t t = 0; t < threads; ++t) {
    auto w = std::make_unique<Worker>();
    w->session = s.get();
    w->first_lane = t * used / threads;
    w->lane_count = (t + 1) * used / threads - w->first_lane;
    w->group = &plan.groups[plan.group_of[w->first_lane]];
    if (!w->group->cpus.empty())
      w->cpu = w->group->cpus[per_group[w->group]++ % w->group->cpus.size()];
    for (size_t l = 0; l < w->lane_count; ++l) s->owner.push_back(t);
    s->workers.push_back(std::move(w));
  }
  if (!s->On(wire::kEngineShard)) {
    s->shared.ops.resize(s->engine.window * used);
    for (auto& op : s->shared.ops) s->shared.free_ops.push_back(&op);
  }
  for (auto& w : s->workers) w->thread = std::thread(RunWorker, std::ref(*w));
  while (s->ready < s->workers.size() && !s->stop)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return s;
}

// Stops a session's threads and waits for them; destroying the session then frees the rest.
// False when a thread is stuck in the provider and cannot be stopped: it is left running at
// idle priority (it only gets a CPU nobody else wants), and its session is never freed.
bool StopSession(Session& s) {
  s.stop = true;
  for (auto& w : s.workers) {
    {
      std::lock_guard lock(w->inbox_mutex);  // so no thread misses the wake-up
    }
    w->inbox_ready.notify_all();
  }
  const auto deadline = Clock::now() + std::chrono::seconds(2);  // a loop takes <= 100 ms
  bool all = true;
  for (auto& w : s.workers) {
    while (!w->exited && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (w->exited) {
      if (w->thread.joinable()) w->thread.join();
      continue;
    }
    sched_param idle{};
    sched_setscheduler(w->tid, SCHED_IDLE, &idle);
    w->thread.detach();
    all = false;
  }
  return all;
}

// Splits a validated request into one share per data thread and hands them over.
void Dispatch(Session& s, wire::Transfer transfer) {
  auto request = std::make_shared<Request>();
  request->client = s.number;
  request->transfer = std::move(transfer);
  const wire::Transfer& t = request->transfer;
  std::vector<std::unique_ptr<Share>> shares(s.workers.size());
  for (size_t i = 0; i < t.pages.size(); ++i) {
    auto& share = shares[s.owner[i % s.regions.size()]];
    if (!share) share = std::make_unique<Share>();
    share->positions.push_back(static_cast<uint32_t>(i));
  }
  request->shares_left = static_cast<size_t>(
      std::count_if(shares.begin(), shares.end(), [](const auto& x) { return x != nullptr; }));
  for (size_t w = 0; w < shares.size(); ++w) {
    if (!shares[w]) continue;
    Worker& worker = *s.workers[w];
    shares[w]->request = request;
    shares[w]->total = shares[w]->positions.size() * t.repeat;
    if (!s.On(wire::kEngineNuma)) PrepareShare(*shares[w], s.path, worker.group->gpu.value_or(0));
    {
      std::lock_guard lock(worker.inbox_mutex);
      worker.inbox.push_back(std::move(shares[w]));
      worker.has_inbox = true;
    }
    worker.inbox_ready.notify_all();
  }
}

std::string RequestName(uint32_t id) {
  return id == kWarmupRequest ? std::string("warmup") : "request " + std::to_string(id);
}

int ServerMain(const Options& options) {
  InstallStopHandlers();
  const MemoryKind memory = ResolveMemory(options.memory);
  const Topology topology = Topology::Load();
  const Plan plan = FindNics(options, {}, memory == MemoryKind::kCuda, true);
  const WaitMode wait = ChooseWaitMode(options.wait, *plan.lanes[0]);
  // Control messages have an endpoint of their own on lane 0's NIC; the data lanes are
  // opened per client, by the threads that drive them.
  std::vector<Network> control;
  control.push_back(Network::Open(FiInfoPtr(fi_dupinfo(plan.lanes[0].get())), wait));
  Network& net = control[0];
  const PageBuffer::Path path = ChoosePath(net, memory);
  PrintHeader("server", plan, wait, path);
  PublishAddress(net.Address(), options.address_file);

  Mailbox mail(net, kRecvDepth);
  std::map<fi_addr_t, std::unique_ptr<Session>> sessions;
  std::deque<Received> inbox;
  uint64_t served = 0, arrivals = 0;
  const auto peer_timeout = std::chrono::duration<double>(options.peer_timeout_s);
  auto on_done = [&](Op* op, const fi_cq_data_entry& done, fi_addr_t source) {
    if (op == nullptr) return;  // the control endpoint receives no remote writes
    if (op->kind == OpKind::kSend) mail.free_sends.push_back(op);
    if (op->kind != OpKind::kRecv) return;
    // Handled later by the main loop, so a message never interrupts another half-way.
    inbox.push_back({{op->buffer, op->buffer + done.len}, source});
    net.PostRecv(*op);
  };
  auto progress = [&] { return net.PollCompletion(on_done); };
  auto refuse = [&](fi_addr_t dest, uint64_t number, uint32_t request_id, const std::string& why) {
    std::printf("client %llu: refused: %s\n", static_cast<unsigned long long>(number), why.c_str());
    SendMessage(net, mail, dest, wire::ErrorReply{request_id, why}, progress);
  };
  std::vector<std::unique_ptr<Session>> abandoned;  // a thread of theirs is stuck: never freed
  auto close_session = [&](auto it, const std::string& how) {
    Session& s = *it->second;
    const bool stopped = StopSession(s);
    uint64_t writes = s.shared.writes, bytes = s.shared.bytes;
    for (const auto& w : s.workers) {  // sharded counters are summed only now
      writes += w->writes;
      bytes += w->bytes;
    }
    std::printf("client %llu %s: %llu WRITEs, %llu bytes\n",
                static_cast<unsigned long long>(s.number), how.c_str(),
                static_cast<unsigned long long>(writes), static_cast<unsigned long long>(bytes));
    fi_av_remove(net.av.get(), &s.control, 1, 0);
    ++served;
    if (!stopped) {
      std::printf("client %llu: a thread stuck in the provider is left at idle priority\n",
                  static_cast<unsigned long long>(s.number));
      abandoned.push_back(std::move(it->second));
    }
    return sessions.erase(it);
  };

  // Prints the requests a session's threads finished; returns why it failed, if it did.
  auto reap = [&](Session& s) {
    std::vector<std::shared_ptr<Request>> finished;
    std::string failure;
    {
      std::lock_guard lock(s.mutex);
      finished.swap(s.finished);
      failure = s.failure;
    }
    for (const auto& r : finished) {
      const wire::Transfer& t = r->transfer;
      std::printf("client %llu: %s: wrote %zu pages of %llu bytes, %llu times\n",
                  static_cast<unsigned long long>(s.number), RequestName(t.request_id).c_str(),
                  t.pages.size(), static_cast<unsigned long long>(t.page_size),
                  static_cast<unsigned long long>(t.repeat));
      --s.open_requests;
    }
    if (failure.empty()) failure = FindStuckThread(s, peer_timeout);
    if (failure.empty() && s.open_requests == 0 && Clock::now() - s.last_heard > peer_timeout)
      failure = "silent for " + std::to_string(options.peer_timeout_s).substr(0, 4) + " s";
    return failure;
  };

  while (!StopRequested() && (options.max_clients == 0 || served < options.max_clients)) {
    const size_t completions = progress();
    for (auto it = sessions.begin(); it != sessions.end();) {
      const std::string failure = reap(*it->second);
      if (failure.empty()) {
        ++it;
      } else {
        std::printf("client %llu lost: %s\n", static_cast<unsigned long long>(it->second->number),
                    failure.c_str());
        it = close_session(it, "cleaned up");
      }
      std::fflush(stdout);
    }
    if (completions == 0 && inbox.empty()) {  // control traffic is rare: do not spin on it
      if (wait == WaitMode::kBlock)
        WaitForCompletions(control, 10);
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    while (!inbox.empty()) {
      Received m = std::move(inbox.front());
      inbox.pop_front();
      auto known = m.source == FI_ADDR_NOTAVAIL ? sessions.end() : sessions.find(m.source);
      const uint64_t number = known == sessions.end() ? 0 : known->second->number;
      wire::Message message;
      try {
        message = wire::Decode(m.bytes);
      } catch (const wire::ProtocolError& e) {
        if (known != sessions.end())
          refuse(m.source, number, 0, e.what());
        else
          std::printf("dropped a message: %s\n", e.what());
        continue;
      }
      if (known != sessions.end()) known->second->last_heard = Clock::now();
      if (auto* connect = std::get_if<wire::Connect>(&message)) {
        ++arrivals;
        // Our answer goes to the lane-0 address the CONNECT names. If that is a connected
        // client's, whoever sent it cannot be answered, nor allowed to speak for that client.
        std::string owner;
        bool impostor = false;  // its lane 0 is a connected client's
        for (const auto& [id, s] : sessions)
          for (size_t l = 0; l < s->addresses.size(); ++l)
            for (size_t c = 0; c < connect->lanes.size() && owner.empty(); ++c)
              if (connect->lanes[c].address == s->addresses[l]) {
                owner = "lane " + std::to_string(c) + " is lane " + std::to_string(l) +
                        " of client " + std::to_string(s->number) +
                        ": a client's lanes, regions and keys are its own";
                impostor = c == 0;
              }
        if (impostor) {
          std::printf("dropped a CONNECT: %s\n", owner.c_str());
          continue;
        }
        const fi_addr_t id = net.AddPeerAddress(connect->lanes[0].address);
        if (!owner.empty()) {
          refuse(id, arrivals, 0, owner);
          continue;
        }
        std::unique_ptr<Session> session;
        std::string why;
        try {
          session = OpenSession(*connect, plan, topology, options, wait, path);
        } catch (const Error& e) {
          why = e.what();
        }
        if (session) {
          std::lock_guard lock(session->mutex);  // its threads may still be writing it
          why = session->failure;
        }
        if (session && !why.empty() && !StopSession(*session))
          abandoned.push_back(std::move(session));  // a thread is stuck in the provider
        if (!why.empty()) {
          refuse(id, arrivals, 0, "could not open a session: " + why);
          continue;
        }
        session->number = arrivals;
        session->control = id;
        session->last_heard = Clock::now();
        std::printf("client %llu connected: region of %llu bytes, %zu lanes, %s\n",
                    static_cast<unsigned long long>(arrivals),
                    static_cast<unsigned long long>(connect->lanes[0].region.length),
                    session->regions.size(),
                    DescribeEngine(session->engine, session->workers.size()).c_str());
        sessions[id] = std::move(session);
        SendMessage(net, mail, id, wire::Accept{}, progress);
      } else if (known == sessions.end()) {
        std::printf("dropped a message from a sender that did not CONNECT\n");
      } else if (auto* transfer = std::get_if<wire::Transfer>(&message)) {
        // A request names pages of its sender's region: the one its CONNECT advertised.
        Session& s = *known->second;
        try {
          for (const auto& region : s.regions) wire::ValidateTransfer(*transfer, region);
        } catch (const wire::ProtocolError& e) {
          refuse(m.source, number, transfer->request_id, e.what());
          continue;
        }
        ++s.open_requests;
        Dispatch(s, std::move(*transfer));
      } else if (std::holds_alternative<wire::Bye>(message)) {
        // Every WRITE has landed, but our completions for the last ones may still be on
        // their way: let the threads see them, so the figures below are whole.
        Session& s = *known->second;
        const auto since = Clock::now();
        while (s.open_requests > 0 && reap(s).empty() && Clock::now() - since < peer_timeout)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        close_session(known, "done");
      } else {
        refuse(m.source, number, 0, "unexpected message type");
      }
      std::fflush(stdout);
    }
  }
  for (auto it = sessions.begin(); it != sessions.end();) it = close_session(it, "stopped");
  for (auto& s : abandoned) s.release();  // its stuck thread still uses it; exit ends both
  std::printf("served %llu clients\n", static_cast<unsigned long long>(served));
  return kExitOk;
}

// Checks every requested page against the seed's data, in the region of the lane it came
// on; throws naming the first bad byte.
uint64_t VerifyPages(const std::vector<std::span<const uint8_t>>& lane_views,
                     const wire::Transfer& request) {
  for (size_t i = 0; i < request.pages.size(); ++i) {
    const uint64_t at = request.pages[i] * request.page_size;
    std::span<const uint8_t> region = lane_views[i % lane_views.size()];
    size_t bad = VerifyPage(region.subspan(at, request.page_size), request.seed, request.pages[i]);
    if (bad != kPageOk)
      throw Error("verification failed: page " + std::to_string(i) + " (region page " +
                  std::to_string(request.pages[i]) + ") differs at byte offset " +
                  std::to_string(bad));
  }
  return request.pages.size() * request.page_size;
}

void CheckRequestSize(const Options& options) {
  if (options.page_size == 0 || options.page_size > wire::kMaxPageBytes)
    throw UsageError("invalid --page-size " + std::to_string(options.page_size) + " (1 to " +
                     std::to_string(wire::kMaxPageBytes) + ")");
  if (options.pages == 0 || options.pages > wire::kMaxPagesPerRequest)
    throw UsageError("invalid --pages " + std::to_string(options.pages) + " (1 to " +
                     std::to_string(wire::kMaxPagesPerRequest) + " per request)");
  if (options.pages * options.page_size > wire::kMaxRequestBytes)
    throw UsageError("--pages x --page-size is " +
                     std::to_string(options.pages * options.page_size) + " bytes, over the " +
                     std::to_string(wire::kMaxRequestBytes) + " a request may hold");
  if (options.repeat == 0 || options.repeat > wire::kMaxRepeat)
    throw UsageError("invalid --repeat " + std::to_string(options.repeat));
  if (options.requests == 0 || options.requests > kMaxRequestsInFlight)
    throw UsageError("invalid --requests " + std::to_string(options.requests) + " (1 to " +
                     std::to_string(kMaxRequestsInFlight) + ")");
  if (options.window == 0 || options.window > wire::kMaxWindow)
    throw UsageError("invalid --window " + std::to_string(options.window) + " (1 to " +
                     std::to_string(wire::kMaxWindow) + ")");
  if (options.threads > wire::kMaxLanes)
    throw UsageError("invalid --threads " + std::to_string(options.threads) + " (0 to " +
                     std::to_string(wire::kMaxLanes) + ")");
  if (options.batch == 0 || options.batch > wire::kMaxBatch)
    throw UsageError("invalid --batch " + std::to_string(options.batch) + " (1 to " +
                     std::to_string(wire::kMaxBatch) + ")");
  if (options.warmup > wire::kMaxRepeat)
    throw UsageError("invalid --warmup " + std::to_string(options.warmup));
}

// One client session: connect with `engine`, optionally warm every lane up, send the
// requests, count and time the WRITEs, verify. The server opens a session of its own for it.
Summary RunSession(const Options& options, std::span<const uint8_t> peer,
                   const wire::Engine& engine, bool warm, bool print) {
  const MemoryKind memory = ResolveMemory(options.memory);
  const Plan plan = FindNics(options, peer, memory == MemoryKind::kCuda, print);
  std::vector<Network> lanes;
  const WaitMode wait = ChooseWaitMode(options.wait, *plan.lanes[0]);
  for (const auto& nic : plan.lanes)
    lanes.push_back(Network::Open(FiInfoPtr(fi_dupinfo(nic.get())), wait));
  Network& net = lanes[0];  // control messages travel on lane 0
  fi_addr_t server = net.AddPeerAddress(peer);
  const PageBuffer::Path path = ChoosePath(net, memory);
  if (print) PrintHeader("client", plan, wait, path);
  if (!options.address_file.empty()) {  // our lane addresses (tests play a thief with them)
    std::vector<std::vector<uint8_t>> addresses;
    for (const auto& lane : lanes) addresses.push_back(lane.Address());
    WriteAddressList(addresses, options.address_file);
  }

  // The region has room for twice the pages asked for, so the chosen pages are scattered;
  // each request gets its own share of them. One region per group, in its GPU's memory or
  // host memory, registered on each of the group's lanes (each domain gives it a key).
  const uint64_t total_pages = options.pages * options.requests;
  const uint64_t region_pages = 2 * total_pages;
  std::map<size_t, PageBuffer> regions;
  std::vector<MrPtr> region_mrs;
  for (size_t l = 0; l < lanes.size(); ++l) {
    const size_t g = plan.group_of[l];
    if (!regions.count(g))
      regions.try_emplace(g, region_pages * options.page_size, path,
                          plan.groups[g].gpu.value_or(0));
    PageBuffer& region = regions.at(g);
    region_mrs.push_back(
        lanes[l].RegisterMemory(region.nic_data(), region.size(), FI_REMOTE_WRITE,
                                path == PageBuffer::Path::kGpuDirect ? &region.gpu() : nullptr));
  }
  Mailbox mail(net, options.requests + 3);

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
  if (options.test_bad_page) requests.back().pages.back() = static_cast<uint32_t>(region_pages);
  // Warmup: the first page of each lane, --warmup times, untimed. It lands where the timed
  // WRITEs land later, with the same data.
  wire::Transfer warmup = requests[0];
  warmup.request_id = kWarmupRequest;
  warmup.pages.resize(std::min<size_t>(lanes.size(), warmup.pages.size()));
  warmup.repeat = options.warmup;
  warm = warm && options.warmup > 0;
  uint64_t warmup_arrived = 0;

  uint64_t expected = total_pages * options.repeat;    // less what the server refuses
  std::vector<uint64_t> arrived(requests.size() + 1);  // per request id
  uint64_t arrived_total = 0;
  // The clock runs from the first timed WRITE's arrival to the last: it times the network,
  // not the server filling its source pages before it starts.
  Clock::time_point first_arrival, last_arrival;
  size_t sends_done = 0;
  std::string refused;
  bool accepted = false;
  double link_gbps = 0;
  for (const auto& lane : lanes)  // --link-gbps is the rate of one NIC
    link_gbps += options.link_gbps > 0 ? options.link_gbps : LinkGbps(*lane.info);
  ProgressLine progress_line(expected, link_gbps);
  const auto idle_limit = std::chrono::duration<double>(options.timeout_s);
  auto last_progress = Clock::now();
  auto on_done = [&](Op* op, const fi_cq_data_entry& done, fi_addr_t) {
    if (op == nullptr) {  // a remote WRITE landed in one of our regions
      if (done.data == kWarmupRequest) {
        ++warmup_arrived;
        return;
      }
      if (done.data == 0 || done.data > requests.size())
        throw Error("a WRITE arrived for unknown request " + std::to_string(done.data));
      ++arrived[done.data];  // never assume the last WRITE lands last: count them
      if (arrived_total++ == 0) first_arrival = Clock::now();
      last_arrival = Clock::now();
    } else if (op->kind == OpKind::kSend) {
      mail.free_sends.push_back(op);
      ++sends_done;
    } else if (op->kind == OpKind::kRecv) {
      wire::Message message = wire::Decode({op->buffer, done.len});
      net.PostRecv(*op);
      if (std::holds_alternative<wire::Accept>(message)) {
        accepted = true;
        return;
      }
      auto* error = std::get_if<wire::ErrorReply>(&message);
      if (error == nullptr) throw Error("unexpected message from the server");
      if (!accepted) throw Error("the server refused the connection: " + error->text);
      if (refused.empty()) refused = RequestName(error->request_id) + ": " + error->text;
      // The other requests are still being written: wait for them before saying BYE.
      if (error->request_id >= 1 && error->request_id <= requests.size())
        expected -= requests[error->request_id - 1].pages.size() * options.repeat;
    }
  };
  auto progress = [&] {
    size_t done = 0;
    for (auto& lane : lanes) done += lane.PollCompletion(on_done);  // WRITEs land on every lane
    if (done > 0)
      last_progress = Clock::now();
    else if (wait == WaitMode::kBlock)
      WaitForCompletions(lanes, 100);
    if (Clock::now() - last_progress > idle_limit)
      throw Error("no answer from the server within " + std::to_string(options.timeout_s) +
                  " s (is it running at that address?)");
  };

  wire::Connect connect;
  connect.engine = engine;
  for (size_t l = 0; l < lanes.size(); ++l) {
    PageBuffer& region = regions.at(plan.group_of[l]);
    connect.lanes.push_back(
        {lanes[l].Address(),
         lanes[l].Advertise(region_mrs[l].get(), region.nic_data(), region.size())});
  }
  if (!options.test_claim.empty()) {  // lanes 1.. become another client's
    const auto claimed = ReadAddressList(options.test_claim);
    for (size_t l = 1; l < connect.lanes.size() && l < claimed.size(); ++l)
      connect.lanes[l].address = claimed[l];
  }
  SendMessage(net, mail, server, connect, progress);
  while (!accepted) progress();  // our address is in the server's AV now
  if (warm) {
    SendMessage(net, mail, server, warmup, progress);
    while (warmup_arrived < warmup.pages.size() * warmup.repeat && refused.empty()) progress();
  }
  for (const auto& request : requests) SendMessage(net, mail, server, request, progress);
  while (arrived_total < expected) {
    progress();
    if (arrived_total > 1)
      progress_line.Update(arrived_total - 1, (arrived_total - 1) * options.page_size,
                           std::chrono::duration<double>(last_arrival - first_arrival).count());
  }
  progress_line.End();
  const double seconds = std::chrono::duration<double>(last_arrival - first_arrival).count();
  SendMessage(net, mail, server, wire::Bye{}, progress);
  while (sends_done < requests.size() + 2 + (warm ? 1 : 0)) progress();
  if (!refused.empty()) throw Error("the server refused " + refused);
  for (size_t r = 1; r < arrived.size(); ++r) {
    if (arrived[r] != requests[r - 1].pages.size() * options.repeat)
      throw Error("request " + std::to_string(r) + " received " + std::to_string(arrived[r]) +
                  " WRITEs");
  }

  std::map<size_t, std::span<uint8_t>> views;
  for (auto& [g, region] : regions) {
    region.SyncFromNic();
    views[g] = region.HostView();
  }
  if (options.test_corrupt)
    views.begin()->second[requests[0].pages[0] * options.page_size + 1] ^= 0x5a;
  std::vector<std::span<const uint8_t>> lane_views;
  for (size_t l = 0; l < lanes.size(); ++l) lane_views.push_back(views.at(plan.group_of[l]));
  uint64_t verified = 0;
  for (const auto& request : requests) verified += VerifyPages(lane_views, request);

  Summary summary;
  summary.bytes = (arrived_total - 1) * options.page_size;  // what arrived after the clock started
  summary.writes = arrived_total - 1;
  summary.seconds = seconds;
  summary.link_gbps = link_gbps;
  summary.verified_bytes = verified;
  summary.lanes = static_cast<int>(lanes.size());
  return summary;
}

// The engine the client's switches ask for.
wire::Engine EngineFromOptions(const Options& options) {
  wire::Engine e;
  e.flags = (options.pin ? wire::kEnginePin : 0) | (options.shard ? wire::kEngineShard : 0) |
            (options.lazy ? wire::kEngineLazy : 0) | (options.numa ? wire::kEngineNuma : 0);
  e.threads = static_cast<uint32_t>(options.threads);
  e.batch = static_cast<uint32_t>(options.batch);
  e.window = static_cast<uint32_t>(options.window);
  return e;
}

// --ladder: the published journey's rungs, each optimization switched on in turn over the
// one before, one session each.
int RunLadder(const Options& options, std::span<const uint8_t> peer) {
  struct Rung {
    std::string name;
    bool warm;
    wire::Engine engine;
  };
  wire::Engine e{0, 1, 1, static_cast<uint32_t>(options.window)};
  std::vector<Rung> rungs;
  rungs.push_back({"lanes, one thread", false, e});
  rungs.push_back({"+ warmup", true, e});
  e.threads = static_cast<uint32_t>(options.threads);
  rungs.push_back({"+ one thread per group", true, e});
  e.flags |= wire::kEnginePin;
  rungs.push_back({"+ pinning threads to cores", true, e});
  e.flags |= wire::kEngineShard;
  rungs.push_back({"+ sharded per-thread state", true, e});
  e.batch = static_cast<uint32_t>(options.batch);
  rungs.push_back({"+ batching " + std::to_string(options.batch) + " WRITEs per post", true, e});
  e.flags |= wire::kEngineLazy;
  rungs.push_back({"+ lazy posting (progress in CQ poll)", true, e});
  e.flags |= wire::kEngineNuma;
  rungs.push_back({"+ NUMA-aware allocation", true, e});

  for (size_t i = 0; i < rungs.size(); ++i) {
    Summary s = RunSession(options, peer, rungs[i].engine, rungs[i].warm, i == 0);
    if (i == 0) {
      rungs[0].name = std::to_string(s.lanes) + " " + rungs[0].name;
      std::printf("| step | Gbps | %% of link | Mpps |\n|---|---:|---:|---:|\n");
    }
    s.step = rungs[i].name;
    const double gbps = Gbps(s.bytes, s.seconds);
    char percent[32] = "-";  // unknown without a link rate (--link-gbps)
    if (s.link_gbps > 0) std::snprintf(percent, sizeof(percent), "%.1f", 100 * gbps / s.link_gbps);
    std::printf("| %s | %.3f | %s | %.4f |\n", s.step.c_str(), gbps, percent,
                s.seconds > 0 ? static_cast<double>(s.writes) / s.seconds / 1e6 : 0);
    if (options.json) PrintSummary(s, true);
    std::fflush(stdout);
  }
  return kExitOk;
}

int ClientMain(const Options& options) {
  const std::vector<uint8_t> peer = FromHex(options.peer);
  CheckRequestSize(options);
  if (options.ladder) return RunLadder(options, peer);
  PrintSummary(RunSession(options, peer, EngineFromOptions(options), options.warm, true),
               options.json);
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  options.warmup = 16;
  CLI::App app{
      "Lesson 07: the full engine. Without an address: serve clients, several at once, on "
      "every NIC of every group. With the server's address: ask for the engine the switches "
      "describe (all optimizations on by default), send --requests requests of --pages random "
      "pages each, verify; --ladder measures each optimization in turn.",
      kProgram};
  AddOptions(app, options,
             kServeOptions | kTransferOptions | kWindowOptions | kWarmupOptions | kLaneOptions |
                 kEngineOptions);
  if (int rc = ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  if (options.peer.empty()) {  // the engine is what each client asks for
    for (const char* name : kEngineOptionNames) {
      if (app.count(name) > 0) {
        std::fprintf(stderr,
                     "%s: %s is a client option: each client asks the server for its "
                     "engine\n",
                     kProgram, name);
        return kExitUsage;
      }
    }
  }
  return RunProgram(
      kProgram, [&] { return options.peer.empty() ? ServerMain(options) : ClientMain(options); });
}
