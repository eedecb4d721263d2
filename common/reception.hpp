// The server's front desk, from stage 03 on: who is a client, and who stops being one. 03-06
// call it the same way (README.md, "The front desk"), so that their own code is the lesson:
//
//   Reception<Network, Op> desk(net, mail, options, hooks);  // hooks: what the stage adds
//   on a receive:       desk.Received(bytes, source);
//   on a failed op:     desk.Lost(peer, why);
//   each round:         desk.Tend();
//                       while (auto request = desk.Next()) { ...serve request->transfer... }
//
// Next() answers CONNECTs and BYEs itself and hands out only TRANSFERs of connected clients
// that carry their session token (docs/wire-protocol.md). What it takes care of:
// - admission: a CONNECT is answered once one comes from the address it names; --max-clients;
//   when full, a client that has moved nothing for kIdleYield gives its place to a new one;
// - tokens: a message without its client's token is a stranger's, dropped;
// - departures: a client that said BYE, failed, or was silent for --peer-timeout leaves the
//   AV once nothing of ours is on its way to it (common/departures.hpp);
// - limits: --max-requests, --client-memory, --server-memory (OverLimits).
#pragma once

#include <rdma/fabric.h>

#include <chrono>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "departures.hpp"
#include "error.hpp"
#include "mailbox.hpp"
#include "options.hpp"
#include "program.hpp"
#include "protocol.hpp"

namespace common {

// "" or why `t` would take a client past the server's limits: `requests` and `client_bytes`
// are what the client holds already, `all_bytes` what every client holds.
std::string OverLimits(const Options& options, const wire::Transfer& t, uint64_t requests,
                       uint64_t client_bytes, uint64_t all_bytes);

template <typename Network, typename Op>
class Reception {
 public:
  using Clock = std::chrono::steady_clock;
  using Mail = Mailbox<Network, Op>;
  // A full server gives the place of a client that moved nothing this long to a new one.
  static constexpr auto kIdleYield = std::chrono::seconds(2);

  // What the stage adds to the desk. busy(client): the stage still works for it (a request
  // in progress, WRITEs in flight): it is neither silent nor ready to leave the AV.
  // leaving(client): it has gone, stop writing to it. Lanes past the first (06): lanes, the
  // writers ACCEPT names, and how a lane's address enters and leaves that lane's AV.
  struct Hooks {
    std::function<bool(fi_addr_t)> busy = [](fi_addr_t) { return false; };
    std::function<void(fi_addr_t)> leaving = [](fi_addr_t) {};
    size_t lanes = 1;
    std::vector<std::vector<uint8_t>> writers;
    std::function<fi_addr_t(size_t, std::span<const uint8_t>)> open_lane;
    std::function<void(size_t, fi_addr_t)> close_lane;
  };

  struct Client {
    std::vector<fi_addr_t> addresses;         // per lane, in that lane's AV ([0]: its id)
    std::vector<wire::RemoteRegion> regions;  // per lane: the same memory, a key per domain
    uint32_t session = 0;                     // the token its messages carry
    uint32_t nonce = 0;             // its CONNECT's token: a CONNECT again with it is a repeat
    Clock::time_point last_seen{};  // its last message, or the end of its last request
  };

  struct Request {
    fi_addr_t client;
    wire::Transfer transfer;
  };

  Reception(Network& net, Mail& mail, const Options& options, Hooks hooks = {})
      : net_(net),
        mail_(mail),
        options_(options),
        hooks_(std::move(hooks)),
        own_(net.Address()),
        departures_(net.av.get(), *net.info, own_),
        limit_(Seconds(options.timeout_s)),
        peer_timeout_(Seconds(options.peer_timeout_s)) {}

  // A message arrived: handled by Next(), so that a message never interrupts a transfer.
  void Received(std::span<const uint8_t> bytes, fi_addr_t source) {
    inbox_.push_back({{bytes.begin(), bytes.end()}, source});
  }
  bool Waiting() const { return !inbox_.empty(); }

  // An operation for `peer` failed, or it takes none of our messages: it is dropped.
  void Lost(fi_addr_t peer, const std::string& why) { lost_.emplace(peer, why); }

  // Whether `client` is on its way out: its BYE waits, or an operation for it failed.
  bool Leaving(fi_addr_t client) const {
    if (lost_.count(client)) return true;
    auto c = clients_.find(client);
    for (const auto& m : inbox_)
      if (m.source == client && c != clients_.end() &&
          wire::TypeOf(m.bytes) == wire::MessageType::kBye &&
          wire::TokenOf(m.bytes) == c->second.session)
        return true;
    return false;
  }

