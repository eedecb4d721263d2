#include "service.hpp"

#include <malloc.h>

#include <cstdio>
#include <map>
#include <thread>
#include <utility>

#include "address.hpp"
#include "backoff.hpp"
#include "completion.hpp"
#include "endpoint.hpp"
#include "error.hpp"
#include "mailbox.hpp"
#include "program.hpp"
#include "reception.hpp"
#include "report.hpp"

using namespace common;

namespace service {

namespace {

constexpr size_t kRecvDepth = 16;  // control messages the server keeps receives posted for
constexpr size_t kSendDepth = 16;
// Clients whose WRITEs have not completed as they left (Session::Leave: over shm, a WRITE to a
// killed client's endpoint) are kept until they do: past this many at once the server exits,
// saying why, for its supervisor, rather than serve with its queues held.
constexpr size_t kMaxStuckSessions = 64;

using Mail = Mailbox<Endpoint, ControlOp>;
using Desk = Reception<Endpoint, ControlOp>;

// What the service keeps for a connected client besides the desk's table (common/reception.hpp):
// its session in the engine, by its control address.
struct Client {
  std::unique_ptr<Session> session;
  size_t open_requests = 0;
  // Its silence with requests open: when its process was last looked at, and whether the
  // server has said that it waits for it.
  Clock::time_point looked_at{};
  bool waiting_told = false;
  // Its silence with nothing open: when its process was last seen stopped, whether the
  // server has said it keeps its place, and what was seen when last looked at.
  Clock::time_point stopped_seen{};
  bool idle_told = false;
  Desk::Silent idle_seen = Desk::Silent::kDrop;
};
// A client with requests open whose WRITEs stopped completing for this long is looked at
// (common/peer_process.hpp), once a second: gone, it is dropped at once.
constexpr auto kLookAfter = std::chrono::seconds(1);

// Sessions on their way out of the engine, asked again each round: a session's last line comes
// once its threads let it go; one whose WRITEs never complete is kept for good (its threads
// may still touch it). Nothing waits here: the other clients are served meanwhile.
class Leavers {
 public:
  explicit Leavers(bool json) : json_(json) {}
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
      if (json_) {  // --json: the same, as a record (docs/record.schema.json)
        JsonRecord record = SessionRecord(g.number, g.how);
        g.session->AddTotals(record);
        PrintRecord(record);
      }
      if (state == Session::Leaving::kStuck) {
        std::printf(
            "client %llu: WRITEs of its are still in the provider: its entry is kept "
            "until they complete or fail\n",
            static_cast<unsigned long long>(g.number));
        stuck_.push_back({g.number, g.how, std::move(g.session)});
      }
      g.session.reset();
      malloc_trim(0);  // what the session's queues took goes back to the system
      return true;
    });
    // Kept entries are asked again: WRITEs that complete or fail late (a connection reset long
    // after its client was dropped) free them.
    std::erase_if(stuck_, [&](Entry& k) {
      if (k.session->Leave() != Session::Leaving::kDone) return false;
      std::printf("client %llu: its last WRITEs left the provider: its entry is freed\n",
                  static_cast<unsigned long long>(k.number));
      k.session.reset();
      malloc_trim(0);
      return true;
    });
  }
  bool Going() const { return !going_.empty(); }
  // The engine reopened its lanes (Engine::Reclaim): kept sessions' WRITEs went with them.
  void FreeKept() {
    for (auto& k : stuck_)
      std::printf("client %llu: its entry is freed: its WRITEs went with the lanes\n",
                  static_cast<unsigned long long>(k.number));
    stuck_.clear();
    malloc_trim(0);
  }
  size_t Stuck() const { return stuck_.size(); }
  // At exit: sessions a data thread may still hold are never freed; exit ends both.
  void Release() {
    for (auto& g : going_) (void)g.session.release();
    for (auto& k : stuck_) (void)k.session.release();
  }

 private:
  bool json_;
  struct Entry {
    uint64_t number = 0;
    std::string how;
    std::unique_ptr<Session> session;
  };
  std::vector<Entry> going_;
  std::vector<Entry> stuck_;  // WRITEs of theirs have not completed yet
};

// The service: the control endpoint, the front desk (who is a client) and each client's
// session in the engine. Each kind of event is a method; the members are what they share.
class Service {
 public:
  Service(const Options& options, const fi_info& control, WaitMode wait, Engine& engine);
  int Run();

