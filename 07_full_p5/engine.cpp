// 07_full_p5: the engine and its clients. The engine opens its lanes (an endpoint, CQ and AV
// per NIC), its source memory and its data threads once; a client is an entry in it: its lane
// addresses in the lanes' AVs, its region, keys, window and requests, added for its CONNECT
// and removed when it goes. The service (service.cpp) drives both through service.hpp.
//
// A client's life in the engine (a Peer, and a PeerSlot per data thread that drives one of
// its lanes; the service's own record of it is service.cpp's Client):
//  1. Joining. Engine::Open checks its CONNECT (lanes, window, room for its commands; busy
//     otherwise), makes its Peer and hands each thread its slot (WorkerCommand::kJoin); the
//     thread puts its addresses into its lanes' AVs (TakeCommands) and sets `joined`.
//  2. Serving. Peer::Dispatch splits each request into shares, one per thread; the threads
//     post its WRITEs; Peer::Poll reports finished requests, failures and a stall (no WRITE
//     completed while some are in flight: told once, with where the thread is).
//  3. Leaving. BYE, a failure, or the service dropping it: Peer::Leave hands each slot back
//     (WorkerCommand::kLeave); a thread drops what it has not begun and waits for what is in
//     flight.
//  4. Left. Every thread let its slot go (`left`): its AV entries are removed (or kept where
//     the provider cannot remove them: Quirk::kRemoveNeedsMappedPeer), its window uncommitted,
//     its totals printed, the Peer freed.
//  5. Kept (Peer::stuck, Leaving::kStuck). Its WRITEs still in the provider kStuckSeconds after
//     it left (shm: WRITEs to a killed client): counted in Engine::held and `stuck_leaves`,
//     asked again each round by the service and freed once they complete or fail, or when
//     Engine::Reclaim reopens the lanes with no client connected; past kMaxStuckSessions
//     (service.cpp), or where they hold a lane's every command, the server says why and exits.
//  6. A thread stuck inside a provider call for good is not a client's state: the watchdog
//     says so and the program exits (common/provider_watch.hpp); nothing here waits on it.

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "engine.hpp"
#include "error.hpp"
#include "page_data.hpp"
#include "provider_watch.hpp"
#include "thread_state.hpp"

