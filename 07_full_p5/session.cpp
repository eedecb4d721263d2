// 07_full_p5: a client's session on the server: its data threads (a thread per group of
// lanes), its endpoints and source memory, opened for one CONNECT, fed its requests, watched,
// and closed when it goes. The service (service.cpp) drives it through service::Session.

#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "engine.hpp"
#include "error.hpp"
#include "shm_lock.hpp"

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
  return s;
}
namespace {

// CPU time another thread of ours has used, in seconds (its pthread CPU clock); -1 if unknown.
double CpuSecondsOf(std::thread& t) {
  clockid_t clock{};
  timespec ts{};
  if (!t.joinable() || pthread_getcpuclockid(t.native_handle(), &clock) != 0 ||
      clock_gettime(clock, &ts) != 0)
    return -1;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}
// Where a thread of ours is now, as the kernel sees it (proc(5): /proc/self/task/TID/stat's
// state, its syscall and wchan): running, or waiting in a named system call, or in the kernel
// outside one (a page fault). This is what tells a thread stuck inside a provider call that
// spins (a lock, a busy loop) from one that waits on the network or on the kernel.
std::string WhereIs(pid_t tid) {
  const std::string dir = "/proc/self/task/" + std::to_string(tid) + "/";
  std::string stat, syscall_line, wchan;
  std::getline(std::ifstream(dir + "stat"), stat);
  std::getline(std::ifstream(dir + "syscall"), syscall_line);
  std::getline(std::ifstream(dir + "wchan"), wchan);
  const size_t paren = stat.rfind(')');  // the state follows the name, which may hold spaces
  const char state = paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : '?';
  if (syscall_line.empty()) return std::string("state ") + state;
  if (syscall_line.rfind("running", 0) == 0)
    return std::string("running in user space (state ") + state + ")";
  const long nr = std::strtol(syscall_line.c_str(), nullptr, 10);
  static const std::map<long, const char*> kNames = {
      {SYS_read, "read"},
      {SYS_write, "write"},
      {SYS_futex, "futex (a lock)"},
      {SYS_sendmsg, "sendmsg"},
      {SYS_recvmsg, "recvmsg"},
      {SYS_sendto, "sendto"},
      {SYS_recvfrom, "recvfrom"},
      {SYS_ppoll, "ppoll"},
      {SYS_epoll_pwait, "epoll_pwait"},
      {SYS_munmap, "munmap"},
      {SYS_madvise, "madvise"},
      {SYS_mmap, "mmap"},
      {SYS_ioctl, "ioctl"},
      {SYS_clock_nanosleep, "clock_nanosleep"},
#ifdef SYS_poll
      {SYS_poll, "poll"},
      {SYS_epoll_wait, "epoll_wait"},
      {SYS_nanosleep, "nanosleep"},
#endif
  };
  std::string where;
  if (nr < 0) {
    where = "in the kernel outside a system call (a page fault)";
  } else {
    const auto name = kNames.find(nr);
    where = "in system call " +
            (name != kNames.end() ? std::string(name->second) : "number " + std::to_string(nr));
    // Its first three arguments, as proc(5) gives them (hex): a poll's fd count and timeout in
    // ms tell the engine's own 100 ms wait on its lanes from a wait of the provider's.
    std::istringstream fields(syscall_line);
    std::string field, args;
    fields >> field;
    for (int i = 0; i < 3 && fields >> field; ++i) args += (i ? " " : "") + field;
    if (!args.empty()) where += ", arguments " + args;
  }
  where += std::string(" (state ") + state;
  if (!wchan.empty() && wchan != "0") where += ", waiting in " + wchan;
  return where + ")";
}

// What the stall line adds: the CPU the thread used since its last completion, and where it is.
std::string Whereabouts(Worker& w) {
  const double cpu = CpuSecondsOf(w.thread);
  std::string s = "; ";
  if (cpu >= 0 && w.cpu_at_completion >= 0)
    s += "since then it used " +
         FormatSeconds(std::chrono::duration_cast<Clock::duration>(
             std::chrono::duration<double>(cpu - w.cpu_at_completion))) +
         " of CPU, and ";
  return s + "it is now " + WhereIs(w.tid);
}

}  // namespace

