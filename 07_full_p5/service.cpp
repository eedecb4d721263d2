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
constexpr auto kIdleYield = std::chrono::seconds(2);  // see Service::Full

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

// The service: the control endpoint, the table of clients, and what happens to each message.
// Each kind of event is a method; the members are what they share.
class Service {
 public:
  Service(const Options& options, const fi_info& control, WaitMode wait, Engine& engine);
  int Run();

 private:
  // CONNECTs left unanswered while the client whose lanes they name is served, by the address
  // they answer to: the number each got and the client it waits on. Sent again every 0.5 s,
  // each keeps its number and its one line; forgotten when that client's session ends.
  struct Waiting {
    uint64_t number = 0, on = 0;
  };
  // A live client's lane that a CONNECT names: which of its lanes, whose, and the line for it.
  struct Claim {
    std::string line;
    uint64_t client = 0;
  };
  size_t Progress();
  void OnCompletion(const fi_cq_data_entry& done, fi_addr_t source);
  void OnFailure(const CompletionError& error);
  void Refuse(fi_addr_t dest, uint64_t number, uint32_t request_id, const std::string& why);
  void Close(uint64_t number, const std::string& how);
  bool PollSessions();
  bool EngineCanGoOn();
  void ForgetDeparted();
  void Handle(Received m);
  void OnConnect(const wire::Connect& connect, fi_addr_t source, uint32_t token);
  bool SpokeFromThere(fi_addr_t id, fi_addr_t source);
  Claim FindClaim(const std::vector<std::vector<uint8_t>>& lanes) const;
  bool Full(fi_addr_t id, uint64_t number);
  void Admit(const wire::Connect& connect, fi_addr_t id, uint64_t number, uint32_t token,
             std::vector<uint8_t> reply, std::vector<std::vector<uint8_t>> lanes);
  void OnTransfer(Client& c, wire::Transfer transfer);

  const Options& options_;
  const WaitMode wait_;
  Engine& engine_;
  Endpoint net_;
  const std::vector<uint8_t> own_address_;
  const Clock::duration limit_, peer_timeout_;  // --timeout, --peer-timeout
  Mail mail_;
  Departures departures_;                    // peers leave the control AV here
  std::map<uint64_t, Client> clients_;       // by number: a number is never given out twice
  std::map<fi_addr_t, uint64_t> by_source_;  // control address -> number
  std::deque<Received> inbox_;
  std::map<fi_addr_t, std::string> lost_;            // peers a send failed for
  std::map<fi_addr_t, Clock::time_point> departed_;  // control AV entries to remove
  Leavers leavers_;                                  // sessions leaving the engine
  uint64_t served_ = 0, arrivals_ = 0;
  std::map<std::vector<uint8_t>, Waiting> waiting_;
  ControlNap nap_;
};

