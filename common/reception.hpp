// The server's front desk, from stage 03 on: who is a client, and who stops being one. 03-07
// call it the same way (03_gpudirect_write/README.md, "The front desk"), so that their own
// code is the lesson:
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
//   a CONNECT naming a live client's address or lanes, in any spelling, waits or is dropped;
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
#include <set>
#include <span>
#include <string>
#include <vector>

#include "address.hpp"
#include "departures.hpp"
#include "error.hpp"
#include "mailbox.hpp"
#include "options.hpp"
#include "program.hpp"
#include "protocol.hpp"
#include "report.hpp"

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

  // What a stage's open hook made for a client: ACCEPT's writers, the words for the server's
  // line about it, and how long that took (ACCEPT carries it).
  struct Opened {
    std::vector<std::vector<uint8_t>> writers;
    std::string describe;
    uint64_t setup_ns = 0;
    uint64_t source_bytes = 0;  // 07: the server's source pages (wire::Accept)
  };

  // What the stage adds to the desk. busy(client): the stage still works for it (a request
  // in progress, WRITEs in flight): it is neither silent nor ready to leave the AV.
  // leaving(client): it has gone, stop writing to it. said(number, client, how): the line
  // for a client that went ("done", "lost: why"); the desk prints "client N how" unless the
  // stage says it. full(): "" or why no client can be admitted now. Lanes past the first
  // (06): lanes, the writers ACCEPT names, and how a lane's address enters and leaves that
  // lane's AV. open(connect, client): 07, whose engine opens a client's lanes itself; throws
  // with the reason it cannot.
  enum class Silent { kDrop, kTell, kKeep };
  struct Hooks {
    std::function<bool(fi_addr_t)> busy = [](fi_addr_t) { return false; };
    std::function<void(fi_addr_t)> leaving = [](fi_addr_t) {};
    std::function<void(uint64_t, fi_addr_t, const std::string&)> said;
    std::function<std::string()> full = [] { return std::string(); };
    // A client silent past --peer-timeout with nothing open: dropped, told first (its process
    // is there, so a paused one learns it at once when it runs again), or kept (its process
    // is seen stopped by a signal: slow, not gone). Stages without a view of peers drop it.
    std::function<Silent(fi_addr_t, uint64_t)> silent = [](fi_addr_t, uint64_t) {
      return Silent::kDrop;
    };
    size_t lanes = 1;
    std::vector<std::vector<uint8_t>> writers;
    std::function<fi_addr_t(size_t, std::span<const uint8_t>)> open_lane;
    std::function<void(size_t, fi_addr_t)> close_lane;
    std::function<Opened(const wire::Connect&, fi_addr_t)> open;
    // Before open: "" or what the client is told at once, as an ERROR of request 0 that
    // does not refuse it (07: wire::kWait, its engine is rebuilt for it; wire::kAsIs, it is
    // served by the engine as it is).
    std::function<std::string(const wire::Connect&)> before_open = [](const wire::Connect&) {
      return std::string();
    };
  };

  struct Client {
    uint64_t number = 0;                      // clients in order of arrival, for the log
    std::vector<fi_addr_t> addresses;         // per lane, in that lane's AV ([0]: its id)
    std::vector<wire::RemoteRegion> regions;  // per lane: the same memory, a key per domain
    std::vector<uint8_t> reply;               // where answers go, canonical (CanonicalAddress)
    std::vector<std::vector<uint8_t>> lanes;  // its lanes, canonical: nobody else may claim them
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
        format_(net.info->addr_format),
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
    std::set<fi_addr_t> told;
    for (auto& [client, c] : clients_) {  // vanished without BYE: its place is not held for good
      if (hooks_.busy(client) || Clock::now() - c.last_seen <= peer_timeout_) continue;
      const Silent seen = hooks_.silent(client, c.number);
      if (seen == Silent::kKeep) continue;
      lost_.emplace(client, "silent for " + Format(options_.peer_timeout_s) + " s");
      if (seen == Silent::kTell) told.insert(client);
    }
    auto lost = std::move(lost_);
    lost_.clear();
    for (const auto& [client, why] : lost) Drop(client, why, told.count(client) > 0);
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
    auto c = clients_.find(client);
    RefuseAs(client, c == clients_.end() ? 0 : c->second.number, request_id, why);
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
  // Every client goes, with `how` as the reason (a server that stops).
  void Dismiss(const std::string& how) {
    while (!clients_.empty()) Forget(clients_.begin()->first, how);
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
  // CONNECTs left unanswered while the client whose lanes they name is served, by the address
  // they answer to: the number each got and the client it waits on. Each keeps its number
  // and its one line while it is sent again; forgotten when that client's session ends.
  struct Wait {
    uint64_t number = 0;
    fi_addr_t on = FI_ADDR_UNSPEC;
  };

  static Clock::duration Seconds(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }
  static std::string Format(double s) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", s);
    return text;
  }
  static unsigned long long Name(uint64_t number) { return number; }

  void RefuseAs(fi_addr_t dest, uint64_t number, uint32_t request_id, const std::string& why) {
    std::printf("client %llu: refused: %s\n", Name(number), why.c_str());
    mail_.Send(dest, wire::ErrorReply{request_id, why});
  }

  std::optional<Request> Handle(Incoming& m) {
    auto known = m.source == FI_ADDR_NOTAVAIL ? clients_.end() : clients_.find(m.source);
    Client* c = known == clients_.end() ? nullptr : &known->second;
    // A connected client's messages carry its session token: one without it is a stranger's
    // that the provider credited to this client (docs/wire-protocol.md).
    const bool genuine = c != nullptr && wire::TokenOf(m.bytes) == c->session;
    wire::Message message;
    uint32_t token = 0;
    try {
      message = wire::Decode(m.bytes, &token);
    } catch (const wire::ProtocolError& e) {
      if (auto foreign = wire::PeekForeignConnect(m.bytes))
        ConnectOfAnotherVersion(*foreign, m.source);
      else if (genuine)
        Refuse(m.source, 0, e.what());
      else
        Diagnostic("dropped a message: %s\n", e.what());
      return std::nullopt;
    }
    if (genuine) c->last_seen = Clock::now();
    if (wire::IsServerMessage(message)) {  // answering one could start an endless exchange
      Diagnostic("dropped a server's message from %s: a server never answers one\n",
                 c ? ("client " + std::to_string(Name(c->number))).c_str() : "a stranger");
    } else if (auto* connect = std::get_if<wire::Connect>(&message)) {
      Connect(*connect, m.source, token);
    } else if (c == nullptr) {
      Diagnostic("dropped a message from a sender that did not CONNECT\n");
    } else if (!genuine) {
      Diagnostic("dropped a message for client %llu without its session token\n", Name(c->number));
    } else if (auto* transfer = std::get_if<wire::Transfer>(&message)) {
      try {
        for (const auto& region : c->regions) wire::ValidateTransfer(*transfer, region);
      } catch (const std::exception& e) {
        Refuse(m.source, transfer->request_id, e.what());
        return std::nullopt;
      }
      return Request{m.source, std::move(*transfer)};
    } else if (std::holds_alternative<wire::Bye>(message)) {
      Forget(m.source, "done");
    } else {  // a client of another stage (02's TEXT): told, not left to time out
      Refuse(m.source, 0, std::string(ProgramName()) + " serves no " + wire::NameOf(message));
    }
    return std::nullopt;
  }

  void Connect(const wire::Connect& connect, fi_addr_t source, uint32_t token) {
    // Peers are compared as the provider tells them apart: a second spelling of an address
    // (shm's "1234:0:1" for "fi_shm://1234:0:1") is the same peer.
    const auto& given = connect.reply.empty() ? connect.lanes[0].address : connect.reply;
    std::vector<uint8_t> reply = CanonicalAddress(given, format_);
    if (reply == CanonicalAddress(own_, format_)) {
      Diagnostic("dropped a CONNECT that names this server's own address\n");
      return;
    }
    fi_addr_t id = FI_ADDR_UNSPEC;
    try {
      id = departures_.Insert(given, [&](const auto& a) { return net_.AddPeerAddress(a); });
    } catch (const Error& e) {
      Diagnostic("dropped a CONNECT: %s\n", e.what());
      return;
    }
    if (!SpokeFromThere(id, source)) return;
    if (clients_.count(id) && clients_[id].nonce == token) return;  // a repeat
    const auto waited = waiting_.find(reply);
    const uint64_t number = waited != waiting_.end() ? waited->second.number : ++arrivals_;
    // Whoever names a connected client's address cannot be answered without answering that
    // client (its address reused while its session lasts): dropped until that one ends.
    if (clients_.count(id)) {
      Diagnostic(
          "dropped a CONNECT from client %llu: it names the address of a connected "
          "client\n",
          Name(number));
      return;
    }
    std::vector<std::vector<uint8_t>> lanes;
    for (const auto& lane : connect.lanes) lanes.push_back(CanonicalAddress(lane.address, format_));
    if (auto d = departed_.find(id); d != departed_.end()) {  // the same address in use again
      for (size_t l = 1; l < d->second.addresses.size(); ++l)
        hooks_.close_lane(l, d->second.addresses[l]);
      departed_.erase(d);
    }
    departures_.Revive(id);
    mail_.Seal(id, token);  // our answers carry the client's own token back
    std::string other;      // a client this stage cannot serve: told, not left to time out
    if (connect.stage != wire::OwnStage())
      other = std::string(ProgramName()) + " serves clients of its own stage; this CONNECT is " +
              "from " + wire::StageName(connect.stage);
    else if (!hooks_.open && reply != lanes[0])  // 03-06 answer and write to the same address
      other = "this CONNECT names a reply address apart from its lane 0";
    if (!other.empty()) {
      RefuseAs(id, number, 0, other);
      departed_[id] = {{id}, Clock::now()};
      return;
    }
    if (Claimed(lanes, reply, id, number, waited != waiting_.end())) return;
    if (waited != waiting_.end()) waiting_.erase(waited);
    if (!Full(id, number)) Admit(connect, id, number, token, std::move(reply), std::move(lanes));
  }

  // A CONNECT of another wire version: refused by name, from what every version keeps in place
  // (wire::kFirstStableVersion), as a CONNECT of another stage is.
  void ConnectOfAnotherVersion(const wire::ForeignConnect& c, fi_addr_t source) {
    fi_addr_t id = FI_ADDR_UNSPEC;
    try {
      id = departures_.Insert(c.reply, [&](const auto& a) { return net_.AddPeerAddress(a); });
    } catch (const Error& e) {
      Diagnostic("dropped a CONNECT of wire version %u: %s\n", unsigned{c.version}, e.what());
      return;
    }
    if (!SpokeFromThere(id, source) || clients_.count(id)) return;
    mail_.Seal(id, c.token);
    const std::string why = std::string(ProgramName()) + " speaks wire version " +
                            std::to_string(wire::kVersion) + "; this CONNECT (from " +
                            wire::StageName(c.stage) + ") is version " + std::to_string(c.version);
    std::printf("refused a CONNECT: %s\n", why.c_str());
    mail_.Send(id, wire::ErrorReply{0, why});
    departed_[id] = {{id}, Clock::now()};
  }

  // Answered only once one comes from the address it names: an address that has not spoken
  // is never sent to (docs/wire-protocol.md, "Answering only who spoke").
  bool SpokeFromThere(fi_addr_t id, fi_addr_t source) {
    if (source == id) return true;
    if (clients_.count(source))  // a client's first CONNECT comes from no client of ours:
      Diagnostic(                // said only when a connected client names another address
          "a CONNECT not from the address it names: answered once one comes from there\n");
    if (!clients_.count(id) && !departed_.count(id)) departed_[id] = {{id}, Clock::now()};
    for (fi_addr_t old : departures_.Unverified(id))  // the oldest leave the AV now
      if (auto d = departed_.find(old); d != departed_.end()) {
        Remove(old, d->second.addresses);
        departed_.erase(d);
      }
    return false;
  }

  // Whoever names a connected client's lanes would have us write into its region with its
  // keys: not answered while that session lasts. No two live endpoints share an address, so
  // either that client has died and its address (a tcp port) went to this one, whose
  // CONNECT, sent again, is answered once the dead session has ended; or this one claims a
  // live client's memory, and waits in vain.
  bool Claimed(const std::vector<std::vector<uint8_t>>& lanes, const std::vector<uint8_t>& reply,
               fi_addr_t id, uint64_t number, bool told) {
    for (const auto& [client, other] : clients_)
      for (size_t l = 0; l < other.lanes.size(); ++l)
        for (size_t k = 0; k < lanes.size(); ++k) {
          if (lanes[k] != other.lanes[l]) continue;
          if (!told)
            Diagnostic(
                "client %llu: its CONNECT waits: its lane %zu is lane %zu of client %llu, whose "
                "session has not ended (a client's lanes, regions and keys are its own)\n",
                Name(number), k, l, Name(other.number));
          waiting_[reply] = {number, client};
          departed_[id] = {{id}, Clock::now()};
          return true;
        }
    return false;
  }

  // Refuses a client the server has no room for (--max-clients, or the stage's own reason).
  // When full, a client that has moved nothing for kIdleYield (a stranger that CONNECTed and
  // stays silent) gives its place to the newcomer first.
  bool Full(fi_addr_t id, uint64_t number) {
    std::string why;
    if (options_.max_clients > 0 && clients_.size() >= options_.max_clients && !YieldPlace())
      why = std::string(wire::kBusy) + "server full: " + std::to_string(clients_.size()) +
            " clients (--max-clients)";
    if (why.empty()) why = hooks_.full();
    if (why.empty()) return false;
    RefuseAs(id, number, 0, why);
    departed_[id] = {{id}, Clock::now()};
    return true;
  }

  // Lane i of the client pairs with lane i of the server; extra lanes go unused.
  void Admit(const wire::Connect& connect, fi_addr_t id, uint64_t number, uint32_t token,
             std::vector<uint8_t> reply, std::vector<std::vector<uint8_t>> lanes) {
    Client client{number,
                  {id},
                  {connect.lanes[0].region},
                  std::move(reply),
                  std::move(lanes),
                  wire::NewToken(),
                  token,
                  Clock::now()};
    Opened opened;
    if (const std::string notice = hooks_.before_open(connect); !notice.empty()) {
      mail_.Send(id, wire::ErrorReply{0, notice});
      mail_.Flush(std::chrono::hours(1));  // posted now, before what may take long
    }
    try {
      opened = hooks_.open ? hooks_.open(connect, id) : OpenLanes(connect, client);
    } catch (const Busy& e) {  // no room now: the client may try again (wire::kBusy)
      RefuseAs(id, number, 0, std::string(wire::kBusy) + e.what());
      departed_[id] = {{id}, Clock::now()};
      return;
    } catch (const std::exception& e) {  // Error, no memory, no thread
      RefuseAs(id, number, 0, std::string("could not open a session: ") + e.what());
      departed_[id] = {{id}, Clock::now()};
      return;
    }
    if (hooks_.open)
      for (size_t l = 1; l < connect.lanes.size(); ++l)
        client.regions.push_back(connect.lanes[l].region);
    std::printf("client %llu connected: region of %llu bytes%s%s\n", Name(number),
                static_cast<unsigned long long>(connect.lanes[0].region.length),
                opened.describe.empty() ? "" : ", ", opened.describe.c_str());
    mail_.Send(id, wire::Accept{std::move(opened.writers), opened.setup_ns, client.session,
                                wire::OwnStage(), opened.source_bytes});
    clients_[id] = std::move(client);
  }

  // 03-06: the client's lanes past the first enter their lanes' AVs (06).
  Opened OpenLanes(const wire::Connect& connect, Client& client) {
    const size_t used = std::min(hooks_.lanes, connect.lanes.size());
    try {
      for (size_t l = 1; l < used; ++l) {
        client.addresses.push_back(hooks_.open_lane(l, connect.lanes[l].address));
        client.regions.push_back(connect.lanes[l].region);
      }
    } catch (const Error&) {
      for (size_t l = 1; l < client.addresses.size(); ++l)
        hooks_.close_lane(l, client.addresses[l]);
      throw;
    }
    const size_t writers = std::min(used, hooks_.writers.size());
    return {{hooks_.writers.begin(), hooks_.writers.begin() + writers},
            hooks_.lanes > 1 ? std::to_string(used) + " lanes" : "",
            0};
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

  // `tell`: what was queued for it gives way to its last message, why its session ended (an
  // ERROR of request id 0), which is still sent.
  void Drop(fi_addr_t client, const std::string& why, bool tell = false) {
    if (tell)
      mail_.Last(client, wire::ErrorReply{0, std::string(wire::kSessionEnded) + why +
                                                 " with no request open (--peer-timeout)"});
    else
      mail_.Forget(client);
    Forget(client, "lost: " + why);
  }

  // `client` is no client any more: the stage stops writing to it, and its addresses wait to
  // leave the AVs.
  void Forget(fi_addr_t client, const std::string& how) {
    auto c = clients_.find(client);
    if (c != clients_.end()) {
      ++served_;
      const uint64_t number = c->second.number;
      std::erase_if(waiting_, [&](const auto& w) { return w.second.on == client; });
      departed_[client] = {std::move(c->second.addresses), Clock::now()};
      clients_.erase(c);
      hooks_.leaving(client);
      if (hooks_.said) {
        hooks_.said(number, client, how);
      } else {
        std::printf("client %llu %s\n", Name(number), how.c_str());
        if (options_.json)  // 03-06 count no WRITEs per session, and have no engine
          PrintRecord(SessionRecord(Name(number), how)
                          .AddNull("writes")
                          .AddNull("bytes")
                          .AddNull("engine"));
      }
    } else if (!departed_.count(client)) {
      departed_[client] = {{client}, Clock::now()};
    }
  }

  void Remove(fi_addr_t id, const std::vector<fi_addr_t>& addresses) {
    if (clients_.count(id)) return;  // admitted again meanwhile
    mail_.Forget(id);                // nothing may be posted to an address that left the AV
    departures_.Remove(id);
    for (size_t l = 1; l < addresses.size(); ++l) hooks_.close_lane(l, addresses[l]);
  }

  Network& net_;
  Mail& mail_;
  const Options& options_;
  Hooks hooks_;
  std::vector<uint8_t> own_;
  uint32_t format_;
  Departures departures_;  // peers leave the AV here
  Clock::duration limit_, peer_timeout_;
  std::map<fi_addr_t, Client> clients_;
  std::deque<Incoming> inbox_;
  std::map<fi_addr_t, std::string> lost_;   // clients an operation failed for
  std::map<fi_addr_t, Departed> departed_;  // AV entries to remove once idle
  std::map<std::vector<uint8_t>, Wait> waiting_;
  uint64_t served_ = 0, arrivals_ = 0;
};

}  // namespace common