// <rung pin>
std::string CoreWatch::Check(pid_t tid, unsigned cpu, const std::vector<unsigned>& given) {
  const auto now = Clock::now();
  if (moved_ || given.size() < 2 || now - window_ < std::chrono::seconds(1)) return "";
  const double window = std::chrono::duration<double>(now - window_).count();
  window_ = now;
  const auto sample = SampleCore(tid, cpu);
  if (!sample) return "";
  if (!first_) first_ = sample;
  const std::string kept = last_ ? KeptOffCore(*last_, *sample, window) : "";
  const auto before = last_;
  last_ = sample;
  if (kept.empty()) return "";
  // Off that core: a mask that still held it would leave the thread queued there.
  std::vector<unsigned> others;
  for (unsigned c : given)
    if (c != cpu) others.push_back(c);
  std::string why;
  const bool off = BindThreadTo(others, why, tid);
  moved_ = true;
  char steal[120];
  std::snprintf(steal, sizeof steal,
                "; the hypervisor took %.2f s of cpu %u since the thread was pinned (steal time)",
                sample->steal_s - first_->steal_s, cpu);
  return "kept off its core (cpu " + std::to_string(cpu) + "): " + kept + "; cpu " +
         std::to_string(cpu) + " meanwhile: " + CpuSplit(*before, *sample) + steal +
         (off ? "; it runs on cpus " + FormatCpuList(others) + " from now on"
              : "; it stays pinned: " + why);
}
// </rung pin>
// <rung threads>
size_t ThreadsFor(uint32_t asked, const Plan& plan, size_t lanes) {
  size_t threads = asked;
  if (threads == 0)
    threads = std::set<size_t>(plan.group_of.begin(), plan.group_of.begin() + lanes).size();
  return std::min(threads, lanes);
}
// </rung threads>
std::vector<std::vector<uint8_t>> Session::Writers() const {
  std::vector<std::vector<uint8_t>> all;
  for (const auto& w : workers) all.insert(all.end(), w->writers.begin(), w->writers.end());
  return all;
}
std::string Session::Describe() const {
  size_t buffers = 0;
  for (const auto& w : workers) buffers += w->pools.size();
  return std::to_string(regions.size()) + " lanes, " + DescribeEngine(engine, workers.size()) +
         ", source memory in " + std::to_string(buffers) + " buffer" + (buffers == 1 ? "" : "s") +
         " (one per group and thread)";
}
// Splits a validated request into one share per data thread and hands them over. A share
// larger than its thread's source memory could never be placed: refused.
std::string Session::Dispatch(wire::Transfer transfer) {
  auto request = std::make_shared<Request>();
  request->transfer = std::move(transfer);
  const wire::Transfer& t = request->transfer;
  request->done = {t.request_id, 0, UINT64_MAX, 0, 0};
  // A share per thread and source buffer: the pages of that thread's lanes of one group.
  std::map<std::pair<size_t, size_t>, std::unique_ptr<Share>> shares;
  for (size_t i = 0; i < t.pages.size(); ++i) {
    const size_t lane = i % regions.size(), w = owner[lane];
    const size_t pool = workers[w]->pool_of[lane - workers[w]->first_lane];
    auto& share = shares[{w, pool}];
    if (!share) share = std::make_unique<Share>();
    share->pool = pool;
    share->positions.push_back(static_cast<uint32_t>(i));
  }
  for (auto& [at, share] : shares) {
    share->bytes = share->positions.size() * t.page_size;
    const uint64_t holds = workers[at.first]->pools[at.second].memory.size();
    if (share->bytes > holds)
      return "request " + std::to_string(t.request_id) + " needs " + std::to_string(share->bytes) +
             " bytes of source memory in a buffer of " + std::to_string(holds) +
             " (what CONNECT asked for)";
  }
  request->shares_left = shares.size();
  for (auto& [at, share] : shares) {
    Worker& worker = *workers[at.first];
    share->request = request;
    share->total = share->positions.size() * t.repeat;
    {
      std::lock_guard lock(worker.inbox_mutex);
      worker.inbox.push_back(std::move(share));
      worker.has_inbox = true;
    }
    worker.inbox_ready.notify_all();
  }
  return "";
}
// A data thread that has not gone round its loop for --peer-timeout is stuck inside a
// provider call: libfabric 1.17's shm does that when a peer is killed while holding the
// spinlock of its shared-memory region, until common/shm_lock.cpp takes the lock over.
service::Session::Report Session::Poll() {
  Report report;
  {
    std::lock_guard lock(mutex);
    report.finished.swap(finished);
    report.failure = failure;
  }
  const auto limit = std::chrono::duration<double>(peer_timeout_s);
  // Told before --peer-timeout would drop the client for the same silence.
  const auto stall_told_after =
      std::min<Clock::duration>(kStallTold, std::chrono::duration_cast<Clock::duration>(limit / 2));
  for (size_t i = 0; i < workers.size(); ++i) {
    Worker* w = workers[i].get();
    const uint64_t rounds = w->rounds.load();
    if (rounds != w->rounds_seen) {
      w->rounds_seen = rounds;
      w->seen_at = Clock::now();
    }
    // WRITEs owed and none completed for stall_told_after since the last completion or new
    // share (Worker::last_work): said once, with what the thread did since, which tells the
    // three stalls apart: it went round with posts refused (the provider's queue is full), it
    // went round with every post taken (the provider or the peer holds the completions), or
    // it did not go round (stuck inside a provider call).
    const Clock::rep completed = w->last_work.load(std::memory_order_relaxed);
    if (completed != w->completion_seen) {
      w->completion_seen = completed;
      w->rounds_at_completion = rounds;
      w->refused_at_completion = w->refused.load(std::memory_order_relaxed);
      w->cpu_at_completion = CpuSecondsOf(w->thread);
      w->stall_told = false;
    }
    // Owed: WRITEs in flight, or none while a share of a request waits to be written (the
    // thread does not post: stuck in a provider call, or queued on a core something else took).
    const uint64_t owed = w->in_flight.load(std::memory_order_relaxed);
    const size_t held = w->shares_held.load(std::memory_order_relaxed);
    const auto quiet = Clock::now() - LastWork(*w);
    if (!w->stall_told && !w->exited && (owed > 0 || held > 0) && quiet > stall_told_after) {
      w->stall_told = true;
      report.stalls.push_back(
          "thread " + std::to_string(i) + ": no WRITE has completed for " +
          FormatSeconds(stall_told_after) + ", " +
          (owed > 0 ? std::to_string(owed) + " owed"
                    : "none in flight though " + std::to_string(held) + " share" +
                          (held == 1 ? " of a request waits" : "s of requests wait") +
                          " to be written") +
          "; since its last completion it went round " +
          std::to_string(rounds - w->rounds_at_completion) + " times and the provider refused " +
          std::to_string(w->refused.load(std::memory_order_relaxed) - w->refused_at_completion) +
          " posts (-FI_EAGAIN)" + Whereabouts(*w));
    }
    // <rung pin>
    if (On(wire::kEnginePin) && !pinned.empty() && w->cpu && !w->exited && w->tid != 0 &&
        cores != nullptr)
      if (std::string moved = w->core.Check(w->tid, *w->cpu, cores->given); !moved.empty())
        report.stalls.push_back("thread " + std::to_string(i) + ": " + moved);
    // </rung pin>
    if (report.failure.empty() && !w->exited && Clock::now() - w->seen_at > limit)
      report.failure = "a data thread has been stuck in the provider for " +
                       std::to_string(static_cast<int>(limit.count())) + " s";
    report.last_completion = std::max(
        report.last_completion, Clock::time_point{Clock::duration(w->last_completion.load())});
  }
  return report;
}
void Cores::Hold(const std::vector<unsigned>& cpus) {
  held.insert(cpus.begin(), cpus.end());
  if (!cpus.empty()) PlaceCaller();
}
void Cores::Release(const std::vector<unsigned>& cpus) {
  for (unsigned c : cpus)
    if (auto it = held.find(c); it != held.end()) held.erase(it);
  if (!cpus.empty()) PlaceCaller();
}
void Cores::PlaceCaller() const {
  std::string why;
  if (!BindThreadTo(ControlCpus(given, {held.begin(), held.end()}), why))
    std::printf("warning: the control thread stays where it was: %s\n", why.c_str());
}
// Stops the threads and waits for them; destroying the session then frees the rest. False
// when a thread is stuck in the provider and cannot be stopped: it is left running at idle
// priority (it only gets a CPU nobody else wants), and its session is never freed.
bool Session::Stop(const std::function<void()>& meanwhile) {
  stop = true;
  for (auto& w : workers) {
    {
      std::lock_guard lock(w->inbox_mutex);  // so no thread misses the wake-up
    }
    w->inbox_ready.notify_all();
  }
  // A loop takes <= 100 ms; a thread waiting on a dead client's lock is let go within the
  // patience of common/shm_lock.cpp.
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(std::max(2.0, kShmLockPatienceSeconds + 1)));
  bool all = true;
  for (auto& w : workers) {
    while (!w->exited && Clock::now() < deadline) {
      if (meanwhile) meanwhile();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (w->exited) {
      if (w->thread.joinable()) w->thread.join();
      continue;
    }
    sched_param idle{};
    sched_setscheduler(w->tid, SCHED_IDLE, &idle);
    w->thread.detach();
    all = false;
  }
  if (!all) Abandon();
  return all;
}
// A session with a stuck thread is never freed: the thread would read it the moment the
// provider let it go. But its host source memory goes back to the system (a late read gets
// zeros, not freed memory, and its client is gone), and no longer counts against
// --server-memory: otherwise each killed client that wedged a thread (1.17's shm) took its
// share of the budget for good, and once they filled it every new client was refused.
void Session::Abandon() {
  if (ready < workers.size()) return;  // a thread stuck opening its lanes may still be making them
  bool all_host = true;
  for (auto& w : workers)
    for (auto& pool : w->pools) all_host = pool.memory.DiscardHostPages() && all_host;
  if (all_host && reserved != nullptr) {
    *reserved -= reservation;
    reservation = 0;
  }
}
// The totals, and what each rung did, as the threads counted it.
std::string Session::Totals() const {
  uint64_t writes = shared.writes, bytes = shared.bytes, most_prepared = 0, posts = 0,
           doorbells = 0, in_poll = 0, moves = 0, completions = 0;
  std::string placement;
  double cpu = 0;
  size_t still_running = 0;
  for (const auto& w : workers) {  // sharded counters are summed only now
    if (w->exited)
      cpu += w->cpu_seconds;
    else
      ++still_running;
    writes += w->writes;
    bytes += w->bytes;
    most_prepared = std::max(most_prepared, w->most_prepared);
    posts += w->posts;
    doorbells += w->doorbells;
    in_poll += w->posted_in_poll;
    moves += w->core_moves;
    completions += w->completions;
    placement += (placement.empty() ? "" : "; ") + w->placement;
  }
  char line[512];
  std::snprintf(line, sizeof(line),
                "%llu WRITEs, %llu bytes; engine: %zu threads (%s), %llu lock acquisitions, "
                "at most %llu WRITEs prepared per visit, %.2f WRITEs per doorbell, %.2f per "
                "completion, %.0f%% posted from the CQ poll, %llu moves between cores",
                static_cast<unsigned long long>(writes), static_cast<unsigned long long>(bytes),
                workers.size(), placement.c_str(), static_cast<unsigned long long>(shared.locks),
                static_cast<unsigned long long>(most_prepared),
                doorbells ? static_cast<double>(posts) / static_cast<double>(doorbells) : 0.0,
                completions ? static_cast<double>(posts) / static_cast<double>(completions) : 0.0,
                posts ? 100.0 * static_cast<double>(in_poll) / static_cast<double>(posts) : 0.0,
                static_cast<unsigned long long>(moves));
  std::string text = line;
  char cpu_text[128];
  std::snprintf(cpu_text, sizeof(cpu_text), "; CPU: data threads %.3f s", cpu);
  text += cpu_text;
  if (still_running > 0)  // a thread stuck in the provider has not said what it used
    text += " (and " + std::to_string(still_running) + " still in the provider)";
  if (wire && !wire->empty()) {
    uint64_t sent = 0;
    const auto per_nic = wire->Bytes();
    for (const auto& [nic, b] : per_nic) sent += b;
    char wire_text[160];
    std::snprintf(wire_text, sizeof(wire_text),
                  "; NIC counters: %zu NIC%s sent %.1f MB on the wire while it was open",
                  per_nic.size(), per_nic.size() == 1 ? "" : "s", static_cast<double>(sent) / 1e6);
    text += wire_text;
  }
  return text;
}
// The engine the service drives: a session per CONNECT, its lanes dealt to its threads in
// contiguous blocks, which are the topology's groups when there is a thread per group.
std::unique_ptr<service::Session> Engine::Open(const wire::Connect& connect) {
  auto s = std::make_unique<Session>();
  // The client expects each lane's WRITEs on that lane: a lane the server lacks would never
  // be written, so a client with more lanes than the server is refused, not half served.
  if (connect.lanes.size() > plan_.lanes.size())
    throw Error("the client has " + std::to_string(connect.lanes.size()) + " lanes, this server " +
                std::to_string(plan_.lanes.size()) + " (start both with the same --nics)");
  const size_t used = connect.lanes.size();
  for (size_t l = 0; l < used; ++l) {
    s->addresses.push_back(connect.lanes[l].address);
    s->regions.push_back(connect.lanes[l].region);
  }
  s->engine = connect.engine;
  if (s->engine.window == 0) s->engine.window = static_cast<uint32_t>(options_.window);
  const size_t tx = plan_.lanes[0]->tx_attr->size;
  if (s->engine.window > tx || s->engine.doorbell > s->engine.window)
    throw Error("window " + std::to_string(s->engine.window) + " and doorbell " +
                std::to_string(s->engine.doorbell) + " must fit the provider's queue of " +
                std::to_string(tx) + " (doorbell <= window <= " + std::to_string(tx) + ")");
  if (s->engine.memory * used > options_.client_memory)
    throw Error("it asks for " + std::to_string(s->engine.memory * used) +
                " bytes of source memory, over this server's " +
                std::to_string(options_.client_memory) + " per client (--client-memory)");
  const uint64_t asked = s->engine.memory * used;
  if (reserved_ + asked > options_.server_memory)
    throw Error("it asks for " + std::to_string(asked) + " bytes of source memory, and the " +
                "sessions open hold " + std::to_string(reserved_.load()) + " of this server's " +
                std::to_string(options_.server_memory) + " for all (--server-memory)");
  reserved_ += asked;
  s->reserved = &reserved_;
  s->reservation = asked;
  s->wait = wait_;
  s->peer_timeout_s = options_.peer_timeout_s;
  s->memory = memory_;
  s->plan = &plan_;
  s->topology = &topology_;
  // <rung threads>
  const size_t threads = ThreadsFor(s->engine.threads, plan_, used);
  // </rung threads>
  // <without threads> const size_t threads = 1;
  std::map<const DeviceGroup*, size_t> per_group;  // threads placed in each group so far
  const bool here = IsThisSystem(topology_);       // not a rehearsal (--topology)
  for (size_t t = 0; t < threads; ++t) {
    auto w = std::make_unique<Worker>();
    w->session = s.get();
    w->first_lane = t * used / threads;
    w->lane_count = (t + 1) * used / threads - w->first_lane;
    w->group = &plan_.groups[plan_.group_of[w->first_lane]];
    // The group's cores among those this server was given (taskset, Slurm, a cpuset).
    const std::vector<unsigned> cpus =
        here ? CpusWithin(w->group->cpus, cores_.given) : w->group->cpus;
    if (!cpus.empty()) w->cpu = cpus[per_group[w->group]++ % cpus.size()];
    // <rung pin>
    if (here && s->On(wire::kEnginePin) && w->cpu) s->pinned.push_back(*w->cpu);
    // </rung pin>
    for (size_t l = 0; l < w->lane_count; ++l) s->owner.push_back(t);
    s->workers.push_back(std::move(w));
  }
  // The session's window, which threads share without sharding (--no-shard).
  s->shared.ops.resize(s->engine.window * used);
  for (auto& op : s->shared.ops) s->shared.free_ops.push_back(&op);
  for (auto& w : s->workers) w->thread = std::thread(RunWorker, std::ref(*w));
  // Opening lanes is this host's own work, not a peer's answer, so --timeout does not bound
  // it: libfabric 2.x's rxm zeroes its buffer pools in fi_endpoint (measured: 32 tcp lanes
  // took 2.5-4.7 s on an idle 2-core host, over 10 s with its cores busy). A minute, for a
  // provider stuck in an open call.
  const double open_s = std::max(options_.timeout_s, 60.0);
  const auto deadline = Clock::now() + std::chrono::duration<double>(open_s);
  while (s->ready < s->workers.size() && !s->stop && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::string why;
  {
    std::lock_guard lock(s->mutex);
    why = s->failure;
  }
  if (why.empty() && s->ready < s->workers.size())
    why = "its lanes did not open within " + std::to_string(static_cast<int>(open_s)) + " s";
  s->cores = &cores_;  // this (service) thread moves off the cores they now hold
  cores_.Hold(s->pinned);
  std::vector<std::string> domains;
  for (size_t l = 0; l < used; ++l) domains.push_back(plan_.lanes[l]->domain_attr->name);
  s->wire = std::make_unique<WireBytes>(domains, WireDirection::kSent);
  s->wire->Start();
  if (!why.empty()) {
    if (!s->Stop()) s.release();  // a thread is stuck in the provider: never freed
    throw Error(why);
  }
  return s;
}

}  // namespace p5
