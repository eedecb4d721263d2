// 07_full_p5: a data thread of the server, and the rungs of the ladder it climbs. Each rung
// is code behind its own switch, marked <rung NAME> ... </rung NAME>; where the rung below
// has a line of its own instead, it follows as "// <without NAME> CODE". `scripts/rung-diff
// NAME` writes the rung below (these files without the rung) and shows the rung as a diff
// against it (README.md).

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "engine.hpp"
#include "error.hpp"
#include "page_data.hpp"

namespace p5 {

void Fail(Session& s, const std::string& why) {
  std::lock_guard lock(s.mutex);
  if (s.failure.empty()) s.failure = why;
  s.stop = true;
}
// <rung pin>
// --pin: the thread stays on one core of its group's NUMA node, its caches warm and its
// NICs' completions handled where their memory is.
void PinToGroupCore(const Worker& w) {
  if (!IsThisSystem(*w.session->topology)) return;  // a rehearsal: planned, not bound
  std::string why;
  if (w.cpu && !PinThread(*w.session->topology, *w.cpu, why))
    std::printf("warning: not pinned: %s\n", why.c_str());
}
// </rung pin>
// <rung numa>
// --numa: what the thread allocates from here on (endpoints, queues, its source memory)
// comes from its group's NUMA node.
void BindToGroupMemory(const Worker& w) {
  if (!IsThisSystem(*w.session->topology)) return;
  std::string why;
  if (!BindThreadMemory(*w.session->topology, w.group->numa, why))
    std::printf("warning: memory not bound: %s\n", why.c_str());
}
// </rung numa>
// Each data thread opens its own lanes (fresh endpoints for this client alone) and its source
// memory, registered once on each of them: engine.memory bytes per lane, as the client asked.
void OpenLanes(Worker& w) {
  Session& s = *w.session;
  for (size_t l = w.first_lane; l < w.first_lane + w.lane_count; ++l) {
    w.lanes.push_back(Network::Open(DataLane(*s.plan->lanes[l]), s.wait, &s.memory, 0, true));
    w.dest.push_back(w.lanes.back().Insert(s.addresses[l]));
    w.writers.push_back(w.lanes.back().Address());
  }
  // A source buffer per group among the thread's lanes, on that group's GPU, registered on
  // that group's lanes: engine.memory bytes for each of its lanes.
  std::vector<size_t> groups, lanes_in;  // the groups in lane order, and their lanes here
  for (size_t l = 0; l < w.lane_count; ++l) {
    const size_t g = s.plan->group_of[w.first_lane + l];
    const size_t p = std::find(groups.begin(), groups.end(), g) - groups.begin();
    if (p == groups.size()) {
      groups.push_back(g);
      lanes_in.push_back(0);
    }
    ++lanes_in[p];
    w.pool_of.push_back(p);
  }
  w.pools.resize(groups.size());
  uint64_t largest = 0;
  for (size_t p = 0; p < groups.size(); ++p) {
    const uint64_t bytes = std::max<uint64_t>(s.engine.memory * lanes_in[p], 4096);
    w.pools[p].memory = PageBuffer(bytes, s.memory, s.plan->groups[groups[p]].gpu.value_or(0));
    w.pools[p].holes[0] = bytes;
    w.pools[p].mrs.resize(w.lane_count);
    largest = std::max(largest, bytes);
  }
  for (size_t l = 0; l < w.lane_count; ++l) {
    SourcePool& pool = w.pools[w.pool_of[l]];
    pool.mrs[l] = RegisterPages(w.lanes[l].domain.get(), *w.lanes[l].info, pool.memory, FI_WRITE);
  }
  if (s.memory.path != PageBuffer::Path::kHost) w.staging = HostBuffer(largest);
  w.pending.resize(w.lane_count);
  w.held_back.assign(w.lane_count, 0);
  w.riders.resize(w.lane_count);
  // <rung shard>
  if (s.On(wire::kEngineShard)) {  // the thread's own window
    w.ops.resize(s.engine.window * w.lane_count);
    for (auto& op : w.ops) w.free_ops.push_back(&op);
  }
  // </rung shard>
  if (IsThisSystem(*s.topology))
    w.placement = DescribePlacement(*s.topology);
  else  // a rehearsal (--topology): where it would run there
    w.placement = std::string("planned: ") +
                  (s.On(wire::kEnginePin) && w.cpu ? "cpu " + std::to_string(*w.cpu) : "any cpu") +
                  (s.On(wire::kEngineNuma) ? ", memory on node " + std::to_string(w.group->numa)
                                           : ", memory anywhere");
}
// A counter only its thread writes and the control thread reads: a plain load and store, not
// a locked read-modify-write (twice per WRITE).
void Add(std::atomic<uint64_t>& counter, int64_t n) {
  counter.store(counter.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}
// A WRITE's slot in the window, and its completion counted. Without sharding: the session's
// window and counters, behind its lock; each thread still takes no more than its lanes'
// share, so none starves the others.
Op* TakeOp(Worker& w) {
  // <rung shard>
  // --shard: the thread's own window and counters, no lock.
  if (w.session->On(wire::kEngineShard)) {
    if (w.free_ops.empty()) return nullptr;
    Op* op = w.free_ops.back();
    w.free_ops.pop_back();
    Add(w.in_flight, 1);
    return op;
  }
  // </rung shard>
  SharedState& shared = w.session->shared;
  std::lock_guard lock(shared.mutex);
  ++shared.locks;
  if (w.in_flight.load(std::memory_order_relaxed) >= w.session->engine.window * w.lane_count)
    return nullptr;
  if (shared.free_ops.empty()) return nullptr;
  Op* op = shared.free_ops.back();
  shared.free_ops.pop_back();
  Add(w.in_flight, 1);
  return op;
}
void CountWrite(Worker& w, Op* op) {
  Add(w.in_flight, -1);
  ++op->share->completed;
  // <rung shard>
  if (w.session->On(wire::kEngineShard)) {
    ++w.writes;
    w.bytes += op->length;
    w.free_ops.push_back(op);
    return;
  }
  // </rung shard>
  SharedState& shared = w.session->shared;
  std::lock_guard lock(shared.mutex);
  ++shared.locks;
  ++shared.writes;
  shared.bytes += op->length;
  shared.free_ops.push_back(op);
}
// A completion: its WRITE's, and those of the WRITEs it vouches for (Flush).
void CountCompletion(Worker& w, Op* op) {
  ++w.completions;
  for (Op* rider : op->riders) CountWrite(w, rider);
  op->riders.clear();
  CountWrite(w, op);
}
// New shares from the control thread: each takes room in the thread's source memory (it
// waits for room if the memory is taken by earlier requests) and its pages are filled there.
void PlaceShares(Worker& w) {
  if (w.has_inbox) {
    std::lock_guard lock(w.inbox_mutex);
    for (auto& share : w.inbox) w.shares.push_back(std::move(share));
    w.inbox.clear();
    w.has_inbox = false;
    w.shares_held.store(w.shares.size(), std::memory_order_relaxed);
  }
  for (auto& share : w.shares) {
    if (share->placed) continue;
    SourcePool& pool = w.pools[share->pool];
    const auto at = pool.Take(share->bytes);
    if (!at) return;  // in order: a later share does not overtake one that waits for room
    const auto start = Clock::now();
    const wire::Transfer& t = share->request->transfer;
    share->offset = *at;
    const bool host = w.session->memory.path == PageBuffer::Path::kHost;
    uint8_t* pages = host ? static_cast<uint8_t*>(pool.memory.nic_data()) + *at : w.staging.data();
    for (size_t k = 0; k < share->positions.size(); ++k)
      FillPage({pages + k * t.page_size, t.page_size}, t.seed, t.pages[share->positions[k]]);
    if (!host) {  // one copy for the whole share, then the NIC's view of it
      pool.memory.Write(*at, {pages, share->bytes});
      pool.memory.SyncToNic();
    }
    share->fill_ns = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
    share->placed = true;
  }
}
// Hands a lane's prepared WRITEs to the provider; each post it sends at once rings the NIC's
// doorbell.
void Flush(Worker& w, size_t lane) {
  const Session& s = *w.session;
  std::deque<Op*>& queue = w.pending[lane];
  while (!queue.empty()) {
    // <rung doorbell>
    // --doorbell: in groups, FI_MORE on all but the last of each, so the provider can ring
    // the NIC once per group. A group cut short by -FI_EAGAIN leaves WRITEs held back behind
    // FI_MORE: the next post then goes without it and rings.
    const size_t group = w.held_back[lane] ? 1 : std::min<size_t>(s.engine.doorbell, queue.size());
    // </rung doorbell>
    // <without doorbell> const size_t group = 1;
    for (size_t i = 0; i < group; ++i) {
      Op* op = queue.front();
      const bool more = i + 1 < group;
      if (!w.lanes[lane].PostWrite(*op, w.dest[lane], s.regions[w.first_lane + lane],
                                   op->remote_offset, op->share->request->transfer.request_id,
                                   more ? FI_MORE : 0)) {
        Add(w.refused, 1);
        // <rung doorbell>
        if (i > 0) w.held_back[lane] = 1;
        // </rung doorbell>
        return;
      }
      queue.pop_front();
      if (!op->signaled)
        w.riders[lane].push_back(op);  // the lane's next reported WRITE vouches for it
      else
        op->riders.swap(w.riders[lane]);
      ++w.posts;
      if (!more || !w.lanes[lane].reads_more) ++w.doorbells;  // a post the provider sends at once
      if (op->share->posted++ == 0) op->share->first_post = Clock::now();
    }
    w.held_back[lane] = 0;
  }
}
// Reads every lane's completions.
size_t PollLanes(Worker& w) {
  // <rung lazy>
  const bool lazy = w.session->On(wire::kEngineLazy);
  // </rung lazy>
  size_t done = 0;
  for (size_t l = 0; l < w.lanes.size(); ++l) {
    done += ReadCompletions(
        w.lanes[l].cq.get(), false,
        [&w](const fi_cq_data_entry& e, fi_addr_t) { CountCompletion(w, OpOf(e.op_context)); },
        [&w](const CompletionError& e) { Fail(*w.session, "a WRITE failed: " + e.text); });
    // <rung lazy>
    // --lazy: posts a lane's prepared WRITEs right after its completions made room in its
    // queue (progress in the CQ poll).
    if (lazy && !w.pending[l].empty()) {
      const uint64_t before = w.posts;
      Flush(w, l);
      w.posted_in_poll += w.posts - before;
    }
    // </rung lazy>
  }
  return done;
}
// Prepares WRITEs of the placed shares, one share after another in turn, and posts them as
// soon as a doorbell's worth of a lane is ready (eager posting). Page i of a request always
// goes out on lane i % lanes, so each thread owns its pages.
void PostWrites(Worker& w) {
  const Session& s = *w.session;
  // <rung lazy>
  const bool eager = !s.On(wire::kEngineLazy);  // --eager-post: lazy posting's switch off
  // </rung lazy>
  // <without lazy> const bool eager = true;
  // <rung batch>
  // --batch: prepares at most --batch WRITEs per lane each time round the loop (1: one, then
  // poll again).
  const uint64_t batch = s.engine.batch * w.lane_count;
  // </rung batch>
  // <without batch> const uint64_t batch = w.lane_count;
  uint64_t budget = batch;
  bool prepared_any = true;
  while (budget > 0 && prepared_any) {
    prepared_any = false;
    for (auto& share : w.shares) {
      if (!share->placed || share->prepared == share->total) continue;
      Op* op = TakeOp(w);
      if (op == nullptr) {
        budget = 0;
        break;
      }
      const wire::Transfer& t = share->request->transfer;
      const size_t k = share->prepared++ % share->positions.size();
      const size_t lane = share->positions[k] % s.regions.size() - w.first_lane;
      op->kind = OpKind::kWrite;
      op->buffer = static_cast<uint8_t*>(w.pools[share->pool].memory.nic_data()) + share->offset +
                   k * t.page_size;
      op->length = t.page_size;
      op->desc = fi_mr_desc(w.pools[share->pool].mrs[lane].get());
      op->share = share.get();
      op->remote_offset = t.pages[share->positions[k]] * t.page_size;
      op->lane = lane;
      w.pending[lane].push_back(op);
      if (eager && w.pending[lane].size() >= s.engine.doorbell) Flush(w, lane);
      prepared_any = true;
      if (--budget == 0) break;
    }
  }
  w.most_prepared = std::max(w.most_prepared, batch - budget);
  if (eager)
    for (size_t l = 0; l < w.lanes.size(); ++l) Flush(w, l);
}
// Shares whose WRITEs all completed give their source memory back; the last share of a
// request hands it back to the service, with its times.
void FinishShares(Worker& w, Clock::time_point now) {
  Session& s = *w.session;
  for (auto it = w.shares.begin(); it != w.shares.end();) {
    Share& share = **it;
    if (!share.placed || share.completed < share.total) {
      ++it;
      continue;
    }
    w.pools[share.pool].Give(share.offset, share.bytes);
    share.last_completion = now;  // its last completion came in this poll
    Request& r = *share.request;
    {
      std::lock_guard lock(s.mutex);
      const auto ns = [](Clock::time_point t) {
        return static_cast<uint64_t>(t.time_since_epoch().count());
      };
      r.done.first_post_ns = std::min(r.done.first_post_ns, ns(share.first_post));
      r.done.last_completion_ns = std::max(r.done.last_completion_ns, ns(share.last_completion));
      r.done.fill_ns += share.fill_ns;
      r.done.writes += share.total;
      if (--r.shares_left == 0) s.finished.push_back(r.done);
    }
    it = w.shares.erase(it);
    w.shares_held.store(w.shares.size(), std::memory_order_relaxed);
  }
}
// No WRITE completed for this long while some are owed: the lanes have stalled. A live lane
// completes a WRITE every few microseconds, a 1 Gbit/s one every 0.5 ms.
constexpr auto kStalled = std::chrono::milliseconds(20);
// A data thread: set up where it belongs, then poll, post and retire until told to stop. An
// error completion (the client died) fails the session, not the server.
void RunWorker(Worker& w) {
  Session& s = *w.session;
  w.tid = gettid();
  // Named for top -H, perf and the tests ("07 data" and its first lane; 15 characters at most).
  pthread_setname_np(pthread_self(), ("07 data " + std::to_string(w.first_lane)).c_str());
  try {
    // <rung pin>
    if (s.On(wire::kEnginePin)) PinToGroupCore(w);
    // </rung pin>
    // <rung numa>
    if (s.On(wire::kEngineNuma)) BindToGroupMemory(w);
    // </rung numa>
    OpenLanes(w);
    ++s.ready;
    w.last_work.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    while (!s.stop) {
      w.rounds.store(w.rounds.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      if (const int core = sched_getcpu(); core != w.last_core) {
        if (w.last_core >= 0) ++w.core_moves;
        w.last_core = core;
      }
      const size_t shares = w.shares.size();
      PlaceShares(w);
      const size_t done = PollLanes(w);
      PostWrites(w);
      if (done > 0) {
        const auto now = Clock::now();
        w.last_completion = now.time_since_epoch().count();
        w.last_work.store(now.time_since_epoch().count(), std::memory_order_relaxed);
        FinishShares(w, now);
      } else if (w.shares.size() != shares) {
        w.last_work.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
      }
      if (w.shares.empty()) {  // nothing to do: sleep until the control thread hands work over
        std::unique_lock lock(w.inbox_mutex);
        w.inbox_ready.wait_for(lock, std::chrono::milliseconds(100),
                               [&] { return !w.inbox.empty() || s.stop; });
      } else if (done == 0 && s.wait == WaitMode::kBlock &&
                 std::all_of(w.pending.begin(), w.pending.end(),
                             [](const auto& queue) { return queue.empty(); })) {
        WaitForCompletions(w.lanes, 100);  // nothing prepared waits to be posted
      } else if (done == 0 && Clock::now() - LastWork(w) > kStalled) {
        // Owed completions that stopped coming (a client that died: shm never completes a
        // WRITE to it): nap instead of spinning a core away until --peer-timeout drops it.
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
  } catch (const std::exception& e) {
    Fail(s, e.what());
  }
  w.cpu_seconds = ThreadCpuSeconds();
  w.exited = true;
}
}  // namespace p5
