// 02_bidirectional: request and response.
//
// Both sides keep receives posted. The client SENDs CONNECT with its own address; the server
// inserts that address into its AV, and from then on the provider tells it who sent each
// message (FI_SOURCE). The server answers every TEXT with a REPLY, the text reversed; the
// client prints the answer and says BYE. The messages are the project's wire protocol
// (common/protocol.hpp), which every later stage speaks. The walkthrough is in README.md.

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
#include "completion.hpp"
#include "error.hpp"
#include "fabric_handles.hpp"
#include "host_buffer.hpp"
#include "mailbox.hpp"
#include "options.hpp"
#include "program.hpp"
#include "protocol.hpp"
#include "provider.hpp"
#include "text.hpp"

using namespace common;

namespace {

constexpr const char* kProgram = "02_bidirectional";
constexpr size_t kRecvDepth = 8;  // receives each side keeps posted

using Clock = std::chrono::steady_clock;

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
  void PostRecv(Op& op);
  bool PostSend(Op& op, fi_addr_t dest);
  // on_done(op, entry, source) for each completion; on_error(op, error) for a failure.
  template <typename OnDone, typename OnError>
  size_t PollCompletion(OnDone&& on_done, OnError&& on_error) {
    const size_t n = ReadCompletions(
        cq.get(), true,
        [&](const fi_cq_data_entry& e, fi_addr_t source) {
          on_done(OpOf(e.op_context), e, source);
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

void Network::PostRecv(Op& op) {
  op.kind = OpKind::kRecv;
  FI_CHECK(
      fi_recv(ep.get(), op.buffer, wire::kMaxMessageBytes, op.desc, FI_ADDR_UNSPEC, &op.context));
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

// The control messages: receives kept posted, and a queue of messages to send that never
// makes us wait (common/mailbox.hpp).
using Mail = Mailbox<Network, Op>;

void PrintHeader(const char* role, const Network& net) {
  std::printf("%s %s: provider %s, domain %s\n", kProgram, role, net.info->fabric_attr->prov_name,
              net.info->domain_attr->name);
  std::fflush(stdout);
}

struct Received {
  std::vector<uint8_t> bytes;
  fi_addr_t source;
};

int ServerMain(const Options& options) {
  InstallStopHandlers(kProgram);
  Network net = Network::Open(options, {});
  PrintHeader("server", net);
  PublishAddress(net.Address(), options);
  const auto limit =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.timeout_s));

  Mail mail(net, kRecvDepth, kRecvDepth);
  // The completion callback only collects messages; the main loop answers them, so that
  // answering never polls inside a poll.
  uint64_t served = 0;
  std::deque<Received> inbox;
  auto on_done = [&](Op* op, const fi_cq_data_entry& done, fi_addr_t source) {
    if (op->kind == OpKind::kSend) mail.Sent(op);
    if (op->kind != OpKind::kRecv) return;
    inbox.push_back({{op->buffer, op->buffer + done.len}, source});
    net.PostRecv(*op);  // hand the buffer back before the next message needs it
  };
  // A failure concerns one message or one peer: say so, and keep serving.
  auto on_error = [&](Op* op, const CompletionError& error) {
    if (op->kind == OpKind::kRecv) {  // too long for our buffer, or cut off
      Diagnostic("dropped a message: %s\n", error.text.c_str());
      net.PostRecv(*op);
    } else {
      std::printf("client %llu: a SEND failed: %s\n", static_cast<unsigned long long>(op->peer),
                  error.text.c_str());
      mail.Sent(op);
    }
    std::fflush(stdout);
  };
  // Completions, then the messages waiting to go out; a peer that takes none is lost.
  auto progress = [&] {
    net.PollCompletion(on_done, on_error);
    for (fi_addr_t peer : mail.Flush(limit))
      std::printf("client %llu does not take our messages\n",
                  static_cast<unsigned long long>(peer));
  };

  while (!StopRequested() && (options.exit_after == 0 || served < options.exit_after)) {
    progress();
    while (!inbox.empty()) {
      Received m = std::move(inbox.front());
      inbox.pop_front();
      const auto name = static_cast<unsigned long long>(m.source);
      wire::Message message;
      uint32_t token = 0;
      try {
        message = wire::Decode(m.bytes, &token);  // every field checked before we act
      } catch (const wire::ProtocolError& e) {
        Diagnostic("dropped a message: %s\n", e.what());
        continue;
      }
      if (auto* connect = std::get_if<wire::Connect>(&message)) {
        fi_addr_t client = FI_ADDR_UNSPEC;
        try {
          client = net.AddPeerAddress(connect->lanes[0].address);
        } catch (const Error& e) {
          Diagnostic("dropped a CONNECT: %s\n", e.what());
          continue;
        }
        std::printf("client %llu connected\n", static_cast<unsigned long long>(client));
        // ACCEPT: only now may the client send more. A message read in the same batch as
        // its sender's CONNECT would come from FI_ADDR_NOTAVAIL.
        mail.Seal(client, token);  // our answers carry the client's own token back
        mail.Send(client, wire::Accept{{}, 0, wire::NewToken()});
      } else if (m.source == FI_ADDR_NOTAVAIL) {
        Diagnostic("dropped a message from a client that did not CONNECT\n");
      } else if (auto* text = std::get_if<wire::Text>(&message)) {
        std::printf("client %llu: %s\n", name, text->text.c_str());
        mail.Send(m.source, wire::Reply{{text->text.rbegin(), text->text.rend()}});
      } else if (std::holds_alternative<wire::Bye>(message)) {
        std::printf("client %llu done\n", name);
        // Our answers to it leave the AV with it: let them complete first (bounded).
        const auto deadline = Clock::now() + limit;
        while (mail.Busy(m.source) && Clock::now() < deadline) progress();
        mail.Forget(m.source);
        fi_av_remove(net.av.get(), &m.source, 1, 0);
        ++served;
      } else {  // a client of a later stage: told, not left to time out
        mail.Send(m.source, wire::ErrorReply{0, std::string(kProgram) + " serves TEXT, not " +
                                                    wire::NameOf(message)});
      }
      std::fflush(stdout);
    }
  }
  std::printf("served %s\n", Plural(served, "client").c_str());
  return kExitOk;
}

int ClientMain(const Options& options) {
  InstallStopHandlers(kProgram);  // Ctrl-C or SIGTERM: BYE, then exit (SayByeAndStop)
  const std::vector<uint8_t> peer = FromHex(options.peer);
  if (options.text.size() > wire::kMaxTextBytes)
    throw UsageError("message of " + std::to_string(options.text.size()) +
                     " bytes is longer than " + std::to_string(wire::kMaxTextBytes));
  Network net = Network::Open(options, peer);
  fi_addr_t server = net.AddPeerAddress(peer);
  PrintHeader("client", net);
  const auto limit =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.timeout_s));

  // Receives posted before we ask, so the answer always finds a buffer.
  Mail mail(net, kRecvDepth, 3);
  std::optional<std::string> answer;
  std::string refused;
  bool accepted = false;
  auto last_progress = Clock::now();
  // Only our server's messages count; anyone else's are dropped and counted.
  ServerFilter from_server(server, wire::NewToken());
  auto on_done = [&](Op* op, const fi_cq_data_entry& entry, fi_addr_t source) {
    if (op->kind == OpKind::kSend) {
      mail.Sent(op);
    } else if (op->kind == OpKind::kRecv) {
      std::optional<wire::Message> message = from_server.Take({op->buffer, entry.len}, source);
      net.PostRecv(*op);
      if (!message) return;
      if (auto* accept = std::get_if<wire::Accept>(&*message)) {
        accepted = true;
        mail.Seal(server, accept->session);  // our TEXT and BYE carry it
      } else if (auto* error = std::get_if<wire::ErrorReply>(&*message)) {
        refused = error->text;
      } else if (auto* reply = std::get_if<wire::Reply>(&*message)) {
        answer = reply->text;
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
  connect.lanes.push_back({net.Address(), {}});  // our address; no region: 02 asks no WRITE
  ConnectUntilAnswered(
      mail, server, from_server.token(), connect, [&] { return accepted || !refused.empty(); },
      progress, kProgram, options.timeout_s);
  send(wire::Text{options.text});  // our address is in the server's AV now
  while (!answer && refused.empty()) progress();
  if (!refused.empty()) throw Error("the server refused the request: " + refused);
  std::printf("answer: %s\n", answer->c_str());
  std::fflush(stdout);
  send(wire::Bye{});
  while (!mail.Idle()) progress();  // every message of ours has left
  if (from_server.ignored() > 0) std::printf("%s\n", from_server.Describe().c_str());
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
