// 02_bidirectional: request and response.
//
// Both sides keep receives posted. The client SENDs CONNECT with its own address; the server
// inserts that address into its AV, and from then on the provider tells it who sent each
// message (FI_SOURCE). The server answers every TEXT with the text reversed; the client
// prints the answer and says BYE. The walkthrough is in README.md.

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

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
#include "backoff.hpp"
#include "error.hpp"
#include "fabric_handles.hpp"
#include "host_buffer.hpp"
#include "options.hpp"
#include "program.hpp"
#include "provider.hpp"

using namespace common;

namespace {

constexpr const char* kProgram = "02_bidirectional";
constexpr size_t kMessageBytes = 4096;  // every message buffer has this size
constexpr size_t kRecvDepth = 8;        // receives each side keeps posted
constexpr size_t kCqBatch = 16;         // completions read per fi_cq_read

using Clock = std::chrono::steady_clock;

// Every message starts with this header; `length` counts the bytes after it.
enum class MessageType : uint32_t { kConnect = 1, kText = 2, kReply = 3, kBye = 4, kAccept = 5 };

struct MessageHeader {
  MessageType type;
  uint32_t length;
};

// One posted operation. libfabric hands `context` back in the completion (FI_CONTEXT2 mode
// reserves it for the provider), and from it we find the whole Op again.
enum class OpKind { kRecv, kSend };

struct Op {
  fi_context2 context{};
  OpKind kind = OpKind::kRecv;
  uint8_t* buffer = nullptr;
  size_t length = 0;
  void* desc = nullptr;             // local descriptor of the registered buffer (FI_MR_LOCAL)
  fi_addr_t peer = FI_ADDR_UNSPEC;  // where a SEND goes: whom its failure concerns
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
  size_t PollCompletion(const std::function<void(Op&, const fi_cq_data_entry&, fi_addr_t)>& on_done,
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
  hints->caps = FI_MSG | FI_SOURCE;  // FI_SOURCE: completions name the sender
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  // The memory-registration modes this program honours; efa-direct asks for all of them.
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
  op.peer = dest;
  ssize_t rc = fi_send(ep.get(), op.buffer, op.length, op.desc, dest, &op.context);
  if (rc == -FI_EAGAIN) return false;
  FI_CHECK(rc);
  return true;
}

// Reads finished operations: on_done for each one, on_error for one that failed.
size_t Network::PollCompletion(
    const std::function<void(Op&, const fi_cq_data_entry&, fi_addr_t)>& on_done,
    const std::function<void(Op*, const std::string&)>& on_error) {
  fi_cq_data_entry entries[kCqBatch];
  fi_addr_t sources[kCqBatch];  // the sender's AV entry, or FI_ADDR_NOTAVAIL if not inserted
  ssize_t n = fi_cq_readfrom(cq.get(), entries, kCqBatch, sources);
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
  for (ssize_t i = 0; i < n; ++i) on_done(*OpOf(entries[i].op_context), entries[i], sources[i]);
  return static_cast<size_t>(n);
}

// Writes a message into a free send buffer and SENDs it, polling while none is free or the
// queue is full, for at most `limit`. False when it gave up: a peer that does not take our
// messages is dropped, never waited for.
bool SendMessage(Network& net, std::vector<Op*>& free_sends, fi_addr_t dest, MessageType type,
                 std::span<const uint8_t> payload, const std::function<void()>& progress,
                 Clock::duration limit) {
  const auto deadline = Clock::now() + limit;
  while (free_sends.empty()) {
    if (Clock::now() > deadline) return false;
    progress();
  }
  Op& op = *free_sends.back();
  free_sends.pop_back();
  MessageHeader header{type, static_cast<uint32_t>(payload.size())};
  std::memcpy(op.buffer, &header, sizeof(header));
  std::memcpy(op.buffer + sizeof(header), payload.data(), payload.size());
  op.length = sizeof(header) + payload.size();
  while (!net.PostSend(op, dest)) {
    if (Clock::now() > deadline) {
      free_sends.push_back(&op);  // never posted: free again
      return false;
    }
    progress();
  }
  return true;
}

struct Received {
  std::vector<uint8_t> bytes;
  fi_addr_t source;
};

int ServerMain(const Options& options) {
  InstallStopHandlers(kProgram);
  Network net = Network::Open(options, {});
  std::printf("provider: %s, domain: %s\n", net.info->fabric_attr->prov_name,
              net.info->domain_attr->name);
  PublishAddress(net.Address(), options.address_file);
  const auto limit =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.timeout_s));