 private:
  Desk::Hooks Hooks();
  Desk::Opened Open(const wire::Connect& connect, fi_addr_t id);
  void SettleLeavers();
  void Said(uint64_t number, fi_addr_t id, std::string how);
  size_t Progress();
  void OnCompletion(const fi_cq_data_entry& done, fi_addr_t source);
  void OnFailure(const CompletionError& error);
  bool PollSessions();
  std::string Silence(Client& c, unsigned long long number, Clock::time_point last_sign);
  bool EngineCanGoOn();
  void OnTransfer(Desk::Request request);

  const Options& options_;
  const WaitMode wait_;
  Engine& engine_;
  Endpoint net_;
  const Clock::duration limit_, peer_timeout_;  // --timeout, --peer-timeout
  Mail mail_;
  std::map<fi_addr_t, Client> clients_;  // sessions, by control address
  Leavers leavers_{options_.json};       // sessions leaving the engine
  Desk desk_;
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
      limit_(ToDuration(options.timeout_s)),
      peer_timeout_(ToDuration(options.peer_timeout_s)),
      mail_(net_, kRecvDepth, kSendDepth),
      desk_(net_, mail_, options, Hooks()) {
  PublishAddress(desk_.own_address(), options);
}
// What 07 adds to the desk: a client is busy while requests of its are open; its session is
// opened by the engine, and leaves it (Leavers) with the desk's word for how it went.
Desk::Hooks Service::Hooks() {
  Desk::Hooks hooks;
  hooks.busy = [this](fi_addr_t id) {
    auto c = clients_.find(id);
    return c != clients_.end() && c->second.open_requests > 0;
  };
  // Silent with nothing open, asked each round: its process, looked at once a second. Seen
  // stopped (shm: its pid's state) it keeps its place, said once, and resumed it has another
  // --peer-timeout to speak; seen there, it is told why it is dropped; gone or unseen, dropped.
  hooks.silent = [this](fi_addr_t id, uint64_t number) {
    auto it = clients_.find(id);
    if (it == clients_.end()) return Desk::Silent::kDrop;
    Client& c = it->second;
    const auto now = Clock::now();
    if (now - c.looked_at >= kLookAfter) {
      c.looked_at = now;
      const PeerProcess process = c.session->Process();
      if (process == PeerProcess::kStopped) {
        c.stopped_seen = now;
        if (!std::exchange(c.idle_told, true))
          std::printf(
              "client %llu: silent past --peer-timeout, but it is there (%s): it keeps "
              "its place\n",
              static_cast<unsigned long long>(number), Describe(process));
      }
      c.idle_seen = process == PeerProcess::kRunning || process == PeerProcess::kConnected
                        ? Desk::Silent::kTell
                        : Desk::Silent::kDrop;
    }
    if (c.idle_told && now - c.stopped_seen < peer_timeout_) return Desk::Silent::kKeep;
    return c.idle_seen;
  };
  hooks.open = [this](const wire::Connect& connect, fi_addr_t id) { return Open(connect, id); };
  hooks.before_open = [this](const wire::Connect& connect) {
    if (clients_.empty()) SettleLeavers();  // the one before may still be leaving
    return engine_.Notice(connect.engine);
  };
  hooks.said = [this](uint64_t number, fi_addr_t id, const std::string& how) {
    Said(number, id, how);
  };
  return hooks;
}
// A session in the engine for the client: the desk sends ACCEPT with its writers.
// Sessions leaving go within a round, once their threads let them go: 50 ms at most.
void Service::SettleLeavers() {
  for (const auto until = Clock::now() + std::chrono::milliseconds(50);
       leavers_.Going() && Clock::now() < until;) {
    leavers_.Settle();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}
Desk::Opened Service::Open(const wire::Connect& connect, fi_addr_t id) {
  // The client before it may still be leaving: only once it is gone may the engine be
  // rebuilt for this one (--ladder's next rung).
  if (clients_.empty()) SettleLeavers();
  const auto opening = Clock::now();
  std::unique_ptr<Session> session;
  try {
    session = engine_.Open(connect);
  } catch (const Busy&) {
    // A client just let go (an idle one that yielded its place to this one) holds its window
    // until it has left: then ask again.
    if (!leavers_.Going()) throw;
    SettleLeavers();
    session = engine_.Open(connect);
  }
  const uint64_t setup_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - opening).count());
  char setup[48];
  std::snprintf(setup, sizeof setup, "; set-up %.1f ms", static_cast<double>(setup_ns) / 1e6);
  Desk::Opened opened{session->Writers(), session->Describe() + setup, setup_ns,
                      session->SourceBytes()};
  clients_[id] = {std::move(session), 0};
  return opened;
}
// A client went ("done", "lost: why", "stopped"): its session starts to leave the engine, and
// its last line comes once the engine let it go (Leavers).
void Service::Said(uint64_t number, fi_addr_t id, std::string how) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  // A BYE before its requests are done (a client stopped by Ctrl-C, or a hostile one): they
  // are abandoned at once, so that a client that leaves takes no more from the others.
  if (how == "done" && it->second.open_requests > 0)
    how += " (" + std::to_string(it->second.open_requests) + " requests unfinished after its BYE)";
  leavers_.Start(number, how, std::move(it->second.session));
  clients_.erase(it);
}
void Service::OnCompletion(const fi_cq_data_entry& done, fi_addr_t source) {
  ControlOp* op = reinterpret_cast<ControlOp*>(done.op_context);
  if (!op->receive) {
    mail_.Sent(op);
    return;
  }
  desk_.Received({op->buffer, done.len}, source);
  net_.PostRecv(*op);
}
void Service::OnFailure(const CompletionError& error) {
  ControlOp* op = reinterpret_cast<ControlOp*>(error.op_context);
  if (op == nullptr) {
    Diagnostic("a peer's operation failed: %s\n", error.text.c_str());
  } else if (op->receive) {  // too long for our buffers, or cut off
    Diagnostic("dropped a message: %s\n", error.text.c_str());
    net_.PostRecv(*op);
  } else {
    desk_.Lost(op->peer, error.text);
    mail_.Sent(op);
  }
}
size_t Service::Progress() {
  const size_t n = ReadCompletions(
      net_.cq.get(), true,
      [this](const fi_cq_data_entry& done, fi_addr_t source) { OnCompletion(done, source); },
      [this](const CompletionError& error) { OnFailure(error); });
  for (fi_addr_t peer : mail_.Flush(limit_)) desk_.Lost(peer, "does not take our messages");
  return n;
}
// Each session: requests finished, failures, and signs of life. Returns whether one finished.
bool Service::PollSessions() {
  bool busy = false;
  for (auto& [id, c] : clients_) {
    const Desk::Client* client = desk_.Find(id);
    if (client == nullptr) continue;
    const auto number = static_cast<unsigned long long>(client->number);
    Session::Report report = c.session->Poll();
    for (const wire::Done& done : report.finished) {
      busy = true;
      if (c.open_requests > 0) --c.open_requests;
      std::printf("client %llu: %s: %llu WRITEs in %.3f s\n", number,
                  done.request_id == 0xffffffff
                      ? "warmup"
                      : ("request " + std::to_string(done.request_id)).c_str(),
                  static_cast<unsigned long long>(done.writes),
                  static_cast<double>(done.last_completion_ns - done.first_post_ns) / 1e9);
      mail_.Send(id, done);
      desk_.Seen(id);  // its silence counts from the end of its request
    }
    for (const std::string& stall : report.stalls)
      Diagnostic("client %llu: %s\n", number, stall.c_str());
    // While requests are open, a WRITE that completed is a sign of life too (the desk counts
    // only messages for a client with none open).
    const auto last_sign = std::max(client->last_seen, report.last_completion);
    std::string why = report.failure;
    if (why.empty() && c.open_requests > 0) why = Silence(c, number, last_sign);
    if (!why.empty()) desk_.Lost(id, why);
  }
  return busy;
}
// A client with requests open and no sign of life since `last_sign`: why it is dropped, or ""
// while it is kept. Silence is not death: a client whose process is still there (running or
// stopped) is slow, and keeps its place and its WRITEs in flight however long it takes; its
// window holds back no one else's. One that is gone is dropped as soon as that shows; where
// nothing can be seen of it (efa), silence past --peer-timeout is all there is to go by.
std::string Service::Silence(Client& c, unsigned long long number, Clock::time_point last_sign) {
  const auto now = Clock::now();
  const auto silent = now - last_sign;
  if (silent < kLookAfter) {
    if (c.waiting_told) std::printf("client %llu: its WRITEs complete again\n", number);
    c.waiting_told = false;
    return "";
  }
  if (now - c.looked_at < kLookAfter) return "";
  c.looked_at = now;
  const std::string for_how_long = FormatSeconds(silent);
  const PeerProcess process = c.session->Process();
  if (process == PeerProcess::kGone)
    return "it is gone (no WRITE of its completed for " + for_how_long + ")";
  // Nothing to see (efa), or a host that stopped answering TCP (a link down, a host gone, or a
  // blip): silence past --peer-timeout decides.
  if (process == PeerProcess::kUnknown)
    return silent > peer_timeout_ ? "silent for " + for_how_long : "";
  if (process == PeerProcess::kUnanswered)
    return silent > peer_timeout_ ? std::string(Describe(process)) +
                                        " (no WRITE of its completed for " + for_how_long + ")"
                                  : "";
  if (silent > peer_timeout_ && !c.waiting_told) {
    c.waiting_told = true;
    std::printf(
        "client %llu: no WRITE of its completed for %s, but it is there (%s): it keeps "
        "its place, and its WRITEs wait for it%s\n",
        number, for_how_long.c_str(), Describe(process), c.session->WaitingCosts().c_str());
  }
  return "";
}
// The engine: lines of its own, and whether it can go on.
bool Service::EngineCanGoOn() {
  Engine::Report report = engine_.Watch();
  // Kept sessions are looked at again each round (Leavers); this many at once is a provider
  // that neither completes nor fails WRITEs to peers that are gone: not a state to serve in.
  if (report.fatal.empty() && leavers_.Stuck() >= kMaxStuckSessions)
    report.fatal = std::to_string(leavers_.Stuck()) +
                   " clients that left have WRITEs in the provider that neither complete nor fail";
  for (const std::string& line : report.lines) std::printf("engine: %s\n", line.c_str());
  if (report.fatal.empty()) return true;
  // The provider and version it happened on, once, for whoever reads the supervisor's log.
  std::printf("server: the engine cannot go on (%s, libfabric %u.%u): %s; exiting\n",
              net_.info->fabric_attr->prov_name, FI_MAJOR(fi_version()), FI_MINOR(fi_version()),
              report.fatal.c_str());
  std::fflush(stdout);
  for (auto& [id, c] : clients_) (void)c.session.release();  // its threads may still use them
  leavers_.Release();
  return false;
}
// A request the desk validated against its sender's region, within the server's limits.
void Service::OnTransfer(Desk::Request request) {
  Client& c = clients_.at(request.client);
  std::string why;
  if (c.open_requests >= options_.max_requests)
    why = std::to_string(c.open_requests) + " requests in flight already (--max-requests " +
          std::to_string(options_.max_requests) + ")";
  const uint32_t request_id = request.transfer.request_id;
  if (why.empty()) why = c.session->Dispatch(std::move(request.transfer));
  if (!why.empty())
    desk_.Refuse(request.client, request_id, why);
  else
    ++c.open_requests;
}
int Service::Run() {
  while (desk_.Open()) {
    bool busy = Progress() > 0;
    desk_.Tend();
    busy = PollSessions() || busy;
    leavers_.Settle();
    // Kept sessions with no client connected: the engine takes their WRITEs back if it can.
    if (leavers_.Stuck() > 0 && clients_.empty() && !leavers_.Going() && engine_.Reclaim())
      leavers_.FreeKept();
    if (!EngineCanGoOn()) return kExitFailure;
    std::fflush(stdout);
    if (!busy && !desk_.Waiting()) {  // control traffic is rare: do not spin on it
      if (wait_ == WaitMode::kBlock)
        net_.Wait(10);
      else
        nap_.Idle();  // 1 ms, doubling to 8 ms (common/backoff.hpp)
    } else {
      nap_.Busy();
    }
    while (auto request = desk_.Next()) OnTransfer(std::move(*request));
  }
  desk_.Dismiss("stopped");
  // Every leave started at once: one patience for all. The control queue is still read: over
  // shm 1.17 a peer that closes before its first message is read crashes us
  // (docs/architecture.md).
  while (leavers_.Going()) {
    Progress();
    leavers_.Settle();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  leavers_.Release();
  std::printf("served %s\n", Plural(desk_.served(), "client").c_str());
  return kExitOk;
}

}  // namespace

int Serve(const Options& options, const fi_info& control, WaitMode wait, Engine& engine) {
  Service service(options, control, wait, engine);
  return service.Run();
}

}  // namespace service
