// 01_send_recv: the smallest libfabric program that moves bytes between two processes.
//
// The server opens a fabric, a domain, a completion queue (CQ), an address vector (AV) and a
// reliable-datagram endpoint, prints its address and keeps receive buffers posted; every
// message that lands is printed. The client inserts the server's address into its AV and
// SENDs one message. Both sides learn of finished operations by polling the CQ.
// The walkthrough is in README.md.

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "address.hpp"
#include "backoff.hpp"
#include "error.hpp"
#include "fabric_handles.hpp"
#include "host_buffer.hpp"
#include "options.hpp"
#include "program.hpp"
#include "provider.hpp"
#include "text.hpp"

using namespace common;

namespace {

constexpr const char* kProgram = "01_send_recv";
constexpr size_t kMessageBytes = 4096;  // every message buffer has this size
constexpr size_t kRecvDepth = 8;        // receives the server keeps posted
constexpr size_t kCqBatch = 16;         // completions read per fi_cq_read

using Clock = std::chrono::steady_clock;

// One posted operation. libfabric hands `context` back in the completion (FI_CONTEXT2 mode
// reserves it for the provider), and from it we find the whole Op again.
enum class OpKind { kRecv, kSend };

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
  static Network Open(const Options& options, std::span<const uint8_t> peer);
  std::vector<uint8_t> Address() const;
  fi_addr_t AddPeerAddress(std::span<const uint8_t> address);
  MrPtr RegisterMemory(void* data, size_t size, uint64_t access);
  void PostRecv(Op& op);
  bool PostSend(Op& op, fi_addr_t dest);
  size_t PollCompletion(const std::function<void(Op&, const fi_cq_data_entry&)>& on_done,
                        const std::function<void(Op*, const std::string&)>& on_error);

  // Declared in creation order, so they are closed in reverse.
  FiInfoPtr info;
  FabricPtr fabric;
  DomainPtr domain;
  CqPtr cq;
  AvPtr av;
  EpPtr ep;
  // A loop that only waits (a server without clients) must not hold a core: each poll that
  // finds nothing makes the next one a little later.
  IdleBackoff idle;
};

Network Network::Open(const Options& options, std::span<const uint8_t> peer) {
  FiInfoPtr hints(fi_allocinfo());
  hints->ep_attr->type = FI_EP_RDM;  // reliable, unconnected: one endpoint talks to many
  hints->caps = FI_MSG;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  // The memory-registration modes this program honours; a provider may ask for any of them
  // (efa-direct asks for all four, FI_MR_LOCAL among them: register every buffer and pass its
  // descriptor; libfabric 2.x's efa fabric asks for all but FI_MR_LOCAL).
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;

  Network net;
  net.info = SelectProvider(*hints, options, peer);
  fid_fabric* fabric = nullptr;
  FI_CHECK(fi_fabric(net.info->fabric_attr, &fabric, nullptr));
  net.fabric.reset(fabric);
  fid_domain* domain = nullptr;
  FI_CHECK(fi_domain(net.fabric.get(), net.info.get(), &domain, nullptr));
  net.domain.reset(domain);

  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.wait_obj = FI_WAIT_NONE;  // we poll
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
  CheckAddress(address, *info);  // a peer's address has this provider's shape, or is refused
  fi_addr_t addr = FI_ADDR_UNSPEC;
  int inserted = fi_av_insert(av.get(), address.data(), 1, &addr, 0, nullptr);
  if (inserted != 1) throw Error("fi_av_insert: the peer address was not accepted");
  return addr;
}

