// 04_concurrent: many WRITEs and many requests in flight.
//
// 03 posted one request's WRITEs and then waited for all of them. Here the client sends
// several TRANSFER requests at once, and the server keeps up to a window of WRITEs in flight
// across all of them, posting a new WRITE as each one completes, so the NIC never waits for
// the CPU. The client counts completions per request (the immediate data names it) and ends
// with a summary: bytes, seconds, Gbps, % of the link, Mpps. The walkthrough is in README.md.

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

using namespace common;

namespace {

constexpr const char* kProgram = "04_concurrent";
constexpr size_t kMessageBytes = wire::kMaxMessageBytes;  // every message buffer has this size
constexpr size_t kRecvDepth = 8;                          // receives each side keeps posted
constexpr size_t kCqBatch = 16;                           // completions read per fi_cq_read
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
  void* desc = nullptr;        // local descriptor of the registered buffer (FI_MR_LOCAL)
  Request* request = nullptr;  // the request a WRITE belongs to
};

Op* OpOf(void* context) {
  return reinterpret_cast<Op*>(context);
}

class Network {
 public:
  static Network Open(const Options& options, std::span<const uint8_t> peer, bool gpu_memory);
  std::vector<uint8_t> Address() const;
  fi_addr_t AddPeerAddress(std::span<const uint8_t> address);
  MrPtr RegisterMemory(void* data, size_t size, uint64_t access, const CudaBuffer* gpu = nullptr);
  bool TakesCudaMemory();
  wire::RemoteRegion Advertise(fid_mr* mr, const void* data, size_t size) const;
  void PostRecv(Op& op);
  bool PostSend(Op& op, fi_addr_t dest);
  bool PostWrite(Op& op, fi_addr_t dest, const wire::RemoteRegion& region, uint64_t offset,
                 uint32_t immediate);
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
};

