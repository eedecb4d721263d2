// 05_queuing: -FI_EAGAIN as back-pressure, and an application-level pending queue.
//
// In 04 a post that the provider refused (-FI_EAGAIN: its queue is full) was retried on the
// spot, polling until it went through, while every other request waited behind it. Here a
// refused WRITE goes to a pending queue instead, and the queue is drained, oldest first, each
// time completions have freed room in the provider. Posting never spins, the window can be
// as large as the work, and the NIC stays busy: one NIC near line rate. README.md walks
// through it.

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
#include <list>
#include <map>
#include <memory>
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

using namespace common;

namespace {

constexpr const char* kProgram = "05_queuing";
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

// One TRANSFER being served: its source pages, registered, and how far its WRITEs got.
struct Request {
  fi_addr_t client = FI_ADDR_UNSPEC;
  uint64_t number = 0;  // the desk's name for the client, in the log
  wire::RemoteRegion region;
  wire::Transfer transfer;
  PageBuffer source;
  MrPtr mr;
  uint64_t total = 0;  // pages x repeat
  uint64_t posted = 0, completed = 0, failed = 0;
  bool abandoned = false;  // its client left or failed: post no more, free once nothing is out
  Clock::time_point first_post{}, last_completion = Clock::now(), abandoned_at{};
  uint64_t in_flight() const { return posted - completed - failed; }
};

// Fills the request's source pages from its seed and registers them.
std::unique_ptr<Request> PrepareRequest(Network& net, const Desk::Client& client, fi_addr_t dest,
                                        wire::Transfer transfer) {
  const size_t count = transfer.pages.size(), page_size = transfer.page_size;
  const uint64_t total = count * transfer.repeat;
  auto r = std::make_unique<Request>();
  r->client = dest;
  r->number = client.number;
  r->region = client.regions[0];
  r->transfer = std::move(transfer);
  r->source = PageBuffer(count * page_size, net.memory, 0, Pages::kSmall);  // for one request
  r->total = total;
  HostBuffer staging;  // GPU memory is filled here first
  FillPages(r->source, 0, r->transfer.seed, r->transfer.pages, page_size, staging);
  r->mr = net.Register(r->source, FI_WRITE);
  return r;
}

// Posts one prepared WRITE. If the provider's queue is full, or older WRITEs are already
// waiting, it joins the pending queue: order is kept and nothing spins.
void PostOrQueue(Network& net, Op* op, std::deque<Op*>& pending) {
  const Request& r = *op->request;
  if (!pending.empty() ||
      !net.PostWrite(*op, r.client, r.region, op->remote_offset, r.transfer.request_id))
    pending.push_back(op);
}

// Called after each poll: completions have freed room, so the oldest waiting WRITEs go first.
void DrainPending(Network& net, std::deque<Op*>& pending) {
  while (!pending.empty()) {
    Op* op = pending.front();
    const Request& r = *op->request;
    if (!net.PostWrite(*op, r.client, r.region, op->remote_offset, r.transfer.request_id)) return;
    pending.pop_front();
  }
}

// Prepares WRITEs while the window has free Ops, one request after another in turn so that
// each makes progress, and stops as soon as the provider pushes back.
void PostWrites(Network& net, std::list<std::unique_ptr<Request>>& active,
                std::vector<Op*>& free_writes, std::deque<Op*>& pending) {
  bool posted_any = true;
  while (!free_writes.empty() && posted_any && pending.empty()) {
    posted_any = false;
    for (auto& r : active) {
      if (free_writes.empty() || !pending.empty()) return;
      if (r->posted == r->total || r->abandoned) continue;
      const wire::Transfer& t = r->transfer;
      const size_t i = r->posted % t.pages.size();
      Op* op = free_writes.back();
      free_writes.pop_back();
      op->kind = OpKind::kWrite;
      op->buffer = static_cast<uint8_t*>(r->source.nic_data()) + i * t.page_size;
      op->length = t.page_size;
      op->desc = fi_mr_desc(r->mr.get());
      op->request = r.get();
      op->remote_offset = t.pages[i] * t.page_size;
      PostOrQueue(net, op, pending);
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
      r.mr.reset();
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
  Network net = Network::Open(options, {}, ResolveMemory(options.memory));
  PrintHeader("server", net);
  const auto limit =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.timeout_s));

  Mail mail(net, kRecvDepth, kRecvDepth);
  std::list<std::unique_ptr<Request>> active;
  std::deque<Op> write_ops(options.window);  // a deque: it grows without moving its Ops
  std::vector<Op*> free_writes;
  for (auto& op : write_ops) free_writes.push_back(&op);
  std::deque<Op*> pending;  // prepared WRITEs the provider had no room for yet
  // Who is a client and who stops being one (common/reception.hpp, README "The front desk").
  // A client that leaves, or is dropped, stops being written to at once. Its requests are
  // abandoned: WRITEs of theirs the provider still holds are replaced in the window at once,
  // so other clients never wait for them (shm never completes a WRITE to a process that died).
  Desk::Hooks hooks;
  hooks.leaving = [&](fi_addr_t client) {
    for (auto& r : active) {
      if (r->client != client || r->abandoned) continue;
      r->abandoned = true;
      r->abandoned_at = Clock::now();
      std::erase_if(pending, [&](Op* op) {  // never posted: simply free again
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
  // Completions, then the messages waiting to go out; a peer that takes none is lost.
  auto progress = [&] {
    const size_t done = net.PollCompletion(on_done, on_error);
    for (fi_addr_t peer : mail.Flush(limit)) desk.Lost(peer, "does not take our messages");
    return done;
  };
  IdleBackoff backoff;  // an idle loop naps, so that it never takes a core from the link
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
    DrainPending(net, pending);
    const size_t free_before = free_writes.size();
    PostWrites(net, active, free_writes, pending);
    if (completions > 0 || desk.Waiting() || free_writes.size() != free_before)
      backoff.Busy();
    else
      backoff.Idle();
    // One request filled per round: its WRITEs start before the next one's.
    if (auto request = desk.Next()) {
      std::string why = over_limits(request->client, request->transfer);
      try {
        if (why.empty())
          active.push_back(PrepareRequest(net, *desk.Find(request->client), request->client,
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
  net.ep.reset();  // WRITEs still in the provider end with the endpoint, before their pages go
  return kExitOk;
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

int ClientMain(const Options& options) {
  InstallStopHandlers(kProgram);  // Ctrl-C or SIGTERM: BYE, then exit (SayByeAndStop)
  const std::vector<uint8_t> peer = FromHex(options.peer);
  CheckClientOptions(options);
  const auto began = Clock::now();
  Network net = Network::Open(options, peer, ResolveMemory(options.memory));
  fi_addr_t server = net.AddPeerAddress(peer);
  PrintHeader("client", net);
  const auto limit =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.timeout_s));

  // The region has room for twice the pages asked for, so the chosen pages are scattered;
  // each request gets its own share of them.
  const uint64_t total_pages = options.pages * options.requests;
  const uint64_t region_pages = 2 * total_pages;
  PageBuffer region(region_pages * options.page_size, net.memory);
  MrPtr region_mr = net.Register(region, FI_REMOTE_WRITE);
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
    if (net.PollCompletion(on_done, on_error) > 0) {
      last_progress = Clock::now();
      backoff.Busy();
    } else {
      backoff.Idle();
    }
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
  summary.link_gbps = options.link_gbps > 0 ? options.link_gbps : LinkGbps(*net.info);
  summary.verified_bytes = verified;
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
      "Lesson 05: a pending queue turns -FI_EAGAIN into back-pressure. Without an "
      "address: serve, queueing WRITEs the provider has no room for. With the server's "
      "address: send --requests requests of --pages random pages each, verify.";
  if (int rc = ParseCommandLine(argc, argv, about, kProgram,
                                kServeOptions | kTransferOptions | kWindowOptions, options);
      rc >= 0)
    return rc;
  return RunProgram(
      kProgram, [&] { return options.peer.empty() ? ServerMain(options) : ClientMain(options); });
}
