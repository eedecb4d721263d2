// 03_gpudirect_write: one-sided RDMA WRITE of scattered pages into remote (GPU) memory.
//
// The client registers a region of memory (GPU memory where there is a GPU) for remote
// write and sends CONNECT with the region's address and key, then a TRANSFER request naming
// random pages of that region. The server fills its source pages from the request's seed and
// WRITEs each one straight into the client's region; the client's CPU copies nothing. Each
// WRITE carries immediate data naming the request, so the client counts completions until
// every page has arrived, and then checks every byte. The server faces the network: whatever
// a client sends or however it dies, it drops that client and serves the next (README.md).

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
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
#include "text.hpp"

using namespace common;

namespace {

constexpr const char* kProgram = "03_gpudirect_write";
constexpr size_t kRecvDepth = 8;  // receives each side keeps posted

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
  Request* request = nullptr;       // the request a WRITE belongs to
};

Op* OpOf(void* context) {
  return reinterpret_cast<Op*>(context);
}

class Network {
 public:
  static Network Open(const Options& options, std::span<const uint8_t> peer, MemoryKind memory);
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
    const size_t n = ReadCompletions(
        cq.get(), true,
        [&](const fi_cq_data_entry& e, fi_addr_t source) {
          on_done(IsRemoteWrite(e) ? nullptr : OpOf(e.op_context), e, source);
        },
        [&](const CompletionError& e) { on_error(OpOf(e.op_context), e); });
    if (n == 0)
      idle.Idle();  // nothing yet: yield a little, then nap (common/backoff.hpp)
    else
      idle.Busy();
    return n;
  }

  // Declared in creation order, so they are closed in reverse.
  FiInfoPtr info;
  FabricPtr fabric;
  DomainPtr domain;
  CqPtr cq;
  AvPtr av;
  EpPtr ep;
  MemoryPath memory;  // where our pages live and how they reach the NIC (common/registration)
  // A loop that only waits (a server without clients) must not hold a core: each poll that
  // finds nothing makes the next one a little later.
  IdleBackoff idle;
};

