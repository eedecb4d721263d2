// 03_gpudirect_write: one-sided RDMA WRITE of scattered pages into remote (GPU) memory.
//
// The client registers a region of memory (GPU memory where there is a GPU) for remote
// write and sends CONNECT with the region's address and key, then a TRANSFER request naming
// random pages of that region. The server fills its source pages from the request's seed and
// WRITEs each one straight into the client's region; the client's CPU copies nothing. Each
// WRITE carries immediate data naming the request, so the client counts completions until
// every page has arrived, and then checks every byte. The walkthrough is in README.md.

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

using namespace common;

namespace {

constexpr const char* kProgram = "03_gpudirect_write";
constexpr size_t kMessageBytes = wire::kMaxMessageBytes;  // every message buffer has this size
constexpr size_t kRecvDepth = 8;                          // receives each side keeps posted
constexpr size_t kCqBatch = 16;                           // completions read per fi_cq_read

using Clock = std::chrono::steady_clock;

// One posted operation. libfabric hands `context` back in the completion (FI_CONTEXT2 mode
// reserves it for the provider), and from it we find the whole Op again.
enum class OpKind { kRecv, kSend, kWrite };

struct Op {
  fi_context2 context{};
  OpKind kind = OpKind::kRecv;
  uint8_t* buffer = nullptr;
  size_t length = 0;
  void* desc = nullptr;  // local descriptor of the registered buffer (FI_MR_LOCAL)
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

// Writes every page of one request into the client's region, `repeat` times over.
void ServeTransfer(Network& net, PageBuffer::Path path, const Client& client, fi_addr_t dest,
                   const wire::Transfer& request, uint64_t& writes_done,
                   const std::function<void()>& progress) {
  const size_t count = request.pages.size(), page_size = request.page_size;
  PageBuffer source(count * page_size, path);
  HostBuffer page(page_size);
  for (size_t i = 0; i < count; ++i) {
    FillPage({page.data(), page_size}, request.seed, request.pages[i]);
    source.Write(i * page_size, {page.data(), page_size});
  }
  source.SyncToNic();
  MrPtr mr = net.RegisterMemory(source.nic_data(), source.size(), FI_WRITE,
                                path == PageBuffer::Path::kGpuDirect ? &source.gpu() : nullptr);
  std::vector<Op> writes(count);
  for (size_t i = 0; i < count; ++i) {
    writes[i].buffer = static_cast<uint8_t*>(source.nic_data()) + i * page_size;
    writes[i].length = page_size;
    writes[i].desc = fi_mr_desc(mr.get());
  }
  for (uint64_t round = 0; round < request.repeat; ++round) {
    writes_done = 0;
    for (size_t i = 0; i < count; ++i) {
      while (!net.PostWrite(writes[i], dest, client.region, request.pages[i] * page_size,
                            request.request_id))
        progress();
    }
    while (writes_done < count) progress();  // every Op is busy until its WRITE completes
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
  uint64_t writes_done = 0, served = 0;
  auto on_done = [&](Op* op, const fi_cq_data_entry& done, fi_addr_t source) {
    if (op == nullptr) return;  // the server receives no remote writes
    if (op->kind == OpKind::kSend) mail.free_sends.push_back(op);
    if (op->kind == OpKind::kWrite) ++writes_done;
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
        ServeTransfer(net, path, clients[m.source], m.source, *transfer, writes_done, progress);
        std::printf("client %llu: request %u: wrote %zu pages of %llu bytes, %llu times\n", name,
                    transfer->request_id, transfer->pages.size(),
                    static_cast<unsigned long long>(transfer->page_size),
                    static_cast<unsigned long long>(transfer->repeat));
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
}

int ClientMain(const Options& options) {
  const std::vector<uint8_t> peer = FromHex(options.peer);
  CheckRequestSize(options);
  const MemoryKind memory = ResolveMemory(options.memory);
  Network net = Network::Open(options, peer, memory == MemoryKind::kCuda);
  fi_addr_t server = net.AddPeerAddress(peer);
  const PageBuffer::Path path = ChoosePath(net, memory);
  PrintHeader("client", net, path);

  // The region has room for twice the pages asked for, so the chosen pages are scattered.
  const uint64_t region_pages = 2 * options.pages;
  PageBuffer region(region_pages * options.page_size, path);
  MrPtr region_mr =
      net.RegisterMemory(region.nic_data(), region.size(), FI_REMOTE_WRITE,
                         path == PageBuffer::Path::kGpuDirect ? &region.gpu() : nullptr);
  Mailbox mail(net, 3);

  wire::Transfer request;
  request.request_id = 1;
  request.seed = options.seed;
  request.page_size = options.page_size;
  request.repeat = options.repeat;
  request.pages = SamplePages(options.seed, options.pages, region_pages);
  if (options.test_bad_page) request.pages.back() = static_cast<uint32_t>(region_pages);

  const uint64_t expected = request.pages.size() * request.repeat;
  uint64_t arrived = 0;
  size_t sends_done = 0;
  std::string refused;
  bool accepted = false;
  const auto idle_limit = std::chrono::duration<double>(options.timeout_s);
  auto last_progress = Clock::now();
  auto on_done = [&](Op* op, const fi_cq_data_entry& done, fi_addr_t) {
    if (op == nullptr) {  // a remote WRITE landed in our region
      if (done.data != request.request_id)
        throw Error("a WRITE arrived for unknown request " + std::to_string(done.data));
      ++arrived;  // never assume the last WRITE lands last: count them
    } else if (op->kind == OpKind::kSend) {
      mail.free_sends.push_back(op);
      ++sends_done;
    } else if (op->kind == OpKind::kRecv) {
      wire::Message message = wire::Decode({op->buffer, done.len});
      net.PostRecv(*op);
      if (std::holds_alternative<wire::Accept>(message)) {
        accepted = true;
      } else if (auto* error = std::get_if<wire::ErrorReply>(&message)) {
        refused = error->text;
      } else {
        throw Error("unexpected message from the server");
      }
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
  const auto start = Clock::now();
  SendMessage(net, mail, server, request, progress);
  while (arrived < expected && refused.empty()) progress();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  SendMessage(net, mail, server, wire::Bye{}, progress);
  while (sends_done < 3) progress();
  if (!refused.empty()) throw Error("the server refused the request: " + refused);

  region.SyncFromNic();
  std::span<uint8_t> view = region.HostView();
  if (options.test_corrupt) view[request.pages[0] * request.page_size + 1] ^= 0x5a;
  const uint64_t verified = VerifyPages(view, request);
  std::printf("received %llu WRITEs (%llu bytes) in %.3f s; verified %llu bytes\n",
              static_cast<unsigned long long>(arrived),
              static_cast<unsigned long long>(arrived * request.page_size), seconds,
              static_cast<unsigned long long>(verified));
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{
      "Lesson 03: one-sided RDMA WRITE of scattered pages into remote (GPU) memory. "
      "Without an address: serve, writing the pages each client asks for. With the "
      "server's address: ask for --pages random pages of --page-size bytes, verify them.",
      kProgram};
  AddOptions(app, options, kServeOptions | kTransferOptions);
  if (int rc = ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  return RunProgram(
      kProgram, [&] { return options.peer.empty() ? ServerMain(options) : ClientMain(options); });
}
