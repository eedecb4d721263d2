// The control messages of one side, from stage 02 on (02's README walks through it): receive
// buffers kept posted, send buffers, and the messages waiting for one. Sending never waits:
// Send() queues a message and Flush(), called from the owner's loop, posts what the provider
// takes now. A peer whose messages wait too long is reported, so a server drops it instead of
// stalling every other client behind it (a CONNECT can name an address nobody answers at).
//
// A template over the stage's own Network (PostRecv, PostSend, domain, info) and Op (buffer,
// length, desc, peer), so that each stage keeps its own op types and posting code.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "error.hpp"
#include "fabric_handles.hpp"
#include "host_buffer.hpp"
#include "program.hpp"
#include "protocol.hpp"
#include "registration.hpp"
#include "text.hpp"

namespace common {

template <typename Network, typename Op>
class Mailbox {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kMessageBytes = wire::kMaxMessageBytes;  // every buffer's size

  Mailbox(Network& net, size_t receives, size_t sends)
      : net_(net),
        buffers_((receives + sends) * kMessageBytes),
        mr_(RegisterMemory(net.domain.get(), *net.info, buffers_.data(), buffers_.size(),
                           FI_RECV | FI_SEND)),
        recvs_(receives),
        sends_(sends) {
    for (size_t i = 0; i < receives + sends; ++i) {
      Op& op = i < receives ? recvs_[i] : sends_[i - receives];
      op.buffer = buffers_.data() + i * kMessageBytes;
      op.desc = fi_mr_desc(mr_.get());
    }
    for (auto& op : recvs_) net.PostRecv(op);
    for (auto& op : sends_) free_.push_back(&op);
  }

  // The receives still posted are cancelled first: whoever reaches the endpoint (a stranger,
  // a late peer) could otherwise land a message in buffers freed before the endpoint closes.
  ~Mailbox() {
    if (net_.ep)
      for (auto& op : recvs_) fi_cancel(&net_.ep->fid, &op.context);
  }
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;

  // Queues `message` for `dest`; Flush() posts it. It carries the token sealed for `dest`.
  void Send(fi_addr_t dest, const wire::Message& message) {
    const auto token = tokens_.find(dest);
    outbox_.push_back(
        {dest, wire::Encode(message, token == tokens_.end() ? 0 : token->second), Clock::now()});
  }

  // Every message to `dest` from now on carries `token` (docs/wire-protocol.md, "Tokens"),
  // until Forget(dest).
  void Seal(fi_addr_t dest, uint32_t token) { tokens_[dest] = token; }

  // Posts queued messages, oldest first, while send buffers are free and the provider takes
  // them, keeping each peer's messages in order. Returns the peers whose oldest message has
  // waited longer than `limit` (their messages are dropped): they do not take our messages.
  std::set<fi_addr_t> Flush(Clock::duration limit) {
    std::set<fi_addr_t> held, stalled;
    for (auto it = outbox_.begin(); it != outbox_.end();) {
      if (held.count(it->dest) || free_.empty() || !Post(*it)) {
        if (Clock::now() - it->since > limit || refused_.count(it->dest)) stalled.insert(it->dest);
        held.insert(it->dest);
        ++it;
      } else {
        it = outbox_.erase(it);
      }
    }
    for (fi_addr_t peer : stalled) Forget(peer);
    refused_.clear();
    return stalled;
  }

  // A send completed (or failed): its buffer is free again.
  void Sent(Op* op) { free_.push_back(op); }

  // Drops what is still queued for `peer`, and its token.
  void Forget(fi_addr_t peer) {
    std::erase_if(outbox_, [peer](const Outgoing& m) { return m.dest == peer; });
    tokens_.erase(peer);
  }
  // Drops what is still queued for `peer`, and queues `message` as the last it gets from us,
  // with its token (which is then forgotten): a peer told why it was dropped.
  void Last(fi_addr_t peer, const wire::Message& message) {
    std::erase_if(outbox_, [peer](const Outgoing& m) { return m.dest == peer; });
    Send(peer, message);
    tokens_.erase(peer);
  }

  // Whether something of ours is queued for, or on its way to, `peer`.
  bool Busy(fi_addr_t peer) const { return Queued(peer) || Posted(peer); }

  // Whether a send of ours to `peer` is in the provider, not yet completed: while one is, the
  // peer must stay in the AV (a provider completing it for a removed address can crash).
  bool Posted(fi_addr_t peer) const {
    for (const auto& op : sends_)
      if (op.peer == peer && std::find(free_.begin(), free_.end(), &op) == free_.end()) return true;
    return false;
  }

  bool Queued(fi_addr_t peer) const {
    for (const auto& m : outbox_)
      if (m.dest == peer) return true;
    return false;
  }

  // Nothing queued and every send completed.
  bool Idle() const { return outbox_.empty() && free_.size() == sends_.size(); }

 private:
  struct Outgoing {
    fi_addr_t dest;
    std::vector<uint8_t> bytes;
    Clock::time_point since;
  };

  // True when posted; false to try later (-FI_EAGAIN) or never (the provider refused the
  // destination: it goes to refused_, and Flush reports it at once).
  bool Post(const Outgoing& m) {
    Op* op = free_.back();
    std::memcpy(op->buffer, m.bytes.data(), m.bytes.size());
    op->length = m.bytes.size();
    try {
      if (!net_.PostSend(*op, m.dest)) return false;
    } catch (const Error&) {
      refused_.insert(m.dest);
      return false;
    }
    free_.pop_back();
    return true;
  }