Network Network::Open(const Options& options, std::span<const uint8_t> peer, MemoryKind memory) {
  FiInfoPtr hints(fi_allocinfo());
  hints->ep_attr->type = FI_EP_RDM;           // reliable, unconnected: one endpoint talks to many
  hints->caps = FI_MSG | FI_SOURCE | FI_RMA;  // FI_SOURCE: completions name the sender
  // GPU memory: ask for providers that can take it (FI_HMEM), unless told to stage it.
  if (IsGpu(memory) && options.gpu_path != GpuPathMode::kStaged) hints->caps |= FI_HMEM;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  // The memory-registration modes this program honours (efa-direct asks for all of them).
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_HMEM;

  Network net;
  std::string no_hmem;  // why FI_HMEM was left out, if it was: the pages are then staged
  net.info = SelectProvider(*hints, options, peer, &no_hmem);
  fid_fabric* fabric = nullptr;
  FI_CHECK(fi_fabric(net.info->fabric_attr, &fabric, nullptr));
  net.fabric.reset(fabric);
  fid_domain* domain = nullptr;
  FI_CHECK(fi_domain(net.fabric.get(), net.info.get(), &domain, nullptr));
  net.domain.reset(domain);
  net.memory = ChooseMemoryPath(net.domain.get(), *net.info, memory, options.gpu_path, no_hmem);

  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;  // with the immediate data of remote writes
  cq_attr.wait_obj = FI_WAIT_NONE;     // we poll
  fid_cq* cq = nullptr;
  FI_CHECK(fi_cq_open(net.domain.get(), &cq_attr, &cq, nullptr));
  net.cq.reset(cq);

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

// The control messages: receives kept posted, and a queue of messages to send that never
// makes us wait (common/mailbox.hpp).
using Mail = Mailbox<Network, Op>;
// The server's front desk: admission, tokens, departures and limits (common/reception.hpp).
using Desk = Reception<Network, Op>;

void PrintHeader(const char* role, const Network& net) {
  std::printf("%s %s: provider %s, domain %s, pages in %s\n", kProgram, role,
              net.info->fabric_attr->prov_name, net.info->domain_attr->name,
              DescribeMemoryPath(net.memory).c_str());
  std::fflush(stdout);
}

// The one TRANSFER being served: its source pages, registered, and its WRITEs. It outlives
// an abandoned transfer while the provider still holds some of its WRITEs.
struct Request {
  fi_addr_t client = FI_ADDR_UNSPEC;
  uint64_t number = 0;  // the desk's name for the client, in the log
  wire::RemoteRegion region;
  wire::Transfer transfer;
  PageBuffer source;
  MrPtr mr;
  std::vector<Op> writes;
  uint64_t completed = 0, in_flight = 0;
  std::string failure;  // a WRITE failed: why
  Clock::time_point first_post, last_completion = Clock::now(), abandoned_at{};
};

// Fills the request's source pages from its seed and registers them.
std::unique_ptr<Request> PrepareRequest(Network& net, const Desk::Client& client, fi_addr_t dest,
                                        wire::Transfer transfer) {
  const size_t count = transfer.pages.size(), page_size = transfer.page_size;
  auto r = std::make_unique<Request>();
  r->client = dest;
  r->number = client.number;
  r->region = client.regions[0];
  r->transfer = std::move(transfer);
  r->source = PageBuffer(count * page_size, net.memory, 0, Pages::kSmall);  // for one request
  HostBuffer staging;  // GPU memory is filled here first
  FillPages(r->source, 0, r->transfer.seed, r->transfer.pages, page_size, staging);
  r->mr = net.Register(r->source, FI_WRITE);
  r->writes.resize(count);
  for (size_t i = 0; i < count; ++i) {
    r->writes[i].buffer = static_cast<uint8_t*>(r->source.nic_data()) + i * page_size;
    r->writes[i].length = page_size;
    r->writes[i].desc = fi_mr_desc(r->mr.get());
    r->writes[i].request = r.get();
  }
  return r;
}

// Writes every page of the request into the client's region, `repeat` times over, one round
// after another. Gives up, leaving WRITEs the provider still holds to complete later, when a
// WRITE fails, no WRITE completes for `limit`, `stop()` says so (its client left, or the
// server is stopping) or the server is told to stop. Returns why it gave up ("" when done).
std::string ServeTransfer(Network& net, Request& r, const std::function<void()>& progress,
                          const std::function<bool()>& stop, Clock::duration limit) {
  const wire::Transfer& t = r.transfer;
  r.first_post = r.last_completion = Clock::now();
  for (uint64_t round = 0; round < t.repeat; ++round) {
    r.completed = 0;
    for (Op& op : r.writes) {
      const uint64_t offset = t.pages[&op - r.writes.data()] * t.page_size;
      while (!net.PostWrite(op, r.client, r.region, offset, t.request_id)) {
        progress();
        if (!r.failure.empty()) return r.failure;
        if (stop()) return "stopped";
        if (Clock::now() - r.last_completion > limit) return "no WRITE completed in time";
      }
      ++r.in_flight;
    }
    while (r.completed < r.writes.size()) {  // every Op is busy until its WRITE completes
      progress();
      if (!r.failure.empty()) return r.failure;
      if (stop()) return "stopped";
      if (Clock::now() - r.last_completion > limit) return "no WRITE completed in time";
    }
  }
  return "";
}

int ServerMain(const Options& options) {
  InstallStopHandlers(kProgram);
  Network net = Network::Open(options, {}, ResolveMemory(options.memory));
  PrintHeader("server", net);
  const auto limit =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.timeout_s));

  Mail mail(net, kRecvDepth, kRecvDepth);
  std::vector<std::unique_ptr<Request>> draining;  // given up, WRITEs still in the provider
  // Who is a client and who stops being one (common/reception.hpp, README "The front desk").
  Desk::Hooks hooks;
  hooks.busy = [&](fi_addr_t peer) {
    for (const auto& r : draining)
      if (r->client == peer && r->source.size() > 0) return true;
    return false;
  };
  Desk desk(net, mail, options, hooks);
  PublishAddress(desk.own_address(), options);
  auto on_done = [&](Op* op, const fi_cq_data_entry& done, fi_addr_t source) {
    if (op == nullptr) return;  // the server receives no remote writes
    if (op->kind == OpKind::kSend) mail.Sent(op);
    if (op->kind == OpKind::kWrite) {
      ++op->request->completed;
      --op->request->in_flight;
      op->request->last_completion = Clock::now();
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
      if (op->kind == OpKind::kSend) mail.Sent(op);
      if (op->kind == OpKind::kWrite) {
        --op->request->in_flight;
        op->request->failure = "a WRITE failed: " + error.text;
      }
      desk.Lost(op->peer, error.text);
    }
    std::fflush(stdout);
  };
  // Completions, then the messages waiting to go out; a peer that takes none is lost.
  auto progress = [&] {
    net.PollCompletion(on_done, on_error);
    for (fi_addr_t peer : mail.Flush(limit)) desk.Lost(peer, "does not take our messages");
  };

  while (desk.Open()) {
    progress();
    std::erase_if(draining, [](const auto& r) { return r->in_flight == 0; });
    for (auto& r : draining) {  // shm never completes a WRITE to a process that died
      if (r->source.size() == 0 || Clock::now() - r->abandoned_at < limit) continue;
      std::printf("client %llu: request %u: %llu WRITEs never completed; their pages freed\n",
                  static_cast<unsigned long long>(r->number), r->transfer.request_id,
                  static_cast<unsigned long long>(r->in_flight));
      r->mr.reset();
      r->source = PageBuffer();  // the request stays, small, for completions that may come
    }
    desk.Tend();
    while (auto request = desk.Next()) {
      const fi_addr_t client = request->client;
      const auto name = static_cast<unsigned long long>(desk.Find(client)->number);
      std::unique_ptr<Request> r;
      try {
        const std::string why = OverLimits(options, request->transfer, 0, 0, 0);
        if (!why.empty()) throw Error(why);
        r = PrepareRequest(net, *desk.Find(client), client, std::move(request->transfer));
      } catch (const std::exception& e) {  // over a limit, or no memory for it
        desk.Refuse(client, request->transfer.request_id, e.what());
        continue;
      }
      const std::string why = ServeTransfer(
          net, *r, progress, [&] { return StopRequested() || desk.Leaving(client); }, limit);
      desk.Seen(client);  // it took them
      const wire::Transfer& t = r->transfer;
      if (!why.empty()) {
        std::printf("client %llu: request %u: given up: %s\n", name, t.request_id, why.c_str());
        if (why != "stopped") desk.Lost(client, why);
        r->abandoned_at = Clock::now();
        if (r->in_flight > 0) draining.push_back(std::move(r));
        continue;
      }
      std::printf("client %llu: request %u: wrote %zu pages of %llu bytes, %llu times\n", name,
                  t.request_id, t.pages.size(), static_cast<unsigned long long>(t.page_size),
                  static_cast<unsigned long long>(t.repeat));
      const wire::Done done{t.request_id, t.pages.size() * t.repeat,
                            static_cast<uint64_t>(r->first_post.time_since_epoch().count()),
                            static_cast<uint64_t>(r->last_completion.time_since_epoch().count())};
      mail.Send(client, done);
      std::fflush(stdout);
    }
    std::fflush(stdout);
  }
  std::printf("served %s\n", Plural(desk.served(), "client").c_str());
  std::fflush(stdout);
  net.ep.reset();  // WRITEs still in the provider end with the endpoint, before their pages go
  return kExitOk;
}