Clock::duration ToDuration(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

Service::Service(const Options& options, const fi_info& control, WaitMode wait, Engine& engine)
    : options_(options),
      wait_(wait),
      engine_(engine),
      net_(Endpoint::Open(control, wait == WaitMode::kBlock)),
      own_address_(net_.Address()),
      limit_(ToDuration(options.timeout_s)),
      peer_timeout_(ToDuration(options.peer_timeout_s)),
      mail_(net_, kRecvDepth, kSendDepth),
      departures_(net_.av.get(), *net_.info, own_address_) {
  PublishAddress(own_address_, options.address_file);
}
void Service::OnCompletion(const fi_cq_data_entry& done, fi_addr_t source) {
  ControlOp* op = reinterpret_cast<ControlOp*>(done.op_context);
  if (!op->receive) {
    mail_.Sent(op);
    return;
  }
  inbox_.push_back({{op->buffer, op->buffer + done.len}, source});
  net_.PostRecv(*op);
}
void Service::OnFailure(const CompletionError& error) {
  ControlOp* op = reinterpret_cast<ControlOp*>(error.op_context);
  if (op == nullptr) {
    std::printf("a peer's operation failed: %s\n", error.text.c_str());
  } else if (op->receive) {  // too long for our buffers, or cut off
    std::printf("dropped a message: %s\n", error.text.c_str());
    net_.PostRecv(*op);
  } else {
    lost_.emplace(op->peer, error.text);
    mail_.Sent(op);
  }
}
size_t Service::Progress() {
  const size_t n = ReadCompletions(
      net_.cq.get(), true,
      [this](const fi_cq_data_entry& done, fi_addr_t source) { OnCompletion(done, source); },
      [this](const CompletionError& error) { OnFailure(error); });
  for (fi_addr_t peer : mail_.Flush(limit_)) lost_.emplace(peer, "does not take our messages");
  return n;
}
void Service::Refuse(fi_addr_t dest, uint64_t number, uint32_t request_id, const std::string& why) {
  std::printf("client %llu: refused: %s\n", static_cast<unsigned long long>(number), why.c_str());
  mail_.Send(dest, wire::ErrorReply{request_id, why});
}
// Forgets a client and starts its session's leave; its last line comes once the engine let it
// go (Leavers). Its control address leaves our AV once our last message to it left.
void Service::Close(uint64_t number, const std::string& how) {
  auto it = clients_.find(number);
  if (it == clients_.end()) return;
  Client& c = it->second;
  leavers_.Start(number, how, std::move(c.session));
  if (how.rfind("lost", 0) == 0) mail_.Forget(c.control);
  by_source_.erase(c.control);
  departed_[c.control] = Clock::now();
  std::erase_if(waiting_, [&](const auto& w) { return w.second.on == number; });
  clients_.erase(it);
  ++served_;
}
// Each session: requests finished, failures, and signs of life. Returns whether one finished.
bool Service::PollSessions() {
  bool busy = false;
  for (auto it = clients_.begin(); it != clients_.end();) {
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
      mail_.Send(c.control, done);
    }
    for (const std::string& stall : report.stalls)
      std::printf("client %llu: %s\n", static_cast<unsigned long long>(c.number), stall.c_str());
    const auto now = Clock::now();
    // Liveness counts from the last sign of life: a message, or a WRITE that completed.
    const auto last_sign = std::max(c.last_message, report.last_completion);
    std::string why = report.failure;
    if (why.empty() && now - last_sign > peer_timeout_)
      why = "silent for " + Seconds(std::chrono::duration<double>(now - last_sign).count());
    if (!why.empty() && c.leaving) {  // it said BYE mid-request: what failed was for it
      Close(c.number,
            "done (" + std::to_string(c.open_requests) + " requests unfinished after its BYE)");
    } else if (!why.empty()) {
      Close(c.number, "lost: " + why);
    } else if (c.leaving && c.open_requests == 0) {
      Close(c.number, "done");
    } else if (c.leaving && now - c.leaving_since > limit_) {
      Close(c.number,
            "done (" + std::to_string(c.open_requests) + " requests unfinished after its BYE)");
    }
  }
  return busy;
}
// The engine: lines of its own, and whether it can go on.
bool Service::EngineCanGoOn() {
  const Engine::Report report = engine_.Watch();
  for (const std::string& line : report.lines) std::printf("engine: %s\n", line.c_str());
  if (report.fatal.empty()) return true;
  std::printf("server: the engine cannot go on: %s; exiting\n", report.fatal.c_str());
  std::fflush(stdout);
  for (auto& [number, c] : clients_) (void)c.session.release();  // its threads may still use them
  leavers_.Release();
  return false;
}
// Control AV entries of peers gone, removed once our last message to them left.
void Service::ForgetDeparted() {
  std::erase_if(departed_, [&](const auto& d) {
    if ((mail_.Busy(d.first) || departures_.Waiting(d.first)) && Clock::now() - d.second < limit_)
      return false;
    if (!by_source_.count(d.first)) {
      mail_.Forget(d.first);  // nothing may be posted to an address that left the AV
      departures_.Remove(d.first);
    }
    return true;
  });
}
// One message, from whoever sent it.
void Service::Handle(Received m) {
  auto known = m.source == FI_ADDR_NOTAVAIL ? by_source_.end() : by_source_.find(m.source);
  Client* c = known == by_source_.end() ? nullptr : &clients_.at(known->second);
  // A connected client's messages carry its session token: one without it is a stranger's
  // that the provider credited to this client (docs/wire-protocol.md).
  const bool genuine = c != nullptr && wire::TokenOf(m.bytes) == c->session_token;
  wire::Message message;
  uint32_t token = 0;
  try {
    message = wire::Decode(m.bytes, &token);
  } catch (const wire::ProtocolError& e) {
    if (genuine)
      Refuse(c->control, c->number, 0, e.what());
    else
      std::printf("dropped a message: %s\n", e.what());
    return;
  }
  if (genuine) c->last_message = Clock::now();
  if (wire::IsServerMessage(message)) {  // answering one could start an endless exchange
    std::printf("dropped a server's message from %s: a server never answers one\n",
                c ? ("client " + std::to_string(c->number)).c_str() : "a stranger");
  } else if (auto* connect = std::get_if<wire::Connect>(&message)) {
    OnConnect(*connect, m.source, token);
  } else if (c == nullptr) {
    std::printf("dropped a message from a sender that did not CONNECT\n");
  } else if (!genuine) {
    std::printf("dropped a message for client %llu without its session token\n",
                static_cast<unsigned long long>(c->number));
  } else if (auto* transfer = std::get_if<wire::Transfer>(&message)) {
    OnTransfer(*c, std::move(*transfer));
  } else if (std::holds_alternative<wire::Bye>(message)) {
    // A BYE before its requests are done (a client stopped by Ctrl-C, or a hostile one): they
    // are abandoned at once, so that a client that leaves takes no more from the others.
    if (c->open_requests > 0) {
      Close(c->number,
            "done (" + std::to_string(c->open_requests) + " requests unfinished after its BYE)");
      return;
    }
    c->leaving = true;
    c->leaving_since = Clock::now();
  } else {  // a client of another stage (02's TEXT): told, not left to time out
    Refuse(c->control, c->number, 0,
           std::string(common::ProgramName()) + " serves no " + wire::NameOf(message));
  }
}
// Answered only once one comes from the address it names: an address that has not spoken is
// never sent to (docs/wire-protocol.md, "Answering only who spoke").
bool Service::SpokeFromThere(fi_addr_t id, fi_addr_t source) {
  if (source == id) return true;
  if (by_source_.count(source))  // a client's first CONNECT comes from no client of ours:
    std::printf(                 // said only when a connected client names another address
        "a CONNECT not from the address it names: answered once one comes from there\n");
  if (!by_source_.count(id)) departed_.emplace(id, Clock::now());
  for (fi_addr_t old : departures_.Unverified(id))  // the oldest leave the AV now
    if (departed_.erase(old)) {
      mail_.Forget(old);
      departures_.Remove(old);
    }
  return false;
}
// Whoever names a connected client's lanes would have us write into its region with its keys:
// not answered while that session lasts. No two live endpoints share an address, so either
// that client has died and its address (a tcp port) went to this one, whose CONNECT, sent
// again, is answered once the dead session has ended; or this one claims a live client's
// memory, and waits in vain.
Service::Claim Service::FindClaim(const std::vector<std::vector<uint8_t>>& lanes) const {
  for (const auto& [n, other] : clients_)
    for (size_t l = 0; l < other.lanes.size(); ++l)
      for (size_t k = 0; k < lanes.size(); ++k)
        if (lanes[k] == other.lanes[l])
          return {"lane " + std::to_string(k) + " is lane " + std::to_string(l) + " of client " +
                      std::to_string(n),
                  n};
  return {};
}
void Service::OnConnect(const wire::Connect& connect, fi_addr_t source, uint32_t token) {
  const std::vector<uint8_t> given =
      connect.reply.empty() ? connect.lanes[0].address : connect.reply;
  // Peers are compared as the provider tells them apart: a second spelling of an address
  // (shm's "1234:0:1" for "fi_shm://1234:0:1") is the same peer.
  const uint32_t format = net_.info->addr_format;
  std::vector<uint8_t> reply = CanonicalAddress(given, format);
  std::vector<std::vector<uint8_t>> lanes;
  for (const auto& lane : connect.lanes) lanes.push_back(CanonicalAddress(lane.address, format));
  if (reply == CanonicalAddress(own_address_, format)) {
    std::printf("dropped a CONNECT that names this server's own address\n");
    return;
  }
  fi_addr_t id = FI_ADDR_UNSPEC;
  try {
    id = departures_.Insert(given, [&](const auto& a) { return net_.Insert(a); });
  } catch (const Error& e) {
    std::printf("dropped a CONNECT: %s\n", e.what());
    return;
  }
  if (!SpokeFromThere(id, source)) return;
  if (auto it = by_source_.find(id);
      it != by_source_.end() && clients_.at(it->second).connect_token == token)
    return;  // a repeat of a CONNECT answered already
  for (auto it = clients_.begin(); it != clients_.end();) {  // a client that said BYE
    const Client& other = (it++)->second;                    // and comes again
    if (other.reply == reply && other.leaving) Close(other.number, "done");
  }
  // (after the closes above, which may forget a waiting CONNECT)
  const auto waited = waiting_.find(reply);
  const bool told_waiting = waited != waiting_.end();
  const uint64_t number = told_waiting ? waited->second.number : ++arrivals_;
  // Whoever names a connected client's control address cannot be answered without answering
  // that client: dropped.
  for (const auto& [n, other] : clients_)
    if (other.reply == reply) {
      std::printf(
          "dropped a CONNECT from client %llu: it names the address of a connected "
          "client\n",
          static_cast<unsigned long long>(number));
      return;
    }
  const Claim claim = FindClaim(lanes);  // (before the close below: a session still leaving)
  departed_.erase(id);
  departures_.Revive(id);
  if (auto old = by_source_.find(id); old != by_source_.end())  // an address reused
    Close(old->second, "lost: replaced by a new CONNECT from its address");
  mail_.Seal(id, token);  // our answers carry the client's own token back
  if (!claim.line.empty()) {
    if (!told_waiting)
      std::printf(
          "client %llu: its CONNECT waits: its %s, whose session has not ended (a "
          "client's lanes, regions and keys are its own)\n",
          static_cast<unsigned long long>(number), claim.line.c_str());
    waiting_[reply] = {number, claim.client};
    departed_[id] = Clock::now();
    return;
  }
  waiting_.erase(reply);
  if (!Full(id, number)) Admit(connect, id, number, token, std::move(reply), std::move(lanes));
}
// Refuses a client the server has no room for: --max-clients, or too many stuck sessions.
// When full, a client that has moved nothing for kIdleYield (no request open, no message)
// gives its place to the newcomer first, so silent strangers cannot lock clients out.
bool Service::Full(fi_addr_t id, uint64_t number) {
  std::string why;
  if (options_.max_clients > 0 && clients_.size() >= options_.max_clients) {
    auto idlest = clients_.end();
    for (auto c = clients_.begin(); c != clients_.end(); ++c)
      if (c->second.open_requests == 0 && !c->second.leaving &&
          (idlest == clients_.end() || c->second.last_message < idlest->second.last_message))
        idlest = c;
    if (idlest != clients_.end() && Clock::now() - idlest->second.last_message >= kIdleYield)
      Close(idlest->first, "lost: idle while another client waited for its place");
  }
  if (options_.max_clients > 0 && clients_.size() >= options_.max_clients)
    why = "server full: " + std::to_string(clients_.size()) + " clients (--max-clients)";
  else if (leavers_.Stuck() >= kMaxStuckSessions)  // each holds a window of the engine's queues
    why = std::to_string(leavers_.Stuck()) +
          " clients left WRITEs in the provider that never completed: restart this server";
  if (why.empty()) return false;
  Refuse(id, number, 0, why);
  departed_[id] = Clock::now();
  return true;
}
// A session in the engine for the client, and ACCEPT.
void Service::Admit(const wire::Connect& connect, fi_addr_t id, uint64_t number, uint32_t token,
                    std::vector<uint8_t> reply, std::vector<std::vector<uint8_t>> lanes) {
  // The client before it may still be leaving (its threads let it go within a round): only
  // once it is gone may the engine be rebuilt for this one (--ladder's next rung).
  for (const auto until = Clock::now() + std::chrono::milliseconds(50);
       clients_.empty() && leavers_.Going() && Clock::now() < until;) {
    leavers_.Settle();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const auto opening = Clock::now();
  std::unique_ptr<Session> session;
  try {
    session = engine_.Open(connect);
  } catch (const std::exception& e) {  // Error, no memory, no thread
    Refuse(id, number, 0, std::string("could not open a session: ") + e.what());
    departed_[id] = Clock::now();
    return;
  }
  const uint64_t setup_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - opening).count());
  Client& client = clients_[number];
  client.number = number;
  client.control = id;
  client.reply = std::move(reply);
  client.lanes = std::move(lanes);
  for (const auto& lane : connect.lanes) client.regions.push_back(lane.region);
  client.session = std::move(session);
  client.session_token = wire::NewToken();
  client.connect_token = token;
  client.last_message = Clock::now();
  by_source_[id] = number;
  std::printf("client %llu connected: region of %llu bytes, %s; set-up %.1f ms\n",
              static_cast<unsigned long long>(number),
              static_cast<unsigned long long>(connect.lanes[0].region.length),
              client.session->Describe().c_str(), static_cast<double>(setup_ns) / 1e6);
  mail_.Send(id, wire::Accept{client.session->Writers(), setup_ns, client.session_token});
}
// A request names pages of its sender's region: the one its CONNECT advertised.
void Service::OnTransfer(Client& c, wire::Transfer transfer) {
  std::string why;
  try {
    for (size_t l = 0; l < c.regions.size(); ++l) wire::ValidateTransfer(transfer, c.regions[l]);
  } catch (const wire::ProtocolError& e) {
    why = e.what();
  }
  if (why.empty() && c.leaving) why = "it said BYE";
  if (why.empty() && c.open_requests >= options_.max_requests)
    why = std::to_string(c.open_requests) + " requests in flight already (--max-requests " +
          std::to_string(options_.max_requests) + ")";
  const uint32_t id = transfer.request_id;
  if (why.empty()) why = c.session->Dispatch(std::move(transfer));
  if (!why.empty())
    Refuse(c.control, c.number, id, why);
  else
    ++c.open_requests;
}
int Service::Run() {
  while (!StopRequested() && (options_.exit_after == 0 || served_ < options_.exit_after)) {
    bool busy = Progress() > 0;
    for (const auto& [peer, why] : std::exchange(lost_, {}))  // Close() reads more of them
      if (auto it = by_source_.find(peer); it != by_source_.end())
        Close(it->second, "lost: " + why);
    busy = PollSessions() || busy;
    leavers_.Settle();
    if (!EngineCanGoOn()) return kExitFailure;
    ForgetDeparted();
    std::fflush(stdout);
    if (!busy && inbox_.empty()) {  // control traffic is rare: do not spin on it
      if (wait_ == WaitMode::kBlock)
        net_.Wait(10);
      else
        nap_.Idle();  // 1 ms, doubling to 8 ms (common/backoff.hpp)
    } else {
      nap_.Busy();
    }
    while (!inbox_.empty()) {
      Received m = std::move(inbox_.front());
      inbox_.pop_front();
      Handle(std::move(m));
      std::fflush(stdout);
    }
  }
  while (!clients_.empty()) Close(clients_.begin()->first, "stopped");
  // Every leave started at once: one patience for all. The control queue is still read: over
  // shm 1.17 a peer that closes before its first message is read crashes us
  // (docs/architecture.md).
  while (leavers_.Going()) {
    Progress();
    leavers_.Settle();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  leavers_.Release();
  std::printf("served %llu clients\n", static_cast<unsigned long long>(served_));
  return kExitOk;
}

}  // namespace

int Serve(const Options& options, const fi_info& control, WaitMode wait, Engine& engine) {
  Service service(options, control, wait, engine);
  return service.Run();
}

}  // namespace service