  // Once a round: drops the lost and the silent; departed peers leave the AV once nothing of
  // ours is on its way to them, or `limit` on (rxm then closes the connection, and what it
  // held fails back to us): removing a peer with operations in flight crashes some providers.
  void Tend() {
    for (auto& [client, c] : clients_)  // vanished without BYE: its place is not held for good
      if (!hooks_.busy(client) && Clock::now() - c.last_seen > peer_timeout_)
        lost_.emplace(client, "silent for " + Format(options_.peer_timeout_s) + " s");
    auto lost = std::move(lost_);
    lost_.clear();
    for (const auto& [client, why] : lost) Drop(client, why);
    std::erase_if(departed_, [&](const auto& d) {
      const bool waits =
          hooks_.busy(d.first) || mail_.Busy(d.first) || departures_.Waiting(d.first);
      if (waits && Clock::now() - d.second.since < limit_) return false;
      Remove(d.first, d.second.addresses);
      return true;
    });
  }

  // The next TRANSFER of a connected client, valid for its region; nothing once the messages
  // waiting are handled.
  std::optional<Request> Next() {
    while (!inbox_.empty()) {
      Incoming m = std::move(inbox_.front());
      inbox_.pop_front();
      std::optional<Request> request = Handle(m);
      std::fflush(stdout);
      if (request) return request;
    }
    return std::nullopt;
  }

  void Refuse(fi_addr_t client, uint32_t request_id, const std::string& why) {
    std::printf("client %llu: refused: %s\n", Name(client), why.c_str());
    mail_.Send(client, wire::ErrorReply{request_id, why});
  }

  // `client` was served just now: its silence counts from here.
  void Seen(fi_addr_t client) {
    if (auto c = clients_.find(client); c != clients_.end()) c->second.last_seen = Clock::now();
  }
  const Client* Find(fi_addr_t client) const {
    auto c = clients_.find(client);
    return c == clients_.end() ? nullptr : &c->second;
  }
  // Whether to go on: no stop requested, and fewer than --exit-after clients served.
  bool Open() const {
    return !StopRequested() && (options_.exit_after == 0 || served_ < options_.exit_after);
  }
  uint64_t served() const { return served_; }
  const std::vector<uint8_t>& own_address() const { return own_; }

 private:
  struct Incoming {
    std::vector<uint8_t> bytes;
    fi_addr_t source;
  };
  struct Departed {
    std::vector<fi_addr_t> addresses;
    Clock::time_point since;
  };

  static Clock::duration Seconds(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }
  static std::string Format(double s) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", s);
    return text;
  }
  static unsigned long long Name(fi_addr_t client) { return client; }

  std::optional<Request> Handle(Incoming& m) {
    const bool known = m.source != FI_ADDR_NOTAVAIL && clients_.count(m.source);
    // A connected client's messages carry its session token: one without it is a stranger's
    // that the provider credited to this client (docs/wire-protocol.md).
    const bool genuine = known && wire::TokenOf(m.bytes) == clients_[m.source].session;
    wire::Message message;
    uint32_t token = 0;
    try {
      message = wire::Decode(m.bytes, &token);
    } catch (const wire::ProtocolError& e) {
      if (genuine)
        Refuse(m.source, 0, e.what());
      else
        std::printf("dropped a message: %s\n", e.what());
      return std::nullopt;
    }
    if (wire::IsServerMessage(message)) {  // answering one could start an endless exchange
      std::printf("dropped a server's message from %s: a server never answers one\n",
                  known ? ("client " + std::to_string(Name(m.source))).c_str() : "a stranger");
    } else if (auto* connect = std::get_if<wire::Connect>(&message)) {
      Connect(*connect, m.source, known, token);
    } else if (!known) {
      std::printf("dropped a message from a sender that did not CONNECT\n");
    } else if (!genuine) {
      std::printf("dropped a message for client %llu without its session token\n", Name(m.source));
    } else if (auto* transfer = std::get_if<wire::Transfer>(&message)) {
      Client& c = clients_[m.source];
      c.last_seen = Clock::now();
      try {
        for (const auto& region : c.regions) wire::ValidateTransfer(*transfer, region);
      } catch (const std::exception& e) {
        Refuse(m.source, transfer->request_id, e.what());
        return std::nullopt;
      }
      return Request{m.source, std::move(*transfer)};
    } else if (std::holds_alternative<wire::Bye>(message)) {
      std::printf("client %llu done\n", Name(m.source));
      Forget(m.source);
    } else {  // a client of another stage (02's TEXT): told, not left to time out
      Refuse(m.source, 0, std::string(ProgramName()) + " serves no " + wire::NameOf(message));
    }
    return std::nullopt;
  }