int ClientMain(const Options& options) {
  InstallStopHandlers(kProgram);  // Ctrl-C or SIGTERM: BYE, then exit (SayByeAndStop)
  const std::vector<uint8_t> peer = FromHex(options.peer);
  CheckRequestSize(options);
  Network net = Network::Open(options, peer, ResolveMemory(options.memory));
  fi_addr_t server = net.AddPeerAddress(peer);
  PrintHeader("client", net);
  const auto limit =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.timeout_s));

  // The region has room for twice the pages asked for, so the chosen pages are scattered.
  const uint64_t region_pages = 2 * options.pages;
  PageBuffer region(region_pages * options.page_size, net.memory);
  MrPtr region_mr = net.Register(region, FI_REMOTE_WRITE);
  Mail mail(net, kRecvDepth, 3);

  wire::Transfer request;
  request.request_id = 1;
  request.seed = options.seed;
  request.page_size = options.page_size;
  request.repeat = options.repeat;
  request.pages = SamplePages(options.seed, options.pages, region_pages);

  const uint64_t expected = request.pages.size() * request.repeat;
  uint64_t arrived = 0;
  std::string refused;
  bool accepted = false;
  std::optional<wire::Done> done;
  auto last_progress = Clock::now();
  // Only our server's messages count; anyone else's are dropped and counted.
  ServerFilter from_server(server, wire::NewToken());
  auto on_done = [&](Op* op, const fi_cq_data_entry& entry, fi_addr_t source) {
    if (op == nullptr) {  // a remote WRITE landed in our region
      if (entry.data != request.request_id)
        throw Error("a WRITE arrived for unknown request " + std::to_string(entry.data));
      ++arrived;  // never assume the last WRITE lands last: count them
    } else if (op->kind == OpKind::kSend) {
      mail.Sent(op);
    } else if (op->kind == OpKind::kRecv) {
      std::optional<wire::Message> message = from_server.Take({op->buffer, entry.len}, source);
      net.PostRecv(*op);
      if (!message) return;
      if (auto* accept = std::get_if<wire::Accept>(&*message)) {
        accepted = true;
        mail.Seal(server, accept->session);  // our TRANSFER and BYE carry it
      } else if (auto* error = std::get_if<wire::ErrorReply>(&*message)) {
        refused = error->text;
      } else if (auto* d = std::get_if<wire::Done>(&*message);
                 d != nullptr && d->request_id == request.request_id && !done) {
        done = *d;
      } else {
        from_server.Ignore("a message that answers nothing we asked");
      }
    }
  };
  auto on_error = [&](Op*, const CompletionError& error) {
    Abandon(kProgram, "an operation failed: " + error.text);
  };
  auto progress = [&] {
    if (StopRequested())
      SayByeAndStop(
          mail, server, [&] { net.PollCompletion(on_done, on_error); }, kProgram);
    if (net.PollCompletion(on_done, on_error) > 0) last_progress = Clock::now();
    if (!mail.Flush(limit).empty())
      Abandon(kProgram, "no answer from the server within " + FormatSeconds(options.timeout_s) +
                            ": it takes none of our messages (is it running at that address?)");
    if (Clock::now() - last_progress > limit)
      Abandon(kProgram, "no answer from the server within " + FormatSeconds(options.timeout_s) +
                            " (is it running at that address?)");
  };
  auto send = [&](const wire::Message& message) { mail.Send(server, message); };

  wire::Connect connect;
  connect.lanes.push_back(
      {net.Address(), net.Advertise(region_mr.get(), region.nic_data(), region.size())});
  // Again until answered: the server answers a CONNECT once one came from the address it names.
  ConnectUntilAnswered(
      mail, server, from_server.token(), connect, [&] { return accepted || !refused.empty(); },
      progress, kProgram, options.timeout_s);
  const auto start = Clock::now();
  send(request);
  while ((arrived < expected || !done) && refused.empty()) progress();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  send(wire::Bye{});
  while (!mail.Idle()) progress();  // every message of ours has left
  if (!refused.empty()) throw Error("the server refused the request: " + refused);

  region.SyncFromNic();
  std::span<uint8_t> view = region.HostView();
  const uint64_t verified = VerifyPages(view, request.pages, request.page_size, request.seed);
  PrintReceived(arrived, arrived * request.page_size, seconds,
                static_cast<double>(done->last_completion_ns - done->first_post_ns) / 1e9,
                verified);
  if (from_server.ignored() > 0) std::printf("%s\n", from_server.Describe().c_str());
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  const char* about =
      "Lesson 03: one-sided RDMA WRITE of scattered pages into remote (GPU) memory. "
      "Without an address: serve, writing the pages each client asks for (one request at a "
      "time). With the server's address: ask for --pages random pages of --page-size bytes, "
      "verify them.";
  if (int rc =
          ParseCommandLine(argc, argv, about, kProgram, kServeOptions | kTransferOptions, options);
      rc >= 0)
    return rc;
  return RunProgram(
      kProgram, [&] { return options.peer.empty() ? ServerMain(options) : ClientMain(options); });
}
