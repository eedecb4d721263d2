#include "service.hpp"

#include <malloc.h>

#include <cstdio>
#include <deque>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include "address.hpp"
#include "backoff.hpp"
#include "completion.hpp"
#include "departures.hpp"
#include "endpoint.hpp"
#include "error.hpp"
#include "mailbox.hpp"
#include "program.hpp"
#include "report.hpp"

using namespace common;

namespace service {

namespace {

constexpr size_t kRecvDepth = 16;  // control messages the server keeps receives posted for
constexpr size_t kSendDepth = 16;
// Clients whose WRITEs never completed (Session::Leave: over shm, a WRITE to a killed client's
// endpoint) are never freed: past this many the server refuses new clients and says why,
// rather than let them hold the engine's queues for good.
constexpr size_t kMaxStuckSessions = 64;

using Mail = Mailbox<Endpoint, ControlOp>;

// What the service keeps for each connected client.
struct Client {
  uint64_t number = 0;                      // clients in order of arrival, for messages
  fi_addr_t control = FI_ADDR_UNSPEC;       // where our answers go, in the control AV
  std::vector<uint8_t> reply;               // that address, canonical (CanonicalAddress)
  std::vector<std::vector<uint8_t>> lanes;  // its lane addresses, canonical: nobody else may
                                            // claim them, in any spelling
  std::vector<wire::RemoteRegion> regions;  // per lane
  std::unique_ptr<Session> session;
  uint32_t session_token = 0;  // its messages carry it (docs/wire-protocol.md, "Tokens")
  uint32_t connect_token = 0;  // its CONNECT's: a CONNECT again with it is a repeat
  size_t open_requests = 0;
  bool leaving = false;  // said BYE: its open requests finish, then it goes
  Clock::time_point last_message, leaving_since{};
};

struct Received {
  std::vector<uint8_t> bytes;
  fi_addr_t source;
};

std::string Seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", s);
  return text;
}

// Sessions on their way out of the engine, asked again each round: a session's last line comes
// once its threads let it go; one whose WRITEs never complete is kept for good (its threads
// may still touch it). Nothing waits here: the other clients are served meanwhile.
class Leavers {
 public:
  void Start(uint64_t number, std::string how, std::unique_ptr<Session> session) {
    session->Leave();
    going_.push_back({number, std::move(how), std::move(session)});
  }
  void Settle() {
    std::erase_if(going_, [&](Entry& g) {
      const Session::Leaving state = g.session->Leave();
      if (state == Session::Leaving::kUnderway) return false;
      std::printf("client %llu %s: %s; control thread %.3f s since the server started\n",
                  static_cast<unsigned long long>(g.number), g.how.c_str(),
                  g.session->Totals().c_str(), ThreadCpuSeconds());
      if (state == Session::Leaving::kStuck) {
        std::printf("client %llu: WRITEs of its are still in the provider: its entry is kept\n",
                    static_cast<unsigned long long>(g.number));
        stuck_.push_back(std::move(g.session));
      }
      g.session.reset();
      malloc_trim(0);  // what the session's queues took goes back to the system
      return true;
    });
  }
  bool Going() const { return !going_.empty(); }
  size_t Stuck() const { return stuck_.size(); }
  // At exit: sessions a data thread may still hold are never freed; exit ends both.
  void Release() {
    for (auto& g : going_) (void)g.session.release();
    for (auto& s : stuck_) (void)s.release();
  }

 private:
  struct Entry {
    uint64_t number = 0;
    std::string how;
    std::unique_ptr<Session> session;
  };
  std::vector<Entry> going_;
  std::vector<std::unique_ptr<Session>> stuck_;  // WRITEs of theirs never completed
};

}  // namespace