Network Network::Open(const Options& options, std::span<const uint8_t> peer, bool gpu_memory) {
  FiInfoPtr hints(fi_allocinfo());
  hints->ep_attr->type = FI_EP_RDM;           // reliable, unconnected: one endpoint talks to many
  hints->caps = FI_MSG | FI_SOURCE | FI_RMA;  // FI_SOURCE: completions name the sender
  if (gpu_memory) hints->caps |= FI_HMEM;     // ask for providers that can take GPU memory
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  // The memory-registration modes this program honours; efa asks for all of them.
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_HMEM;

  Network net;
  try {
    net.info = SelectProvider(*hints, options.provider, options.domain, peer);
  } catch (const UsageError&) {
    if (!gpu_memory) throw;
    hints->caps &= ~FI_HMEM;  // no HMEM provider: we will stage through host memory
    net.info = SelectProvider(*hints, options.provider, options.domain, peer);
  }
  fid_fabric* fabric = nullptr;
  FI_CHECK(fi_fabric(net.info->fabric_attr, &fabric, nullptr));
  net.fabric.reset(fabric);
  fid_domain* domain = nullptr;
  FI_CHECK(fi_domain(net.fabric.get(), net.info.get(), &domain, nullptr));
  net.domain.reset(domain);

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
bool Network::PostWrite(Op& op, fi_addr_t dest, const wire::RemoteRegion& region, uint64_t offset,
                        uint32_t immediate) {
  op.kind = OpKind::kWrite;
  ssize_t rc = fi_writedata(ep.get(), op.buffer, op.length, op.desc, immediate, dest,
                            region.address + offset, region.key, &op.context);
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

void PrintHeader(const char* role, const Network& net, PageBuffer::Path path) {
  std::printf("%s %s: provider %s, domain %s, pages in %s\n", kProgram, role,
              net.info->fabric_attr->prov_name, net.info->domain_attr->name, PathName(path));
  std::fflush(stdout);
}

// What the server keeps for each connected client.
struct Client {
  wire::RemoteRegion region;
};

struct Received {
  std::vector<uint8_t> bytes;
  fi_addr_t source;
};

// One TRANSFER being served: its source pages, registered, and how far its WRITEs got.
struct Request {
  fi_addr_t dest = FI_ADDR_UNSPEC;
  wire::RemoteRegion region;
  wire::Transfer transfer;
  PageBuffer source;
  MrPtr mr;
  uint64_t total = 0;  // pages x repeat
  uint64_t posted = 0;
  uint64_t completed = 0;
};

// Fills the request's source pages from its seed and registers them.
std::unique_ptr<Request> PrepareRequest(Network& net, PageBuffer::Path path, const Client& client,
                                        fi_addr_t dest, wire::Transfer transfer) {
  const size_t count = transfer.pages.size(), page_size = transfer.page_size;
  const uint64_t total = count * transfer.repeat;
  auto r =
      std::make_unique<Request>(Request{dest, client.region, std::move(transfer),
                                        PageBuffer(count * page_size, path), nullptr, total, 0, 0});
  HostBuffer page(page_size);
  for (size_t i = 0; i < count; ++i) {
    FillPage({page.data(), page_size}, r->transfer.seed, r->transfer.pages[i]);
    r->source.Write(i * page_size, {page.data(), page_size});
  }
  r->source.SyncToNic();
  r->mr = net.RegisterMemory(r->source.nic_data(), r->source.size(), FI_WRITE,
                             path == PageBuffer::Path::kGpuDirect ? &r->source.gpu() : nullptr);
  return r;
}

// Posts WRITEs while the window has free Ops, one request after another in turn so that
// each makes progress. A post refused with -FI_EAGAIN is retried after a poll, as in 03.
void PostWrites(Network& net, std::list<std::unique_ptr<Request>>& active,
                std::vector<Op*>& free_writes, const std::function<void()>& progress) {
  bool posted_any = true;
  while (!free_writes.empty() && posted_any) {
    posted_any = false;
    for (auto& r : active) {
      if (free_writes.empty()) return;
      if (r->posted == r->total) continue;
      const wire::Transfer& t = r->transfer;
      const size_t i = r->posted % t.pages.size();
      Op* op = free_writes.back();
      op->buffer = static_cast<uint8_t*>(r->source.nic_data()) + i * t.page_size;
      op->length = t.page_size;
      op->desc = fi_mr_desc(r->mr.get());
      op->request = r.get();
      free_writes.pop_back();
      while (!net.PostWrite(*op, r->dest, r->region, t.pages[i] * t.page_size, t.request_id))
        progress();
      ++r->posted;
      posted_any = true;
    }
  }
}

int ServerMain(const Options& options) {
  InstallStopHandlers();
  const MemoryKind memory = ResolveMemory(options.memory);
  Network net = Network::Open(options, {}, memory == MemoryKind::kCuda);
  const PageBuffer::Path path = ChoosePath(net, memory);
  PrintHeader("server", net, path);
  PublishAddress(net.Address(), options.address_file);

  Mailbox mail(net, kRecvDepth);
  std::map<fi_addr_t, Client> clients;
  std::deque<Received> inbox;
  std::list<std::unique_ptr<Request>> active;
  std::vector<Op> write_ops(options.window);
  std::vector<Op*> free_writes;
  for (auto& op : write_ops) free_writes.push_back(&op);
  uint64_t served = 0;
  auto on_done = [&](Op* op, const fi_cq_data_entry& done, fi_addr_t source) {
    if (op == nullptr) return;  // the server receives no remote writes
    if (op->kind == OpKind::kSend) mail.free_sends.push_back(op);
    if (op->kind == OpKind::kWrite) {
      ++op->request->completed;
      free_writes.push_back(op);
    }
    if (op->kind != OpKind::kRecv) return;
    // Handled later by the main loop, so a message never interrupts a transfer half-way.
    inbox.push_back({{op->buffer, op->buffer + done.len}, source});
    net.PostRecv(*op);
  };
  auto progress = [&] { net.PollCompletion(on_done); };
  auto refuse = [&](fi_addr_t dest, uint32_t request_id, const std::string& why) {
    std::printf("client %llu: refused: %s\n", static_cast<unsigned long long>(dest), why.c_str());
    SendMessage(net, mail, dest, wire::ErrorReply{request_id, why}, progress);
  };

  while (!StopRequested() && (options.max_clients == 0 || served < options.max_clients)) {
    progress();
    for (auto it = active.begin(); it != active.end();) {
      const Request& r = **it;
      if (r.completed < r.total) {
        ++it;
        continue;
      }
      std::printf("client %llu: request %u: wrote %zu pages of %llu bytes, %llu times\n",
                  static_cast<unsigned long long>(r.dest), r.transfer.request_id,
                  r.transfer.pages.size(), static_cast<unsigned long long>(r.transfer.page_size),
                  static_cast<unsigned long long>(r.transfer.repeat));
      it = active.erase(it);
    }
    PostWrites(net, active, free_writes, progress);
    while (!inbox.empty()) {
      Received m = std::move(inbox.front());
      inbox.pop_front();
      const auto name = static_cast<unsigned long long>(m.source);
      const bool known = m.source != FI_ADDR_NOTAVAIL && clients.count(m.source);
      wire::Message message;
      try {
        message = wire::Decode(m.bytes);
      } catch (const wire::ProtocolError& e) {
        if (known)
          refuse(m.source, 0, e.what());
        else
          std::printf("dropped a message: %s\n", e.what());
        continue;
      }
      if (auto* connect = std::get_if<wire::Connect>(&message)) {
        fi_addr_t client = net.AddPeerAddress(connect->lanes[0].address);
        clients[client] = Client{connect->lanes[0].region};
        std::printf("client %llu connected: region of %llu bytes\n",
                    static_cast<unsigned long long>(client),
                    static_cast<unsigned long long>(connect->lanes[0].region.length));
        SendMessage(net, mail, client, wire::Accept{}, progress);
      } else if (!known) {
        std::printf("dropped a message from a sender that did not CONNECT\n");
      } else if (auto* transfer = std::get_if<wire::Transfer>(&message)) {
        try {
          wire::ValidateTransfer(*transfer, clients[m.source].region);
        } catch (const wire::ProtocolError& e) {
          refuse(m.source, transfer->request_id, e.what());
          continue;
        }
        active.push_back(
            PrepareRequest(net, path, clients[m.source], m.source, std::move(*transfer)));
      } else if (std::holds_alternative<wire::Bye>(message)) {
        std::printf("client %llu done\n", name);
        clients.erase(m.source);
        fi_av_remove(net.av.get(), &m.source, 1, 0);
        ++served;
      } else {
        refuse(m.source, 0, "unexpected message type");
      }
      std::fflush(stdout);
    }
  }
  std::printf("served %llu clients\n", static_cast<unsigned long long>(served));
  return kExitOk;
}

// Checks every requested page against the seed's data; throws naming the first bad byte.
uint64_t VerifyPages(std::span<const uint8_t> region, const wire::Transfer& request) {
  for (size_t i = 0; i < request.pages.size(); ++i) {
    const uint64_t at = request.pages[i] * request.page_size;
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
  if (options.window == 0) throw UsageError("invalid --window 0");
}

int ClientMain(const Options& options) {
  const std::vector<uint8_t> peer = FromHex(options.peer);
  CheckRequestSize(options);
  const MemoryKind memory = ResolveMemory(options.memory);
  Network net = Network::Open(options, peer, memory == MemoryKind::kCuda);
  fi_addr_t server = net.AddPeerAddress(peer);
  const PageBuffer::Path path = ChoosePath(net, memory);
  PrintHeader("client", net, path);

  // The region has room for twice the pages asked for, so the chosen pages are scattered;
  // each request gets its own share of them.
  const uint64_t total_pages = options.pages * options.requests;
  const uint64_t region_pages = 2 * total_pages;
  PageBuffer region(region_pages * options.page_size, path);
  MrPtr region_mr =
      net.RegisterMemory(region.nic_data(), region.size(), FI_REMOTE_WRITE,
                         path == PageBuffer::Path::kGpuDirect ? &region.gpu() : nullptr);
  Mailbox mail(net, options.requests + 2);

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

  uint64_t expected = total_pages * options.repeat;    // less what the server refuses
  std::vector<uint64_t> arrived(requests.size() + 1);  // per request id
  uint64_t arrived_total = 0;
  // The clock runs from the first WRITE's arrival to the last: it times the network, not the
  // server filling its source pages before it starts.
  Clock::time_point first_arrival, last_arrival;
  size_t sends_done = 0;
  std::string refused;
  bool accepted = false;
  const auto idle_limit = std::chrono::duration<double>(options.timeout_s);
  auto last_progress = Clock::now();
  auto on_done = [&](Op* op, const fi_cq_data_entry& done, fi_addr_t) {
    if (op == nullptr) {  // a remote WRITE landed in our region
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
      if (refused.empty())
        refused = "request " + std::to_string(error->request_id) + ": " + error->text;
      // The other requests are still being written: wait for them before saying BYE.
      if (error->request_id >= 1 && error->request_id <= requests.size())
        expected -= requests[error->request_id - 1].pages.size() * options.repeat;
    }
  };
  auto progress = [&] {
    if (net.PollCompletion(on_done) > 0) last_progress = Clock::now();
    if (Clock::now() - last_progress > idle_limit)
      throw Error("no answer from the server within " + std::to_string(options.timeout_s) +
                  " s (is it running at that address?)");
  };

  wire::Connect connect;
  connect.lanes.push_back(
      {net.Address(), net.Advertise(region_mr.get(), region.nic_data(), region.size())});
  SendMessage(net, mail, server, connect, progress);
  while (!accepted && refused.empty()) progress();  // our address is in the server's AV now
  for (const auto& request : requests) SendMessage(net, mail, server, request, progress);
  while (arrived_total < expected) progress();
  const double seconds = std::chrono::duration<double>(last_arrival - first_arrival).count();
  SendMessage(net, mail, server, wire::Bye{}, progress);
  while (sends_done < requests.size() + 2) progress();
  if (!refused.empty()) throw Error("the server refused " + refused);
  for (size_t r = 1; r < arrived.size() && refused.empty(); ++r) {
    if (arrived[r] != requests[r - 1].pages.size() * options.repeat)
      throw Error("request " + std::to_string(r) + " received " + std::to_string(arrived[r]) +
                  " WRITEs");
  }

  region.SyncFromNic();
  std::span<uint8_t> view = region.HostView();
  if (options.test_corrupt) view[requests[0].pages[0] * options.page_size + 1] ^= 0x5a;
  uint64_t verified = 0;
  for (const auto& request : requests) verified += VerifyPages(view, request);

  Summary summary;
  summary.bytes = (arrived_total - 1) * options.page_size;  // what arrived after the clock started
  summary.writes = arrived_total - 1;
  summary.seconds = seconds;
  summary.link_gbps = options.link_gbps > 0 ? options.link_gbps : LinkGbps(*net.info);
  summary.verified_bytes = verified;
  PrintSummary(summary, options.json);
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{
      "Lesson 04: many WRITEs and many requests in flight, and a throughput summary. "
      "Without an address: serve, keeping up to --window WRITEs in flight. With the "
      "server's address: send --requests requests of --pages random pages each, verify.",
      kProgram};
  AddOptions(app, options, kServeOptions | kTransferOptions | kWindowOptions);
  if (int rc = ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  return RunProgram(
      kProgram, [&] { return options.peer.empty() ? ServerMain(options) : ClientMain(options); });
}