  // Receive buffers first, then one send buffer per receive.
  HostBuffer buffers(2 * kRecvDepth * kMessageBytes);
  MrPtr mr = net.RegisterMemory(buffers.data(), buffers.size(), FI_RECV | FI_SEND);
  std::vector<Op> recvs(kRecvDepth), sends(kRecvDepth);
  std::vector<Op*> free_sends;
  for (size_t i = 0; i < kRecvDepth; ++i) {
    recvs[i].buffer = buffers.data() + i * kMessageBytes;
    recvs[i].desc = fi_mr_desc(mr.get());
    net.PostRecv(recvs[i]);
    sends[i].buffer = buffers.data() + (kRecvDepth + i) * kMessageBytes;
    sends[i].desc = fi_mr_desc(mr.get());
    free_sends.push_back(&sends[i]);
  }

  // The completion callback only collects messages; the main loop answers them. Answering
  // from inside the callback would poll (to wait for a send buffer) inside a poll.
  uint64_t served = 0;
  std::deque<Received> inbox;
  auto on_done = [&](Op& op, const fi_cq_data_entry& done, fi_addr_t source) {
    if (op.kind == OpKind::kSend) {
      free_sends.push_back(&op);
      return;
    }
    inbox.push_back({{op.buffer, op.buffer + done.len}, source});
    net.PostRecv(op);  // hand the buffer back before the next message needs it
  };
  // A failure concerns one message or one peer: say so, and keep serving.
  auto on_error = [&](Op* op, const std::string& error) {
    if (op != nullptr && op->kind == OpKind::kRecv) {
      std::printf("dropped a message: %s\n", error.c_str());
      net.PostRecv(*op);
    } else if (op != nullptr) {
      std::printf("client %llu: a SEND failed: %s\n", static_cast<unsigned long long>(op->peer),
                  error.c_str());
      free_sends.push_back(op);
    }
    std::fflush(stdout);
  };
  auto progress = [&] { net.PollCompletion(on_done, on_error); };
  auto answer = [&](fi_addr_t dest, MessageType type, std::span<const uint8_t> payload) {
    if (!SendMessage(net, free_sends, dest, type, payload, progress, limit))
      std::printf("client %llu does not take our messages\n",
                  static_cast<unsigned long long>(dest));
  };

  while (!StopRequested() && (options.exit_after == 0 || served < options.exit_after)) {
    progress();
    while (!inbox.empty()) {
      Received m = std::move(inbox.front());
      inbox.pop_front();
      MessageHeader header{};
      std::memcpy(&header, m.bytes.data(), std::min(m.bytes.size(), sizeof(header)));
      const uint8_t* payload = m.bytes.data() + sizeof(header);
      if (m.bytes.size() < sizeof(header) || header.length != m.bytes.size() - sizeof(header)) {
        std::printf("dropped a malformed message of %zu bytes\n", m.bytes.size());
      } else if (header.type == MessageType::kConnect) {
        fi_addr_t client = FI_ADDR_UNSPEC;
        try {
          client = net.AddPeerAddress({payload, header.length});
        } catch (const Error& e) {
          std::printf("dropped a CONNECT: %s\n", e.what());
          continue;
        }
        std::printf("client %llu connected\n", static_cast<unsigned long long>(client));
        // ACCEPT: only now may the client send more. A message read in the same batch as
        // its sender's CONNECT would come from FI_ADDR_NOTAVAIL.
        answer(client, MessageType::kAccept, {});
      } else if (m.source == FI_ADDR_NOTAVAIL) {
        std::printf("dropped a message from a client that did not CONNECT\n");
      } else if (header.type == MessageType::kText) {
        std::string text(reinterpret_cast<const char*>(payload), header.length);
        std::printf("client %llu: %s\n", static_cast<unsigned long long>(m.source), text.c_str());
        std::reverse(text.begin(), text.end());
        answer(m.source, MessageType::kReply,
               {reinterpret_cast<const uint8_t*>(text.data()), text.size()});
      } else if (header.type == MessageType::kBye) {
        std::printf("client %llu done\n", static_cast<unsigned long long>(m.source));
        // Our answers to it leave the AV with it: let them complete first (bounded).
        const auto deadline = Clock::now() + limit;
        while (free_sends.size() < sends.size() && Clock::now() < deadline) progress();
        fi_av_remove(net.av.get(), &m.source, 1, 0);
        ++served;
      }
      std::fflush(stdout);
    }
  }
  std::printf("served %llu clients\n", static_cast<unsigned long long>(served));
  return kExitOk;
}