int Serve(const Options& options, const fi_info& control, WaitMode wait, Engine& engine) {
  Endpoint net = Endpoint::Open(control, wait == WaitMode::kBlock);
  const std::vector<uint8_t> own_address = net.Address();
  PublishAddress(own_address, options.address_file);
  const auto limit =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.timeout_s));
  const auto peer_timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options.peer_timeout_s));

  Mail mail(net, kRecvDepth, kSendDepth);
  Departures departures(net.av.get(), *net.info, own_address);  // peers leave the control AV here
  std::map<uint64_t, Client> clients;       // by number: a number is never given out twice
  std::map<fi_addr_t, uint64_t> by_source;  // control address -> number
  std::deque<Received> inbox;
  std::map<fi_addr_t, std::string> lost;            // peers a send failed for
  std::map<fi_addr_t, Clock::time_point> departed;  // control AV entries to remove
  Leavers leavers;                                  // sessions leaving the engine
  uint64_t served = 0, arrivals = 0;
  // CONNECTs left unanswered while the client whose lanes they name is served, by the address
  // they answer to: the number each got and the client it waits on. Sent again every 0.5 s,
  // each keeps its number and its one line; forgotten when that client's session ends.
  struct Waiting {
    uint64_t number = 0, on = 0;
  };
  std::map<std::vector<uint8_t>, Waiting> waiting;

  auto on_done = [&](const fi_cq_data_entry& done, fi_addr_t source) {
    ControlOp* op = reinterpret_cast<ControlOp*>(done.op_context);
    if (!op->receive) {
      mail.Sent(op);
      return;
    }
    inbox.push_back({{op->buffer, op->buffer + done.len}, source});
    net.PostRecv(*op);
  };
  auto on_error = [&](const CompletionError& error) {
    ControlOp* op = reinterpret_cast<ControlOp*>(error.op_context);
    if (op == nullptr) {
      std::printf("a peer's operation failed: %s\n", error.text.c_str());
    } else if (op->receive) {  // too long for our buffers, or cut off
      std::printf("dropped a message: %s\n", error.text.c_str());
      net.PostRecv(*op);
    } else {
      lost.emplace(op->peer, error.text);
      mail.Sent(op);
    }
  };
  auto progress = [&] {
    const size_t n = ReadCompletions(net.cq.get(), true, on_done, on_error);
    for (fi_addr_t peer : mail.Flush(limit)) lost.emplace(peer, "does not take our messages");
    return n;
  };
  auto refuse = [&](fi_addr_t dest, uint64_t number, uint32_t request_id, const std::string& why) {
    std::printf("client %llu: refused: %s\n", static_cast<unsigned long long>(number), why.c_str());
    mail.Send(dest, wire::ErrorReply{request_id, why});
  };
  // Forgets a client and starts its session's leave; its last line comes once the engine let
  // it go (Leavers). Its control address leaves our AV once our last message to it left.
  auto close = [&](uint64_t number, const std::string& how) {
    auto it = clients.find(number);
    if (it == clients.end()) return;
    Client& c = it->second;
    leavers.Start(number, how, std::move(c.session));
    if (how.rfind("lost", 0) == 0) mail.Forget(c.control);
    by_source.erase(c.control);
    departed[c.control] = Clock::now();
    std::erase_if(waiting, [&](const auto& w) { return w.second.on == number; });
    clients.erase(it);
    ++served;
  };

  ControlNap nap;
  while (!StopRequested() && (options.exit_after == 0 || served < options.exit_after)) {
    bool busy = progress() > 0;
    for (const auto& [peer, why] : std::exchange(lost, {}))  // close() reads more of them
      if (auto it = by_source.find(peer); it != by_source.end()) close(it->second, "lost: " + why);

    // Each session: requests finished, failures, and signs of life.
    for (auto it = clients.begin(); it != clients.end();) {
      Client& c = (it++)->second;
      Session::Report report = c.session->Poll();
      for (const wire::Done& done : report.finished) {
        busy = true;
        if (c.open_requests > 0) --c.open_requests;
        std::printf("client %llu: %s: %llu WRITEs in %.3f s, pages filled in %.3f ms\n",
                    static_cast<unsigned long long>(c.number),
                    done.request_id == 0xffffffff
                        ? "warmup"
                        : ("request " + std::to_string(done.request_id)).c_str(),
                    static_cast<unsigned long long>(done.writes),
                    static_cast<double>(done.last_completion_ns - done.first_post_ns) / 1e9,
                    static_cast<double>(done.fill_ns) / 1e6);
        mail.Send(c.control, done);
      }
      for (const std::string& stall : report.stalls)
        std::printf("client %llu: %s\n", static_cast<unsigned long long>(c.number), stall.c_str());
      const auto now = Clock::now();
      // Liveness counts from the last sign of life: a message, or a WRITE that completed.
      const auto last_sign = std::max(c.last_message, report.last_completion);
      std::string why = report.failure;
      if (why.empty() && now - last_sign > peer_timeout)
        why = "silent for " + Seconds(std::chrono::duration<double>(now - last_sign).count());
      if (!why.empty()) {
        close(c.number, "lost: " + why);
      } else if (c.leaving && c.open_requests == 0) {
        close(c.number, "done");
      } else if (c.leaving && now - c.leaving_since > limit) {
        close(c.number,
              "done (" + std::to_string(c.open_requests) + " requests unfinished after its BYE)");
      }
    }
    leavers.Settle();
    // The engine: lines of its own, and whether it can go on.
    const Engine::Report engine_report = engine.Watch();
    for (const std::string& line : engine_report.lines) std::printf("engine: %s\n", line.c_str());
    if (!engine_report.fatal.empty()) {
      std::printf("server: the engine cannot go on: %s; exiting\n", engine_report.fatal.c_str());
      std::fflush(stdout);
      for (auto& [number, c] : clients) c.session.release();  // its threads may still use them
      leavers.Release();
      return kExitFailure;
    }
    std::erase_if(departed, [&](const auto& d) {
      if ((mail.Busy(d.first) || departures.Waiting(d.first)) && Clock::now() - d.second < limit)
        return false;
      if (!by_source.count(d.first)) {
        mail.Forget(d.first);  // nothing may be posted to an address that left the AV
        departures.Remove(d.first);
      }
      return true;
    });
    std::fflush(stdout);

    if (!busy && inbox.empty()) {  // control traffic is rare: do not spin on it
      if (wait == WaitMode::kBlock)
        net.Wait(10);
      else
        nap.Idle();  // 1 ms, doubling to 8 ms (common/backoff.hpp)
    } else {
      nap.Busy();
    }
    while (!inbox.empty()) {
      Received m = std::move(inbox.front());
      inbox.pop_front();
      auto known = m.source == FI_ADDR_NOTAVAIL ? by_source.end() : by_source.find(m.source);
      Client* c = known == by_source.end() ? nullptr : &clients.at(known->second);
      // A connected client's messages carry its session token: one without it is a
      // stranger's that the provider credited to this client (docs/wire-protocol.md).
      const bool genuine = c != nullptr && wire::TokenOf(m.bytes) == c->session_token;
      wire::Message message;
      uint32_t token = 0;
      try {
        message = wire::Decode(m.bytes, &token);
      } catch (const wire::ProtocolError& e) {
        if (genuine)
          refuse(c->control, c->number, 0, e.what());
        else
          std::printf("dropped a message: %s\n", e.what());
        continue;
      }
      if (genuine) c->last_message = Clock::now();
      if (wire::IsServerMessage(message)) {  // answering one could start an endless exchange
        std::printf("dropped a server's message from %s: a server never answers one\n",
                    c ? ("client " + std::to_string(c->number)).c_str() : "a stranger");
      } else if (auto* connect = std::get_if<wire::Connect>(&message)) {
        const std::vector<uint8_t> given =
            connect->reply.empty() ? connect->lanes[0].address : connect->reply;
        // Peers are compared as the provider tells them apart: a second spelling of an
        // address (shm's "1234:0:1" for "fi_shm://1234:0:1") is the same peer.
        const uint32_t format = net.info->addr_format;
        const std::vector<uint8_t> reply = CanonicalAddress(given, format);
        std::vector<std::vector<uint8_t>> lanes;
        for (const auto& lane : connect->lanes)
          lanes.push_back(CanonicalAddress(lane.address, format));
        if (reply == CanonicalAddress(own_address, format)) {
          std::printf("dropped a CONNECT that names this server's own address\n");
          continue;
        }
        fi_addr_t id = FI_ADDR_UNSPEC;
        try {
          id = departures.Insert(given, [&](const auto& a) { return net.Insert(a); });
        } catch (const Error& e) {
          std::printf("dropped a CONNECT: %s\n", e.what());
          continue;
        }
        // Answered only once one comes from the address it names: an address that has not
        // spoken is never sent to (docs/wire-protocol.md, "Answering only who spoke").
        if (m.source != id) {
          std::printf(
              "a CONNECT not from the address it names: answered once one comes from there\n");
          if (!by_source.count(id)) departed.emplace(id, Clock::now());
          for (fi_addr_t old : departures.Unverified(id))  // the oldest leave the AV now
            if (departed.erase(old)) {
              mail.Forget(old);
              departures.Remove(old);
            }
          continue;
        }
        if (auto it = by_source.find(id);
            it != by_source.end() && clients.at(it->second).connect_token == token)
          continue;  // a repeat of a CONNECT answered already
        // Whoever names a connected client's control address cannot be answered without
        // answering that client: dropped. Whoever names its lanes would have us write into
        // its region with its keys: not answered while that session lasts. No two live
        // endpoints share an address, so either that client has died and its address (a tcp
        // port) went to this one, whose CONNECT, sent again, is answered once the dead
        // session has ended; or this one claims a live client's memory, and waits in vain.
        for (auto it = clients.begin(); it != clients.end();) {  // a client that said BYE
          const Client& other = (it++)->second;                  // and comes again
          if (other.reply == reply && other.leaving) close(other.number, "done");
        }
        // (after the closes above, which may forget a waiting CONNECT)
        const auto waited = waiting.find(reply);
        const bool told_waiting = waited != waiting.end();
        const uint64_t number = told_waiting ? waited->second.number : ++arrivals;
        std::string claim;
        uint64_t claimed = 0;
        bool impostor = false;
        for (const auto& [n, other] : clients) {
          impostor = impostor || other.reply == reply;
          for (size_t l = 0; l < other.lanes.size() && claim.empty(); ++l)
            for (size_t k = 0; k < lanes.size() && claim.empty(); ++k)
              if (lanes[k] == other.lanes[l]) {
                claim = "lane " + std::to_string(k) + " is lane " + std::to_string(l) +
                        " of client " + std::to_string(n);
                claimed = n;
              }
        }
        if (impostor) {
          std::printf(
              "dropped a CONNECT from client %llu: it names the address of a connected "
              "client\n",
              static_cast<unsigned long long>(number));
          continue;
        }
        departed.erase(id);
        departures.Revive(id);
        if (auto old = by_source.find(id); old != by_source.end())  // an address reused
          close(old->second, "lost: replaced by a new CONNECT from its address");
        mail.Seal(id, token);  // our answers carry the client's own token back
        if (!claim.empty()) {
          if (!told_waiting)
            std::printf(
                "client %llu: its CONNECT waits: its %s, whose session has not ended (a "
                "client's lanes, regions and keys are its own)\n",
                static_cast<unsigned long long>(number), claim.c_str());
          waiting[reply] = {number, claimed};
          departed[id] = Clock::now();
          continue;
        }
        waiting.erase(reply);
        if (options.max_clients > 0 && clients.size() >= options.max_clients) {
          refuse(id, number, 0,
                 "server full: " + std::to_string(clients.size()) + " clients (--max-clients)");
          departed[id] = Clock::now();
          continue;
        }
        if (leavers.Stuck() >= kMaxStuckSessions) {  // each holds a window of the engine's queues
          refuse(id, number, 0,
                 std::to_string(leavers.Stuck()) +
                     " clients left WRITEs in the provider that never completed: restart this "
                     "server");
          departed[id] = Clock::now();
          continue;
        }
        // The client before it may still be leaving (its threads let it go within a round):
        // only once it is gone may the engine be rebuilt for this one (--ladder's next rung).
        for (const auto until = Clock::now() + std::chrono::milliseconds(50);
             clients.empty() && leavers.Going() && Clock::now() < until;) {
          leavers.Settle();
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        const auto opening = Clock::now();
        std::unique_ptr<Session> session;
        try {
          session = engine.Open(*connect);
        } catch (const std::exception& e) {  // Error, no memory, no thread
          refuse(id, number, 0, std::string("could not open a session: ") + e.what());
          departed[id] = Clock::now();
          continue;
        }
        const uint64_t setup_ns = static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - opening).count());
        Client& client = clients[number];
        client.number = number;
        client.control = id;
        client.reply = reply;
        client.lanes = lanes;
        for (const auto& lane : connect->lanes) client.regions.push_back(lane.region);
        client.session = std::move(session);
        client.session_token = wire::NewToken();
        client.connect_token = token;
        client.last_message = Clock::now();
        by_source[id] = number;
        std::printf("client %llu connected: region of %llu bytes, %s; set-up %.1f ms\n",
                    static_cast<unsigned long long>(number),
                    static_cast<unsigned long long>(connect->lanes[0].region.length),
                    client.session->Describe().c_str(), static_cast<double>(setup_ns) / 1e6);
        mail.Send(id, wire::Accept{client.session->Writers(), setup_ns, client.session_token});
      } else if (c == nullptr) {
        std::printf("dropped a message from a sender that did not CONNECT\n");
      } else if (!genuine) {
        std::printf("dropped a message for client %llu without its session token\n",
                    static_cast<unsigned long long>(c->number));
      } else if (auto* transfer = std::get_if<wire::Transfer>(&message)) {
        // A request names pages of its sender's region: the one its CONNECT advertised.
        std::string why;
        try {
          for (size_t l = 0; l < c->regions.size(); ++l)
            wire::ValidateTransfer(*transfer, c->regions[l]);
        } catch (const wire::ProtocolError& e) {
          why = e.what();
        }
        if (why.empty() && c->leaving) why = "it said BYE";
        if (why.empty() && c->open_requests >= options.max_requests)
          why = std::to_string(c->open_requests) + " requests in flight already (--max-requests " +
                std::to_string(options.max_requests) + ")";
        const uint32_t id = transfer->request_id;
        if (why.empty()) why = c->session->Dispatch(std::move(*transfer));
        if (!why.empty())
          refuse(c->control, c->number, id, why);
        else
          ++c->open_requests;
      } else if (std::holds_alternative<wire::Bye>(message)) {
        // Its open requests finish first (bounded by --timeout); nothing waits for them here.
        c->leaving = true;
        c->leaving_since = Clock::now();
      }
      std::fflush(stdout);
    }
  }
  while (!clients.empty()) close(clients.begin()->first, "stopped");
  // Every leave started at once: one patience for all. The control queue is still read: over
  // shm 1.17 a peer that closes before its first message is read crashes us
  // (docs/architecture.md).
  while (leavers.Going()) {
    progress();
    leavers.Settle();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  leavers.Release();
  std::printf("served %llu clients\n", static_cast<unsigned long long>(served));
  return kExitOk;
}

}  // namespace service