  void Connect(const wire::Connect& connect, fi_addr_t source, bool known, uint32_t token) {
    if (connect.lanes[0].address == own_) {
      std::printf("dropped a CONNECT that names this server's own address\n");
      return;
    }
    fi_addr_t id = FI_ADDR_UNSPEC;
    try {
      id = departures_.Insert(connect.lanes[0].address,
                              [&](const auto& a) { return net_.AddPeerAddress(a); });
    } catch (const Error& e) {
      std::printf("dropped a CONNECT: %s\n", e.what());
      return;
    }
    // Answered only once one comes from the address it names: an address that has not
    // spoken is never sent to (docs/wire-protocol.md, "Answering only who spoke").
    if (source != id) {
      if (known)      // a client's first CONNECT comes from no client of ours: said only
        std::printf(  // when a connected client names another address
            "a CONNECT not from the address it names: answered once one comes from there\n");
      if (!clients_.count(id) && !departed_.count(id)) departed_[id] = {{id}, Clock::now()};
      for (fi_addr_t old : departures_.Unverified(id))  // the oldest leave the AV now
        if (auto d = departed_.find(old); d != departed_.end()) {
          Remove(old, d->second.addresses);
          departed_.erase(d);
        }
      return;
    }
    if (clients_.count(id) && clients_[id].nonce == token) return;  // a repeat
    if (auto d = departed_.find(id); d != departed_.end()) {        // the same address in use again
      for (size_t l = 1; l < d->second.addresses.size(); ++l)
        hooks_.close_lane(l, d->second.addresses[l]);
      departed_.erase(d);
    }
    departures_.Revive(id);
    mail_.Seal(id, token);  // our answers carry the client's own token back
    if (options_.max_clients > 0 && !clients_.count(id) &&
        clients_.size() >= options_.max_clients && !YieldPlace()) {
      Refuse(id, 0, "server full: " + std::to_string(clients_.size()) + " clients (--max-clients)");
      departed_[id] = {{id}, Clock::now()};
      return;
    }
    Admit(connect, id, token);
  }

  // Lane i of the client pairs with lane i of the server; extra lanes go unused.
  void Admit(const wire::Connect& connect, fi_addr_t id, uint32_t token) {
    Client client{{id}, {connect.lanes[0].region}, wire::NewToken(), token, Clock::now()};
    const size_t used = std::min(hooks_.lanes, connect.lanes.size());
    try {
      for (size_t l = 1; l < used; ++l) {
        client.addresses.push_back(hooks_.open_lane(l, connect.lanes[l].address));
        client.regions.push_back(connect.lanes[l].region);
      }
    } catch (const Error& e) {
      for (size_t l = 1; l < client.addresses.size(); ++l)
        hooks_.close_lane(l, client.addresses[l]);
      std::printf("dropped a CONNECT: %s\n", e.what());
      departed_[id] = {{id}, Clock::now()};
      return;
    }
    std::printf("client %llu connected: region of %llu bytes", Name(id),
                static_cast<unsigned long long>(connect.lanes[0].region.length));
    std::printf(hooks_.lanes > 1 ? ", %zu lanes\n" : "\n", used);
    const size_t writers = std::min(used, hooks_.writers.size());
    mail_.Send(id,
               wire::Accept{
                   {hooks_.writers.begin(), hooks_.writers.begin() + writers}, 0, client.session});
    clients_[id] = std::move(client);
  }

  // A full server makes room: the client that has moved nothing the longest, if that is
  // kIdleYield or more (a stranger that CONNECTed and stays silent), is dropped.
  bool YieldPlace() {
    auto idlest = clients_.end();
    for (auto c = clients_.begin(); c != clients_.end(); ++c)
      if (!hooks_.busy(c->first) &&
          (idlest == clients_.end() || c->second.last_seen < idlest->second.last_seen))
        idlest = c;
    if (idlest == clients_.end() || Clock::now() - idlest->second.last_seen < kIdleYield)
      return false;
    Drop(idlest->first, "idle while another client waited for its place");
    return true;
  }

  void Drop(fi_addr_t client, const std::string& why) {
    if (clients_.count(client)) std::printf("client %llu lost: %s\n", Name(client), why.c_str());
    mail_.Forget(client);
    Forget(client);
  }

  // `client` is no client any more: the stage stops writing to it, and its addresses wait to
  // leave the AVs.
  void Forget(fi_addr_t client) {
    auto c = clients_.find(client);
    if (c != clients_.end()) {
      ++served_;
      departed_[client] = {std::move(c->second.addresses), Clock::now()};
      clients_.erase(c);
      hooks_.leaving(client);
    } else if (!departed_.count(client)) {
      departed_[client] = {{client}, Clock::now()};
    }
  }

  void Remove(fi_addr_t id, const std::vector<fi_addr_t>& addresses) {
    mail_.Forget(id);  // nothing may be posted to an address that left the AV
    departures_.Remove(id);
    for (size_t l = 1; l < addresses.size(); ++l) hooks_.close_lane(l, addresses[l]);
  }

  Network& net_;
  Mail& mail_;
  const Options& options_;
  Hooks hooks_;
  std::vector<uint8_t> own_;
  Departures departures_;  // peers leave the AV here
  Clock::duration limit_, peer_timeout_;
  std::map<fi_addr_t, Client> clients_;
  std::deque<Incoming> inbox_;
  std::map<fi_addr_t, std::string> lost_;   // clients an operation failed for
  std::map<fi_addr_t, Departed> departed_;  // AV entries to remove once idle
  uint64_t served_ = 0;
};

}  // namespace common