int ClientMain(const Options& options) {
  const std::vector<uint8_t> peer = FromHex(options.peer);
  if (options.text.size() + sizeof(MessageHeader) > kMessageBytes)
    throw UsageError("message of " + std::to_string(options.text.size()) +
                     " bytes is longer than " +
                     std::to_string(kMessageBytes - sizeof(MessageHeader)));
  Network net = Network::Open(options, peer);
  fi_addr_t server = net.AddPeerAddress(peer);

  // One receive for the answer, and one buffer for each message we send.
  HostBuffer buffers(4 * kMessageBytes);
  MrPtr mr = net.RegisterMemory(buffers.data(), buffers.size(), FI_RECV | FI_SEND);
  Op recv, connect, text, bye;
  Op* ops[] = {&recv, &connect, &text, &bye};
  for (size_t i = 0; i < 4; ++i) {
    ops[i]->buffer = buffers.data() + i * kMessageBytes;
    ops[i]->desc = fi_mr_desc(mr.get());
  }
  net.PostRecv(recv);  // posted before we ask, so the answer always finds a buffer

  const auto limit =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.timeout_s));
  const auto deadline = Clock::now() + limit;
  std::vector<Op*> free_sends = {&connect, &text, &bye};
  size_t sends_done = 0;
  std::string answer;
  bool accepted = false, answered = false;
  auto on_done = [&](Op& op, const fi_cq_data_entry& done, fi_addr_t) {
    if (op.kind == OpKind::kSend) {
      ++sends_done;
      return;
    }
    MessageHeader header{};
    std::memcpy(&header, op.buffer, std::min(done.len, sizeof(header)));
    if (done.len == sizeof(header) && header.type == MessageType::kAccept && header.length == 0) {
      accepted = true;
      net.PostRecv(op);  // again, for the answer
      return;
    }
    if (done.len < sizeof(header) || header.type != MessageType::kReply ||
        header.length != done.len - sizeof(header))
      throw Error("malformed answer from the server");
    answer.assign(reinterpret_cast<const char*>(op.buffer + sizeof(header)), header.length);
    answered = true;
  };
  auto on_error = [&](Op*, const std::string& error) {
    throw Error("an operation failed: " + error);
  };
  auto progress = [&] {
    net.PollCompletion(on_done, on_error);
    if (Clock::now() > deadline)
      throw Error("no answer from the server within " + std::to_string(options.timeout_s) +
                  " s (is it running at that address?)");
  };
  // Each of our three messages has a buffer of its own: taken in order, never given back.
  std::reverse(free_sends.begin(), free_sends.end());
  auto send = [&](MessageType type, std::span<const uint8_t> payload) {
    if (!SendMessage(net, free_sends, server, type, payload, progress, limit))
      throw Error("the server does not take our messages");
  };

  send(MessageType::kConnect, net.Address());
  while (!accepted) progress();  // our address is in the server's AV now
  send(MessageType::kText,
       {reinterpret_cast<const uint8_t*>(options.text.data()), options.text.size()});
  while (!answered) progress();
  std::printf("answer: %s\n", answer.c_str());
  std::fflush(stdout);
  send(MessageType::kBye, {});
  while (sends_done < 3) progress();
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  const char* about =
      "Lesson 02: request and response. Without an address: serve, answering every "
      "message with its text reversed. With the server's address: send TEXT, print "
      "the answer.";
  if (int rc = ParseCommandLine(argc, argv, about, kProgram, kServeOptions | kTextOptions, options);
      rc >= 0)
    return rc;
  return RunProgram(
      kProgram, [&] { return options.peer.empty() ? ServerMain(options) : ClientMain(options); });
}