namespace p5 {

std::string DescribeEngine(const wire::Engine& e, size_t threads) {
  std::string s = std::to_string(threads) + " thread" + (threads == 1 ? "" : "s");
  s += (e.flags & wire::kEnginePin) ? ", pinned" : ", not pinned";
  s += (e.flags & wire::kEngineShard) ? ", sharded" : ", one shared state";
  s += ", batch " + std::to_string(e.batch);
  s += (e.flags & wire::kEngineLazy) ? ", lazy posting" : ", eager posting";
  s += (e.flags & wire::kEngineNuma) ? ", NUMA-bound" : ", no NUMA binding";
  s += ", doorbell " + std::to_string(e.doorbell);
  s += ", window " + std::to_string(e.window) + " per lane";
  if (e.flags & wire::kEngineLastImmediate) s += ", immediate data on each lane's last WRITE";
  return s;
}
namespace {

// What the stall line adds: the CPU the thread used since its last completion, and where it is.
std::string Whereabouts(PeerSlot& slot) {
  Worker& w = *slot.worker;
  const double cpu = CpuSecondsOf(w.thread);
  std::string s = "; ";
  if (cpu >= 0 && slot.watch.cpu_at_completion >= 0)
    s += "since then it used " +
         FormatSeconds(std::chrono::duration_cast<Clock::duration>(
             std::chrono::duration<double>(cpu - slot.watch.cpu_at_completion))) +
         " of CPU, and ";
  return s + "it is now " + WhereIs(w.tid);
}

}  // namespace

// <rung threads>
size_t ThreadsFor(uint32_t asked, const Plan& plan, size_t lanes) {
  size_t threads = asked;
  if (threads == 0)
    threads = std::set<size_t>(plan.group_of.begin(), plan.group_of.begin() + lanes).size();
  return std::min(threads, lanes);
}
// </rung threads>

// The engine's shape for what a client asks: the engine rungs it switches on.
Shape ShapeFor(const wire::Engine& asked, [[maybe_unused]] const Plan& plan) {
  Shape shape;
  // <rung threads>
  shape.threads = ThreadsFor(asked.threads, plan, plan.lanes.size());
  // </rung threads>
  // <rung pin>
  shape.pin = asked.flags & wire::kEnginePin;
  // </rung pin>
  // <rung shard>
  shape.shard = asked.flags & wire::kEngineShard;
  // </rung shard>
  // <rung numa>
  shape.numa = asked.flags & wire::kEngineNuma;
  // </rung numa>
  return shape;
}
uint32_t FlagsOf(const Shape& shape) {
  return (shape.pin ? wire::kEnginePin : 0) | (shape.shard ? wire::kEngineShard : 0) |
         (shape.numa ? wire::kEngineNuma : 0);
}
std::string DescribeShape(const Shape& shape) {
  return std::to_string(shape.threads) + " thread" + (shape.threads == 1 ? "" : "s") +
         (shape.pin ? ", pinned" : ", not pinned") +
         (shape.shard ? ", sharded" : ", one shared state") +
         (shape.numa ? ", NUMA-bound" : ", no NUMA binding");
}

// ---- A client: an entry in the engine ----

void Peer::Fail(const std::string& why) {
  std::lock_guard lock(mutex);
  if (failure.empty()) failure = why;
}
Peer::~Peer() {
  if (engine == nullptr) return;
  --engine->peers;
  Uncommit();
  if (!stuck || generation != engine->generation) return;  // a Build let its WRITEs go
  --engine->stuck_leaves;  // its WRITEs left the provider after all (Leavers)
  for (size_t l = 0; l < held_at.size() && l < engine->held.size(); ++l)
    engine->held[l] -= held_at[l];
}
uint64_t Peer::SourceBytes() const {
  return engine->source_bytes;
}
std::vector<std::vector<uint8_t>> Peer::Writers() const {
  std::vector<std::vector<uint8_t>> all;
  for (size_t l = 0; l < regions.size(); ++l) {
    const Worker& w = *engine->workers[engine->owner[l]];
    all.push_back(w.writers[l - w.first_lane]);
  }
  return all;
}
std::string Peer::Describe() const {
  std::set<size_t> buffers;  // its lanes' groups' source buffers
  for (size_t l = 0; l < regions.size(); ++l) buffers.insert(engine->plan.group_of[l]);
  return Plural(regions.size(), "lane") + ", " + DescribeEngine(settings, slots.size()) +
         ", the engine's source memory in " + Plural(buffers.size(), "buffer") + asked;
}
// Splits a validated request into one share per data thread, each page's
// source and target worked out here, on the control thread, and hands them over. Pages larger
// than the data set could come from nowhere: refused.
std::string Peer::Dispatch(wire::Transfer transfer) {
  auto request = std::make_shared<Request>();
  request->transfer = std::move(transfer);
  request->peer = this;
  const wire::Transfer& t = request->transfer;
  request->done = {t.request_id, 0, UINT64_MAX, 0};
  const uint64_t source = engine->source_bytes;
  if (t.page_size > source)
    return "request " + std::to_string(t.request_id) + ": pages of " + std::to_string(t.page_size) +
           " bytes, larger than this server's source pages (" + std::to_string(source) +
           " bytes a buffer: --server-memory over its buffers)";
  std::map<PeerSlot*, std::unique_ptr<Share>> shares;
  for (size_t i = 0; i < t.pages.size(); ++i) {
    const size_t lane = LaneOf(t.request_id, t.pages.size(), i, regions.size());
    PeerSlot* slot = at_lane[lane];
    auto& share = shares[slot];
    if (!share) share = std::make_unique<Share>();
    share->slot = slot;
    share->pages.push_back({SourceOffset(t.seed, t.pages[i], t.page_size, source),
                            t.pages[i] * t.page_size, lane - slot->worker->first_lane});
  }
  request->shares_left = shares.size();
  for (auto& [slot, share] : shares) {
    Worker& worker = *slot->worker;
    share->request = request;
    share->total = share->pages.size() * t.repeat;
    if (On(wire::kEngineLastImmediate) && t.request_id != kWarmupRequest) {
      share->unprepared.assign(worker.lane_count, 0);
      for (const Share::Page& page : share->pages) share->unprepared[page.lane] += t.repeat;
      share->unfinished.assign(worker.lane_count, 0);
      share->last.assign(worker.lane_count, nullptr);
    }
    worker.inbox.Push({WorkerCommand::kServe, slot, std::move(share)});
  }
  return "";
}
// What the data threads did for this client since the last call: requests finished, a
// failure, and a thread whose WRITEs to it stopped completing, told once per stall.
service::Session::Report Peer::Poll() {
  Report report;
  {
    std::lock_guard lock(mutex);
    report.finished.swap(finished);
    report.failure = failure;
  }
  // Told before --peer-timeout would drop the client for the same silence.
  const auto limit = std::chrono::duration<double>(engine->options.peer_timeout_s);
  const auto told_after =
      std::min<Clock::duration>(kStallTold, std::chrono::duration_cast<Clock::duration>(limit / 2));
  for (const auto& s : slots) {
    PeerSlot& slot = *s;
    Worker& w = *slot.worker;
    const uint64_t rounds = w.rounds.load(std::memory_order_relaxed);
    // WRITEs owed and none completed for told_after since the last completion or new share:
    // said once, with what the thread did since, which tells the three stalls apart: it
    // went round with posts refused (the provider's queue is full), it went round with every
    // post taken (the provider or the peer holds the completions), or it did not go round
    // (stuck inside a provider call).
    const Clock::rep work = slot.last_work.load(std::memory_order_relaxed);
    if (work != slot.watch.completion_seen) {
      slot.watch.completion_seen = work;
      slot.watch.rounds_at_completion = rounds;
      slot.watch.refused_at_completion = w.refused.load(std::memory_order_relaxed);
      slot.watch.cpu_at_completion = CpuSecondsOf(w.thread);
      slot.watch.stall_told = false;
    }
    const uint64_t owed = slot.in_flight.load(std::memory_order_relaxed);
    const size_t held = slot.shares_held.load(std::memory_order_relaxed);
    if (!slot.watch.stall_told && !w.exited && (owed > 0 || held > 0) &&
        Clock::now() - LastWork(slot) > told_after) {
      slot.watch.stall_told = true;
      report.stalls.push_back(
          "thread " + std::to_string(w.index) + ": no WRITE has completed for " +
          FormatSeconds(told_after) + ", " +
          (owed > 0 ? std::to_string(owed) + " owed"
                    : "none in flight though " + std::to_string(held) + " share" +
                          (held == 1 ? " of a request waits" : "s of requests wait") +
                          " to be written") +
          "; since its last completion it went round " +
          std::to_string(rounds - slot.watch.rounds_at_completion) +
          " times and the provider refused " +
          std::to_string(w.refused.load(std::memory_order_relaxed) -
                         slot.watch.refused_at_completion) +
          " posts (-FI_EAGAIN)" + Whereabouts(slot));
    }
    report.last_completion = std::max(
        report.last_completion, Clock::time_point{Clock::duration(slot.last_completion.load())});
  }
  return report;
}
std::string Peer::WaitingCosts() const {
  if (!Has(Quirk::kCompletesInOrder, *engine->plan.lanes[0])) return "";
  return "; libfabric 1.17's shm completes a lane's WRITEs in order, so every client on its "
         "lanes waits with it (README.md, \"Which provider keeps which promise\")";
}
// Its window leaves the lanes' promised commands: it has left, or is kept (Engine::held).
void Peer::Uncommit() {
  if (generation == engine->generation)
    for (size_t l = 0; l < regions.size() && l < engine->committed.size(); ++l)
      engine->committed[l] -= committed;
  committed = 0;
}
// Its process as seen through any of its lanes: there on one is there.
PeerProcess Peer::Process() const {
  PeerProcess seen = PeerProcess::kUnknown;
  for (size_t l = 0; l < addresses.size(); ++l) {
    const PeerProcess state = SeePeerProcess(*engine->plan.lanes[l], addresses[l]);
    if (state == PeerProcess::kRunning || state == PeerProcess::kStopped ||
        state == PeerProcess::kConnected)
      return state;
    if (state == PeerProcess::kUnanswered || seen == PeerProcess::kUnknown) seen = state;
  }
  return seen;
}
// Leaves the engine: each thread that serves it takes no new WRITE for it, waits for those in
// flight to complete (or fail), and only then removes its AV entries, so that no fi_addr is
// reused while an operation can still complete on it. Stuck when a thread has not let it go
// within a few seconds (its WRITEs never complete): the entry is then never freed.
service::Session::Leaving Peer::Leave() {
  if (!leaving_since) {
    leaving_since = Clock::now();
    for (auto& slot : slots) {
      // A slot its thread could not take (TakeCommands) has left already: handed over now, the
      // thread would read it after this Peer is freed, and a newcomer's slot allocated at the
      // same address would be the one it drops (a crowd's admitted client that got nothing).
      if (slot->left.load(std::memory_order_acquire)) continue;
      slot->worker->inbox.Push({WorkerCommand::kLeave, slot.get(), nullptr});
    }
  }
  if (std::all_of(slots.begin(), slots.end(), [](const auto& s) {
        return s->left.load(std::memory_order_acquire) || s->worker->exited;
      })) {
    Uncommit();
    return Leaving::kDone;
  }
  // A thread's loop takes <= 100 ms; one stuck in a provider call ends the program within
  // kStuckSeconds (common/provider_watch.hpp).
  const auto patience = std::chrono::duration<double>(kStuckSeconds + 1);
  if (Clock::now() - *leaving_since < patience) return Leaving::kUnderway;
  if (!stuck) {
    ++engine->stuck_leaves;
    Uncommit();  // counted in held from here
    // What it leaves in the provider: its WRITEs in flight, striped over its lanes of each
    // thread (its pending ones were dropped as it left); no lane holds more than its queue.
    held_at.assign(engine->held.size(), 0);
    for (const auto& slot : slots) {
      const uint64_t n = slot->in_flight.load(std::memory_order_relaxed);
      for (size_t i = 0; i < slot->lanes_used; ++i) {
        const size_t l = slot->worker->first_lane + i;
        const uint64_t room = engine->plan.lanes[l]->tx_attr->size - engine->held[l];
        held_at[l] = std::min<uint64_t>((n + slot->lanes_used - 1) / slot->lanes_used, room);
        engine->held[l] += held_at[l];
      }
    }
  }
  stuck = true;
  return Leaving::kStuck;
}
// What each rung did for this client, as its threads counted it (those that let it go).
struct Tally {
  uint64_t writes = 0, bytes = 0, most_prepared = 0, posts = 0, doorbells = 0, in_poll = 0,
           moves = 0, completions = 0;
  std::string placement;
  double cpu = 0;
  size_t still = 0;  // threads that still hold WRITEs of its
  double PerDoorbell() const { return doorbells ? double(posts) / double(doorbells) : 0.0; }
  double PerCompletion() const { return completions ? double(posts) / double(completions) : 0.0; }
  double InPoll() const { return posts ? 100.0 * double(in_poll) / double(posts) : 0.0; }
};
static Tally TallyOf(const Peer& peer) {
  Tally t;
  t.writes = peer.shared.writes;
  t.bytes = peer.shared.bytes;
  for (const auto& s : peer.slots) {
    const PeerSlot& slot = *s;
    t.placement += (t.placement.empty() ? "" : "; ") + slot.worker->placement;
    t.writes += slot.writes.load(std::memory_order_relaxed);
    t.bytes += slot.bytes.load(std::memory_order_relaxed);
    if (!slot.left.load(std::memory_order_acquire)) {  // its other counters are its thread's still
      ++t.still;
      continue;
    }
    t.most_prepared = std::max(t.most_prepared, slot.most_prepared);
    t.posts += slot.posts;
    t.doorbells += slot.doorbells;
    t.in_poll += slot.posted_in_poll;
    t.completions += slot.completions;
    t.moves += slot.worker->core_moves.load() - slot.moves_at_join;
    t.cpu += std::max(0.0, slot.cpu_at_leave - slot.cpu_at_join);
  }
  return t;
}
void Peer::AddTotals(JsonRecord& record) const {
  const Tally t = TallyOf(*this);
  JsonRecord engine = JsonRecord::Object();
  engine.Add("threads", uint64_t{slots.size()}).Add("placement", t.placement);
  engine.Add("lock_acquisitions", uint64_t{shared.locks}).Add("most_prepared", t.most_prepared);
  // Where the provider reads no FI_MORE, every WRITE is its own doorbell (the doorbell rung
  // then saves none): scripts/journey says so from here.
  const bool more =
      !slots.empty() && !slots[0]->worker->lanes.empty() && slots[0]->worker->lanes[0].reads_more;
  engine.AddBool("provider_reads_more", more);
  engine.Add("writes_per_doorbell", t.PerDoorbell(), 2)
      .Add("writes_per_completion", t.PerCompletion(), 2)
      .Add("percent_posted_in_poll", t.InPoll(), 1)
      .Add("core_moves", uint64_t{t.moves})
      .Add("cpu_seconds", t.cpu, 3);
  record.Add("writes", t.writes).Add("bytes", t.bytes).AddRaw("engine", engine.Text());
}
// The totals, and what each rung did for this client, as its threads counted it.
std::string Peer::Totals() const {
  const Tally t = TallyOf(*this);
  char line[512];
  std::snprintf(line, sizeof(line),
                "%llu WRITEs, %llu bytes; engine: %s (%s), %llu lock acquisitions, "
                "at most %llu WRITEs prepared per visit, %.2f WRITEs per doorbell, %.2f per "
                "completion, %.0f%% posted from the CQ poll, %llu moves between cores",
                static_cast<unsigned long long>(t.writes), static_cast<unsigned long long>(t.bytes),
                Plural(slots.size(), "thread").c_str(), t.placement.c_str(),
                static_cast<unsigned long long>(shared.locks),
                static_cast<unsigned long long>(t.most_prepared), t.PerDoorbell(),
                t.PerCompletion(), t.InPoll(), static_cast<unsigned long long>(t.moves));
  std::string text = line;
  // The threads serve every client: their CPU while this one was in the engine.
  char cpu_text[128];
  std::snprintf(cpu_text, sizeof(cpu_text), "; CPU: data threads %.3f s while it was connected",
                t.cpu);
  text += cpu_text;
  if (std::any_of(slots.begin(), slots.end(), [](const auto& s) {
        return s->left.load(std::memory_order_acquire) && s->entries_kept;
      }))
    text +=
        "; its entries stay in the lanes' AVs: no WRITE reached it, and libfabric 1.x's shm "
        "cannot remove a peer it never reached";
  if (t.still > 0)  // a thread that has not let it go has not said what it did
    text += " (and " + std::to_string(t.still) + " thread" + (t.still == 1 ? "" : "s") +
            " still holding WRITEs of its in the provider)";
  if (wire && !wire->empty()) {
    uint64_t sent = 0;
    const auto per_nic = wire->Bytes();
    for (const auto& [nic, b] : per_nic) sent += b;
    char wire_text[160];
    std::snprintf(wire_text, sizeof(wire_text),
                  "; NIC counters: %zu NIC%s sent %.1f MB on the wire while it was open",
                  per_nic.size(), per_nic.size() == 1 ? "" : "s", static_cast<double>(sent) / 1e6);
    text += wire_text;
    if (resent && !resent->empty()) {  // SRD's retransmissions: a lossy or congested path
      uint64_t again = 0;
      for (const auto& [nic, b] : resent->Bytes()) again += b;
      std::snprintf(wire_text, sizeof(wire_text), ", %.1f MB of them sent again (%.2f%%)",
                    static_cast<double>(again) / 1e6,
                    sent ? 100.0 * static_cast<double>(again) / static_cast<double>(sent) : 0.0);
      text += wire_text;
    }
  }
  return text;
}

// ---- The engine ----

void Cores::Hold(const std::vector<unsigned>& cpus) {
  held = cpus;
  std::string why;
  if (!BindThreadTo(ControlCpus(given, held), why))
    std::printf("warning: the control thread stays where it was: %s\n", why.c_str());
}
Engine::Engine(const Options& options_in, const Plan& plan_in, const Topology& topology_in,
               WaitMode wait_in, MemoryPath memory_in)
    : options(options_in), plan(plan_in), topology(topology_in), wait(wait_in), memory(memory_in) {
  cores.given = GivenCpus();  // before any thread pins itself
  MakeSources();
  Build(ShapeFor(EngineFromOptions(options), plan));
}
// The data set, made in a source buffer: in place in host memory (which touches every page:
// resident, on the node the making thread is bound to), through a host chunk and a copy for
// GPU memory (and its mirror, where the pages are staged).
void MakeSourcePages(PageBuffer& memory) {
  if (memory.path() == PageBuffer::Path::kHost) {
    FillSource({static_cast<uint8_t*>(memory.nic_data()), memory.size()}, 0);
    return;
  }
  HostBuffer chunk(std::min<size_t>(memory.size(), 64 << 20), Pages::kSmall);
  for (size_t at = 0; at < memory.size(); at += chunk.size()) {
    const size_t n = std::min(chunk.size(), memory.size() - at);
    FillSource({chunk.data(), n}, at);
    memory.Write(at, {chunk.data(), n});
  }
  memory.SyncToNic();
}
// The source pages, made once as the engine opens, before any client: a thread per group
// with lanes, its allocations bound to the group's NUMA node, all groups at once.
void Engine::MakeSources() {
  const std::set<size_t> groups(plan.group_of.begin(), plan.group_of.end());
  source_bytes = std::max<uint64_t>(options.server_memory / groups.size() / 4096 * 4096, 4096);
  sources.resize(plan.groups.size());
  std::vector<std::string> failures(plan.groups.size());
  const auto began = Clock::now();
  std::vector<std::thread> makers;
  for (size_t g : groups)
    makers.emplace_back([this, g, &failures] {
      try {
        const DeviceGroup& group = plan.groups[g];
        std::string why;
        if (IsThisSystem(topology) && !BindThreadMemory(topology, group.numa, why))
          Diagnostic("source pages of group %zu: not bound to node %d: %s\n", g, group.numa,
                     why.c_str());
        // Mapped, not zeroed first: making the pages touches every one of them.
        sources[g] = PageBuffer(source_bytes, memory, group.gpu.value_or(0), Pages::kHugeLazy);
        MakeSourcePages(sources[g]);
      } catch (const std::exception& e) {
        failures[g] = e.what();
      }
    });
  for (auto& t : makers) t.join();
  for (const auto& why : failures)
    if (!why.empty()) throw Error("the source pages could not be made: " + why);
  std::printf("engine: source pages made before any request: %zu buffer%s of %.0f MiB in %s\n",
              groups.size(), groups.size() == 1 ? "" : "s",
              static_cast<double>(source_bytes) / (1 << 20),
              FormatSeconds(Clock::now() - began).c_str());
}
// Stops the threads (a loop takes <= 100 ms); one that does not come back from the provider
// within kStopSeconds is said and left to the process's exit, with its lanes open.
constexpr int kStopSeconds = 3;
// Returns whether every thread stopped (none of them touches a client any more).
bool StopWorkers(std::vector<std::unique_ptr<Worker>>& workers) {
  bool all = true;
  for (auto& w : workers) {
    w->stop = true;
    w->inbox.Wake();
  }
  const auto deadline = Clock::now() + std::chrono::seconds(kStopSeconds);
  for (auto& w : workers) {
    while (!w->exited && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (w->exited) {
      if (w->thread.joinable()) w->thread.join();
    } else {
      std::printf(
          "engine: data thread %zu did not stop within %d s (it is %s): its lanes stay "
          "open until the process ends\n",
          w->index, kStopSeconds, WhereIs(w->tid).c_str());
      w->thread.detach();
      (void)w.release();  // its thread still uses it
      all = false;
    }
  }
  workers.clear();
  return all;
}
Engine::~Engine() {
  StopWorkers(workers);
}
bool Engine::On(uint32_t flag) const {
  return FlagsOf(shape) & flag;
}
// The lanes, dealt to the threads in contiguous blocks (the topology's groups when there is a
// thread per group); each thread on a core of its group, no two on one core while the group
// has cores left among those this server was given (taskset, Slurm, a cpuset).
void Engine::Build(const Shape& wanted) {
  stopped_clean = StopWorkers(workers);
  cores.claims.Release();
  owner.clear();
  held.assign(plan.lanes.size(), 0);  // the old lanes, and what their provider kept, are gone
  committed.assign(plan.lanes.size(), 0);
  stuck_leaves = 0;
  ++generation;
  shape = wanted;
  const size_t lanes = plan.lanes.size(), threads = shape.threads;
  const bool here = IsThisSystem(topology);  // not a rehearsal (--topology)
  std::set<unsigned> taken;
  std::vector<unsigned> pinned;
  for (size_t t = 0; t < threads; ++t) {
    auto w = std::make_unique<Worker>();
    w->engine = this;
    w->index = t;
    // <rung threads>
    w->first_lane = t * lanes / threads;  // thread t: the t-th contiguous block of lanes
    w->lane_count = (t + 1) * lanes / threads - w->first_lane;
    // </rung threads>
    // <without threads> w->lane_count = lanes;  // the one thread: every lane
    w->group = &plan.groups[plan.group_of[w->first_lane]];
    const std::vector<unsigned> cpus =
        here ? CpusWithin(w->group->cpus, cores.given) : w->group->cpus;
    // <rung pin>
    if (here && shape.pin) w->cpu = cores.claims.Take(cpus);  // a core no other process holds
    // </rung pin>
    for (unsigned c : cpus)
      if (!w->cpu && !taken.count(c)) w->cpu = c;
    if (!w->cpu && !cpus.empty()) w->cpu = cpus[t % cpus.size()];  // more threads than cores
    if (w->cpu) taken.insert(*w->cpu);
    // <rung pin>
    if (here && shape.pin && w->cpu) pinned.push_back(*w->cpu);
    // </rung pin>
    for (size_t l = 0; l < w->lane_count; ++l) owner.push_back(t);
    workers.push_back(std::move(w));
  }
  // New threads take this thread's cores: every given one, not those it kept to before.
  std::string why;
  if (!BindThreadTo(cores.given, why))
    std::printf("warning: the data threads start where the control thread was: %s\n", why.c_str());
  for (auto& w : workers) w->thread = std::thread(RunWorker, std::ref(*w));
  // Opening lanes is this host's own work, not a peer's answer, so --timeout does not bound
  // it (libfabric 2.x's rxm zeroes its buffer pools in fi_endpoint): a minute, for a provider
  // stuck in an open call.
  const double open_s = std::max(options.timeout_s, 60.0);
  const auto deadline = Clock::now() + std::chrono::duration<double>(open_s);
  auto opened = [&] {
    return std::all_of(workers.begin(), workers.end(),
                       [](const auto& w) { return w->ready.load() || w->exited.load(); });
  };
  while (!opened() && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  for (auto& w : workers)
    if (w->exited) throw Error("a data thread could not open its lanes: " + w->failure);
  if (!opened())
    throw Error("the data threads' lanes did not open within " +
                std::to_string(static_cast<int>(open_s)) + " s");
  cores.Hold(pinned);  // this (service) thread moves off the cores they hold
}
// What Open will do about an engine asked for that is not this one, said before it does: a
// rebuild, which the client waits for (closing 32 lanes, registering the sources again and
// opening them can take longer than its --timeout), or this engine as it is, which the
// client's ladder names in its row.
std::string Engine::Notice(const wire::Engine& asked) const {
  const Shape wanted = ShapeFor(asked, plan);
  if (wanted == shape) return "";
  if (peers == 0)
    return std::string(wire::kWait) + "the engine is rebuilt for this client (" +
           DescribeShape(wanted) + ")";
  return std::string(wire::kAsIs) + DescribeShape(shape) + ", not " + DescribeShape(wanted) +
         " (another client is on)";
}
uint64_t Engine::WindowRoom(size_t lane) const {
  const uint64_t queue = plan.lanes[lane]->tx_attr->size;
  if (!Has(Quirk::kHoldsCommandUntilAnswered, *plan.lanes[lane])) return kQueueTurns * queue;
  const uint64_t gone = lane < held.size() ? held[lane] : 0;
  return queue - std::min(queue, gone);
}
// A CONNECT: the client's entry in the lanes it has. An engine rung it asks for that the
// engine does not have is built for it when no other client is connected (--ladder's rungs,
// one client after another); otherwise it is served by the engine as it is, and told so.
std::unique_ptr<service::Session> Engine::Open(const wire::Connect& connect) {
  // The client expects each lane's WRITEs on that lane: a lane the server lacks would never
  // be written, so a client with more lanes than the server is refused, not half served.
  if (connect.lanes.size() > plan.lanes.size())
    throw Error("the client has " + std::to_string(connect.lanes.size()) + " lanes, this server " +
                std::to_string(plan.lanes.size()) + " (start both with the same --nics)");
  const size_t used = connect.lanes.size();
  wire::Engine settings = connect.engine;
  if (settings.window == 0) settings.window = static_cast<uint32_t>(options.window);
  const size_t tx = plan.lanes[0]->tx_attr->size;
  if (settings.window > tx || settings.doorbell > settings.window)
    throw Error("window " + std::to_string(settings.window) + " and doorbell " +
                std::to_string(settings.doorbell) + " must fit the provider's queue of " +
                std::to_string(tx) + " (doorbell <= window <= " + std::to_string(tx) + ")");
  const Shape wanted = ShapeFor(settings, plan);
  std::string asked;
  if (!(wanted == shape)) {
    if (peers == 0) {
      const auto began = Clock::now();
      Build(wanted);
      std::printf("engine rebuilt for the next client: %s; %s\n", DescribeShape(shape).c_str(),
                  FormatSeconds(Clock::now() - began).c_str());
    } else {
      asked = "; it asked for " + DescribeShape(wanted) + ", which waits until no client is on";
    }
  }
  // Where a WRITE to a client killed mid-transfer keeps its command for good
  // (Quirk::kHoldsCommandUntilAnswered), a newcomer is taken only if its window fits beside every
  // connected client's whole window and what the gone ones hold: then no death to come can
  // leave a live client without a command to post (a dead client holds at most its window).
  // Else busy, until the clients connected now are done and the lanes are reopened (Reclaim),
  // which gives the held commands back. Elsewhere back-pressure shares the queue (below).
  for (size_t l = 0; l < used; ++l) {
    const uint64_t queue = plan.lanes[l]->tx_attr->size;
    if (!Has(Quirk::kHoldsCommandUntilAnswered, *plan.lanes[l]) ||
        committed[l] + settings.window <= WindowRoom(l))
      continue;
    throw Busy("lane " + std::to_string(l) + "'s " + std::to_string(queue) + " WRITE commands: " +
               std::to_string(committed[l]) + " promised to the clients connected" +
               (held[l] > 0 ? ", " + std::to_string(held[l]) +
                                  " held by clients gone mid-transfer (shm keeps those until "
                                  "the clients connected now are done and the lane is reopened)"
                            : " (shm keeps a killed client's for good: none is promised twice)"));
  }
  // A crowd: clients take turns in a lane's queue (back-pressure), each visit of the data
  // thread posting what the queue has room for. Past kQueueTurns queues' worth of windows a
  // newcomer would wait more turns than that for its first WRITE while every client is slowed,
  // so it is told busy now instead (its own exit code; it may try again).
  for (size_t l = 0; l < used; ++l)
    if (committed[l] + settings.window > WindowRoom(l))
      throw Busy("lane " + std::to_string(l) + " serves windows of " +
                 std::to_string(committed[l]) + " WRITEs, " + std::to_string(kQueueTurns) +
                 " times its queue of " + std::to_string(plan.lanes[l]->tx_attr->size));
  for (size_t l = 0; l < used; ++l) committed[l] += settings.window;
  auto p = std::make_unique<Peer>();
  p->engine = this;
  p->generation = generation;
  p->committed = settings.window;
  ++peers;  // from here its destructor counts it out
  p->asked = asked;
  p->settings = settings;
  // The shape's flags are the engine's; how its WRITEs are posted and marked, the client's.
  p->settings.flags =
      FlagsOf(shape) | (settings.flags & (wire::kEngineLazy | wire::kEngineLastImmediate));
  p->settings.threads = static_cast<uint32_t>(shape.threads);
  for (size_t l = 0; l < used; ++l) {
    p->addresses.push_back(connect.lanes[l].address);
    p->regions.push_back(connect.lanes[l].region);
  }
  // --no-shard: one window for all its threads.
  p->shared.ops.resize(settings.window * used);
  for (auto& op : p->shared.ops) p->shared.free_ops.push_back(&op);
  for (auto& w : workers) {
    if (w->first_lane >= used) break;
    auto slot = std::make_unique<PeerSlot>();
    slot->peer = p.get();
    slot->worker = w.get();
    slot->lanes_used = std::min(w->lane_count, used - w->first_lane);
    slot->pending.resize(w->lane_count);
    for (auto& queue : slot->pending) queue.Reserve(settings.window * slot->lanes_used);
    slot->held_back.assign(w->lane_count, 0);
    // <rung shard>
    if (shape.shard) {  // its window on this thread's lanes, the thread's alone
      slot->ops.resize(settings.window * slot->lanes_used);
      for (auto& op : slot->ops) slot->free_ops.push_back(&op);
    }
    // </rung shard>
    for (size_t l = 0; l < slot->lanes_used; ++l) p->at_lane.push_back(slot.get());
    p->slots.push_back(std::move(slot));
  }
  // Its entries go into the AVs by the threads that own the lanes (FI_THREAD_DOMAIN: one
  // thread at a time uses a domain).
  for (auto& slot : p->slots) slot->worker->inbox.Push({WorkerCommand::kJoin, slot.get(), nullptr});
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  auto joined = [&] {
    return std::all_of(p->slots.begin(), p->slots.end(),
                       [](const auto& s) { return s->joined.load(std::memory_order_acquire); });
  };
  while (!joined() && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  std::string why;
  {
    std::lock_guard lock(p->mutex);
    why = p->failure;
  }
  if (why.empty() && !joined()) why = "the data threads did not take it within 10 s";
  if (!why.empty()) {
    using Leaving = service::Session::Leaving;
    Leaving state;  // it has no WRITE yet: its threads let it go within a round
    while ((state = p->Leave()) == Leaving::kUnderway)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (state == Leaving::kStuck) (void)p.release();  // a thread still holds it: never freed
    throw Error(why);
  }
  std::vector<std::string> domains;
  for (size_t l = 0; l < used; ++l) domains.push_back(plan.lanes[l]->domain_attr->name);
  p->wire = std::make_unique<WireBytes>(domains, WireDirection::kSent);
  p->wire->Start();
  p->resent = std::make_unique<WireBytes>(domains, WireDirection::kRetransmitted);
  p->resent->Start();
  return p;
}
// Once a round: a thread that has not gone round for kWedgedSeconds is stuck inside a
// provider call, and the engine cannot go on without it. The bound is no client's silence
// (--peer-timeout): a loaded host delays a round by milliseconds, never by this much, and
// shm's known spins are ended sooner by the watchdog (common/provider_watch.hpp). Slow is not
// stuck: time this (control) thread did not run (the server stopped by Ctrl-Z or a debugger,
// or starved) is not counted, and a thread stuck is one that spun (it used CPU for at least
// half that time) or sleeps in the kernel; one that is runnable and kept waiting for a core
// is slow.
constexpr double kWedgedSeconds = kSlowCallSeconds;
service::Engine::Report Engine::Watch() {
  Report report;
  const auto limit = std::chrono::duration<double>(kWedgedSeconds);
  const auto now = Clock::now();
  if (const auto gap = now - watched_at; gap > std::chrono::seconds(1))
    for (auto& w : workers) w->watch.seen_at += gap;
  watched_at = now;
  for (auto& wp : workers) {
    Worker& w = *wp;
    const uint64_t rounds = w.rounds.load(std::memory_order_relaxed);
    if (rounds != w.watch.rounds_seen) {
      w.watch.rounds_seen = rounds;
      w.watch.seen_at = now;
      w.watch.cpu_at_seen = CpuSecondsOf(w.thread);
    }
    if (w.exited) {
      if (report.fatal.empty())
        report.fatal = "data thread " + std::to_string(w.index) + " ended: " + w.failure;
      continue;
    }
    const auto still = now - w.watch.seen_at;
    if (!report.fatal.empty() || still <= limit) continue;
    const double cpu = CpuSecondsOf(w.thread);
    const double spent = cpu >= 0 && w.watch.cpu_at_seen >= 0 ? cpu - w.watch.cpu_at_seen : -1;
    const char state = ThreadState(w.tid);
    if (spent >= 0 && spent < 0.5 * kWedgedSeconds && state == 'R') continue;  // kept waiting
    report.fatal = "data thread " + std::to_string(w.index) + " has been stuck in the " +
                   "provider for " + FormatSeconds(still) +
                   (spent >= 0 ? ", using " +
                                     FormatSeconds(std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(spent))) +
                                     " of CPU"
                               : std::string()) +
                   "; it is now " + WhereIs(w.tid);
  }
  // After a thread stuck in the provider (above), which may be why the leave stuck.
  if (report.fatal.empty() && stuck_leaves > 0 && Has(Quirk::kCompletesInOrder, *plan.lanes[0]))
    report.fatal =
        "a client left WRITEs in flight that never complete, and libfabric 1.17's shm "
        "completes a lane's WRITEs in order: none would complete again (README.md, "
        "\"Which provider keeps which promise\")";
  // Where every command of a lane is held, the clients still on it can post nothing, and the
  // lanes cannot be reopened under them (Reclaim waits for no client to be connected).
  for (size_t l = 0; l < held.size() && report.fatal.empty(); ++l) {
    const uint64_t queue = plan.lanes[l]->tx_attr->size;
    if (!Has(Quirk::kHoldsCommandUntilAnswered, *plan.lanes[l]) || held[l] < queue ||
        peers == stuck_leaves)
      continue;
    report.fatal = "clients killed mid-transfer hold all " + std::to_string(queue) +
                   " WRITE commands of lane " + std::to_string(l) +
                   ", and the clients connected now can post none (README.md, \"Which provider "
                   "keeps which promise\")";
  }
  return report;
}
// Sessions kept with no client connected: reopening the lanes (a Build of the same shape)
// takes back what the provider held for them: the WRITE commands shm from 1.18 keeps until a
// peer answers, and whatever tcp keeps for a peer that never answered. Not where 1.17's shm
// completes in order (Watch ends the server at the first kept session there).
bool Engine::Reclaim() {
  if (stuck_leaves == 0 || peers != stuck_leaves || Has(Quirk::kCompletesInOrder, *plan.lanes[0]))
    return false;
  const size_t kept = stuck_leaves;
  uint64_t commands = 0;
  for (uint64_t h : held) commands += h;
  const auto began = Clock::now();
  Build(shape);
  if (!stopped_clean) return false;  // a thread that did not stop may touch them still
  std::printf(
      "engine: lanes reopened to take back what %zu client%s gone mid-transfer left in "
      "the provider (%llu WRITEs); %s\n",
      kept, kept == 1 ? "" : "s", static_cast<unsigned long long>(commands),
      FormatSeconds(Clock::now() - began).c_str());
  return true;
}

}  // namespace p5