MrPtr Network::RegisterMemory(void* data, size_t size, uint64_t access) {
  fi_mr_attr attr{};
  iovec iov{data, size};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = access;
  fid_mr* mr = nullptr;
  FI_CHECK(fi_mr_regattr(domain.get(), &attr, 0, &mr));
  return MrPtr(mr);
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

// Reads finished operations: on_done for each one, on_error for one that failed, with
// libfabric's words for it. A failed operation is news about that operation (a message too
// long for our buffer, a peer gone), not the end of the program: the caller decides.
size_t Network::PollCompletion(const std::function<void(Op&, const fi_cq_data_entry&)>& on_done,
                               const std::function<void(Op*, const std::string&)>& on_error) {
  fi_cq_data_entry entries[kCqBatch];
  ssize_t n = fi_cq_read(cq.get(), entries, kCqBatch);
  if (n == -FI_EAGAIN) {
    idle.Idle();  // nothing yet: yield a little, then nap (common/backoff.hpp)
    return 0;
  }
  idle.Busy();
  if (n == -FI_EAVAIL) {
    fi_cq_err_entry err{};
    FI_CHECK(fi_cq_readerr(cq.get(), &err, 0));
    char detail[256] = "";
    fi_cq_strerror(cq.get(), err.prov_errno, err.err_data, detail, sizeof(detail));
    on_error(OpOf(err.op_context), std::string(fi_strerror(err.err)) + " (" + detail + ")");
    return 1;
  }
  FI_CHECK(n);
  for (ssize_t i = 0; i < n; ++i) on_done(*OpOf(entries[i].op_context), entries[i]);
  return static_cast<size_t>(n);
}

int ServerMain(const Options& options) {
  InstallStopHandlers(kProgram);
  Network net = Network::Open(options, {});
  std::printf("provider: %s, domain: %s\n", net.info->fabric_attr->prov_name,
              net.info->domain_attr->name);
  PublishAddress(net.Address(), options);

  HostBuffer buffers(kRecvDepth * kMessageBytes);
  MrPtr mr = net.RegisterMemory(buffers.data(), buffers.size(), FI_RECV);
  std::vector<Op> recvs(kRecvDepth);
  for (size_t i = 0; i < kRecvDepth; ++i) {
    recvs[i].buffer = buffers.data() + i * kMessageBytes;
    recvs[i].desc = fi_mr_desc(mr.get());
    net.PostRecv(recvs[i]);
  }

  uint64_t served = 0;
  auto on_done = [&](Op& op, const fi_cq_data_entry& done) {
    std::string text(reinterpret_cast<const char*>(op.buffer), done.len);
    std::printf("received %zu bytes: %s\n", done.len, text.c_str());
    std::fflush(stdout);
    ++served;
    net.PostRecv(op);  // hand the buffer back before the next message needs it
  };
  // A message longer than our buffers arrives as a truncation error: say so, and keep the
  // receive posted. Whatever a peer sends, the server keeps serving.
  auto on_error = [&](Op* op, const std::string& error) {
    Diagnostic("dropped a message: %s\n", error.c_str());
    std::fflush(stdout);
    if (op != nullptr) net.PostRecv(*op);
  };
  while (!StopRequested() && (options.exit_after == 0 || served < options.exit_after))
    net.PollCompletion(on_done, on_error);
  std::printf("served %s\n", Plural(served, "client").c_str());
  return kExitOk;
}

int ClientMain(const Options& options) {
  const std::vector<uint8_t> peer = FromHex(options.peer);
  if (options.text.size() > kMessageBytes)
    throw UsageError("message of " + std::to_string(options.text.size()) +
                     " bytes is longer than " + std::to_string(kMessageBytes));
  Network net = Network::Open(options, peer);
  fi_addr_t server = net.AddPeerAddress(peer);

  HostBuffer buffer(kMessageBytes);
  MrPtr mr = net.RegisterMemory(buffer.data(), buffer.size(), FI_SEND);
  std::memcpy(buffer.data(), options.text.data(), options.text.size());
  Op send;
  send.buffer = buffer.data();
  send.length = options.text.size();
  send.desc = fi_mr_desc(mr.get());

  const auto deadline = Clock::now() + std::chrono::duration<double>(options.timeout_s);
  bool sent = false;
  auto on_done = [&](Op& op, const fi_cq_data_entry&) { sent = sent || &op == &send; };
  auto on_error = [&](Op*, const std::string& error) { throw Error("SEND failed: " + error); };
  while (!net.PostSend(send, server)) {
    net.PollCompletion(on_done, on_error);
    if (Clock::now() > deadline) throw Error("no answer from the server (timed out)");
  }
  while (!sent) {
    net.PollCompletion(on_done, on_error);
    if (Clock::now() > deadline)
      throw Error("no answer from the server within " + FormatSeconds(options.timeout_s) +
                  " (is it running at that address?)");
  }
  std::printf("sent %zu bytes: %s\n", send.length, options.text.c_str());
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  const char* about =
      "Lesson 01: one-way SEND over libfabric. Without an address: serve and print "
      "every message. With the server's address: send TEXT to it.";
  if (int rc = ParseCommandLine(argc, argv, about, kProgram, kServeOptions | kTextOptions, options);
      rc >= 0)
    return rc;
  return RunProgram(
      kProgram, [&] { return options.peer.empty() ? ServerMain(options) : ClientMain(options); });
}