  Network& net_;
  HostBuffer buffers_;
  MrPtr mr_;
  std::vector<Op> recvs_, sends_;
  std::vector<Op*> free_;
  std::deque<Outgoing> outbox_;
  std::set<fi_addr_t> refused_;
  std::map<fi_addr_t, uint32_t> tokens_;
};

// What a client takes from the network: its server's messages only (docs/wire-protocol.md,
// "Tokens"). Whoever reaches the client's endpoint can send it anything; a message that does
// not come from the server's address (where the provider names the sender), does not decode,
// or does not carry the client's token is dropped and counted, never acted on.
class ServerFilter {
 public:
  ServerFilter(fi_addr_t server, uint32_t token) : server_(server), token_(token) {}
  uint32_t token() const { return token_; }

  // The message, or nothing when it is not our server's. `source`: FI_ADDR_UNSPEC when the
  // endpoint does not name senders.
  std::optional<wire::Message> Take(std::span<const uint8_t> bytes, fi_addr_t source) {
    if (source != FI_ADDR_UNSPEC && source != server_) {
      Ignore("from another address than our server's");
      return std::nullopt;
    }
    try {
      uint32_t token = 0;
      wire::Message message = wire::Decode(bytes, &token);
      if (token != token_) {
        Ignore("without our token");
        return std::nullopt;
      }
      // Our server, of another stage or version: said at once, not misunderstood.
      if (std::string why = wire::Mismatch(message); !why.empty()) throw UsageError(why);
      return message;
    } catch (const wire::ProtocolError& e) {
      Ignore(std::string("that does not decode (") + e.what() + ")");
      return std::nullopt;
    }
  }
  // A message of our server's that we drop all the same: it names a request we never made.
  void Ignore(const std::string& why) {
    ++ignored_;
    last_ = why;
  }
  uint64_t ignored() const { return ignored_; }
  // "" when nothing was ignored, else the line a client prints about it.
  std::string Describe() const {
    if (ignored_ == 0) return "";
    return "ignored " + std::to_string(ignored_) +
           " messages that were not our server's (the last: " + last_ + ")";
  }

 private:
  fi_addr_t server_;
  uint32_t token_;
  uint64_t ignored_ = 0;
  std::string last_;
};

// A client's CONNECT, sent again until the server answers. A server answers a CONNECT only
// once one has come from the address it names, and learns that address from the first, so
// the first is never answered (docs/wire-protocol.md, "Answering only who spoke"). Again
// after 10 ms, then twice as long each time, up to 500 ms; the server drops the repeats of a
// CONNECT it has answered (they carry the same token).
class ConnectRepeat {
 public:
  using Clock = std::chrono::steady_clock;
  // True when the CONNECT is due again, counting from the last time this said so.
  bool Due() {
    if (Clock::now() - last_ < wait_) return false;
    last_ = Clock::now();
    wait_ = std::min<Clock::duration>(wait_ * 2, std::chrono::milliseconds(500));
    return true;
  }
  // Whether `limit` has passed since the first CONNECT without an answer: the client gives up.
  bool Expired(Clock::duration limit) const { return Clock::now() - first_ > limit; }

 private:
  Clock::time_point first_ = Clock::now();
  Clock::time_point last_ = first_;
  Clock::duration wait_ = std::chrono::milliseconds(10);
};

// A client stopped by Ctrl-C or SIGTERM says BYE and goes, so that its server frees its place
// at once instead of waiting out --peer-timeout. SayBye sends it and what else is queued
// (for at most a second of `poll()`), then polls 0.3 s more while the server reads it and
// finishes what it had in flight: over tcp its WRITEs would otherwise fail as our endpoints
// close, and over shm 1.17 never complete. Then "error: stopped" and exit 1 (Abandon), with no
// thread of ours inside a provider call (one cut off there can leave a shm lock held).
inline constexpr const char* kStoppedWhy =
    "stopped (SIGINT or SIGTERM) before the transfer ended; said BYE";
template <typename Mail, typename Poll>
void SayBye(Mail& mail, fi_addr_t server, Poll&& poll) {
  using Clock = std::chrono::steady_clock;
  mail.Send(server, wire::Bye{});
  const auto deadline = Clock::now() + std::chrono::seconds(1);
  while (!mail.Idle() && Clock::now() < deadline) {
    poll();
    mail.Flush(std::chrono::seconds(1));
  }
  for (const auto linger = Clock::now() + std::chrono::milliseconds(300); Clock::now() < linger;)
    poll();
}
template <typename Mail, typename Poll>
[[noreturn]] void SayByeAndStop(Mail& mail, fi_addr_t server, Poll&& poll, const char* program) {
  SayBye(mail, server, poll);
  Abandon(program, kStoppedWhy);
}

// Sends `connect` to the server until `answered()` (ACCEPT or ERROR came), again on
// ConnectRepeat's clock, calling `progress()` meanwhile; a client that is never answered
// within `timeout_s` gives up (Abandon). `token`: the client's own, which the answers carry.
template <typename Mail, typename Answered, typename Progress>
void ConnectUntilAnswered(Mail& mail, fi_addr_t server, uint32_t token,
                          const wire::Connect& connect, Answered&& answered, Progress&& progress,
                          const char* program, double timeout_s) {
  const auto limit = std::chrono::duration_cast<ConnectRepeat::Clock::duration>(
      std::chrono::duration<double>(timeout_s));
  mail.Seal(server, token);  // the server's answers carry it back
  mail.Send(server, connect);
  for (ConnectRepeat again; !answered(); progress()) {
    if (again.Expired(limit))  // a server that has never heard us takes none of our CONNECTs
      Abandon(program, "no answer from the server within " + FormatSeconds(timeout_s) +
                           " to our CONNECT (is it running at that address?)");
    if (mail.Idle() && again.Due()) mail.Send(server, connect);  // in its AV now: answered
  }
}

}  // namespace common
