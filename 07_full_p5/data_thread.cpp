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
#include <utility>

#include "backoff.hpp"
#include "engine.hpp"
#include "error.hpp"

namespace p5 {

// <rung pin>
// --pin: the thread stays on one core of its group's NUMA node, its caches warm and its
// NICs' completions handled where their memory is.
void PinToGroupCore(const Worker& w) {
  if (!IsThisSystem(w.engine->topology)) return;  // a rehearsal: planned, not bound
  std::string why;
  if (w.cpu && !PinThread(w.engine->topology, *w.cpu, why))
    std::printf("warning: not pinned: %s\n", why.c_str());
}
// </rung pin>
// <rung numa>
// --numa: what the thread allocates from here on (its endpoints and queues) comes from its
// group's NUMA node; the source pages are there already (Engine::MakeSources).
void BindToGroupMemory(const Worker& w) {
  if (!IsThisSystem(w.engine->topology)) return;
  std::string why;
  if (!BindThreadMemory(w.engine->topology, w.group->numa, why))
    std::printf("warning: memory not bound: %s\n", why.c_str());
}
// </rung numa>
// Each data thread opens its lanes once, for every client to come, and registers its lanes'
// groups' source pages on them.
void OpenLanes(Worker& w) {
  Engine& e = *w.engine;
  for (size_t l = w.first_lane; l < w.first_lane + w.lane_count; ++l) {
    // <rung doorbell>
    // Where a WRITE completes only once delivered (shm from 1.18, WriteCompletion), one
    // completion per doorbell's group: the group's last WRITE reports for the others, which
    // are posted FI_INJECT and report nothing (PostWrite); each rides on the next that does.
    const bool selective = OneCompletionPerGroup(*e.plan.lanes[l], &e.memory);
    // </rung doorbell>
    // <without doorbell> const bool selective = false;
    w.lanes.push_back(Network::Open(DataLane(*e.plan.lanes[l]), e.wait, &e.memory, 0, selective));
    w.writers.push_back(w.lanes.back().Address());
  }
  for (size_t l = 0; l < w.lane_count; ++l) {
    PageBuffer& source = e.sources[e.plan.group_of[w.first_lane + l]];
    w.source_at.push_back(static_cast<uint8_t*>(source.nic_data()));
    w.source_mrs.push_back(
        RegisterPages(w.lanes[l].domain.get(), *w.lanes[l].info, source, FI_WRITE, e.memory));
    w.source_desc.push_back(fi_mr_desc(w.source_mrs.back().get()));
  }
  w.riders.assign(w.lane_count, nullptr);
  w.in_order = Has(Quirk::kCompletesInOrder, *w.lanes[0].info);
  if (IsThisSystem(e.topology))
    w.placement = DescribePlacement(e.topology);
  else  // a rehearsal (--topology): where it would run there
    w.placement =
        std::string("planned: ") +
        (e.shape.pin && w.cpu ? "cpu " + std::to_string(*w.cpu) : "any cpu") +
        (e.shape.numa ? ", memory on node " + std::to_string(w.group->numa) : ", memory anywhere");
}
// A counter only its thread writes and the control thread reads: a plain load and store, not
// a locked read-modify-write (twice per WRITE).
void Add(std::atomic<uint64_t>& counter, int64_t n) {
  counter.store(counter.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}
// A WRITE's slot in the client's window, and its completion counted. Without sharding: the
// client's window and counters, behind its lock, shared by its threads; each thread still
// takes no more than its lanes' share, so none starves the others.
Op* TakeOp(PeerSlot& slot) {
  // <rung shard>
  // --shard: the thread's own window and counters for this client, no lock.
  if (!slot.ops.empty()) {
    if (slot.free_ops.empty()) return nullptr;
    Op* op = slot.free_ops.back();
    slot.free_ops.pop_back();
    Add(slot.in_flight, 1);
    return op;
  }
  // </rung shard>
  SharedState& shared = slot.peer->shared;
  std::lock_guard lock(shared.mutex);
  ++shared.locks;
  if (slot.in_flight.load(std::memory_order_relaxed) >=
      slot.peer->settings.window * slot.lanes_used)
    return nullptr;
  if (shared.free_ops.empty()) return nullptr;
  Op* op = shared.free_ops.back();
  shared.free_ops.pop_back();
  Add(slot.in_flight, 1);
  return op;
}
// A WRITE's slot back in the window; `written`: it completed (a dropped one never went out).
void ReturnOp(Op* op, bool written) {
  Share& share = *op->share;
  PeerSlot& slot = *share.slot;
  Add(slot.in_flight, -1);
  slot.bytes_in_flight -= op->length;
  ++share.completed;
  // --immediate last: the lane's last WRITE of the share goes once the others completed.
  if (!share.unfinished.empty() && !op->immediate && --share.unfinished[op->lane] == 0)
    if (Op* last = std::exchange(share.last[op->lane], nullptr); last != nullptr) {
      if (slot.leaving)
        ReturnOp(last, false);
      else
        slot.pending[op->lane].push_back(last);
    }
  // <rung shard>
  if (!slot.ops.empty()) {
    Add(slot.writes, written);
    Add(slot.bytes, written ? op->length : 0);
    slot.free_ops.push_back(op);
    return;
  }
  // </rung shard>
  SharedState& shared = slot.peer->shared;
  std::lock_guard lock(shared.mutex);
  ++shared.locks;
  shared.writes += written;
  shared.bytes += written ? op->length : 0;
  shared.free_ops.push_back(op);
}
void CountWrite(Op* op) {
  ReturnOp(op, true);
}
// A completion: its WRITE's, and those of the WRITEs it vouches for (Flush).
void CountCompletion(Op* op) {
  ++op->share->slot->completions;
  // <rung doorbell>
  for (Op* rider = std::exchange(op->rider, nullptr); rider != nullptr;)
    CountWrite(std::exchange(rider, std::exchange(rider->rider, nullptr)));
  // </rung doorbell>
  CountWrite(op);
}
void CommandQueue::Push(WorkerCommand command) {
  {
    std::lock_guard lock(mutex_);
    commands_.push_back(std::move(command));
    waiting_.store(true, std::memory_order_release);
  }
  ready_.notify_all();
}
std::vector<WorkerCommand> CommandQueue::TakeAll() {
  std::vector<WorkerCommand> taken;
  std::lock_guard lock(mutex_);
  taken.swap(commands_);
  waiting_.store(false, std::memory_order_release);
  return taken;
}
void CommandQueue::WaitFor(std::chrono::milliseconds limit, const std::atomic<bool>& stop) {
  std::unique_lock lock(mutex_);
  ready_.wait_for(lock, limit, [&] { return waiting() || stop.load(); });
}
void CommandQueue::Wake() {
  { std::lock_guard lock(mutex_); }  // so that a thread about to sleep sees the flag first
  ready_.notify_all();
}
// A client joins: its entries go into the lanes' AVs here, by the thread that owns the lanes.
void Join(Worker& w, PeerSlot* slot) {
  try {
    for (size_t l = 0; l < slot->lanes_used; ++l)
      slot->dest.push_back(w.lanes[l].AddPeerAddress(slot->peer->addresses[w.first_lane + l]));
    slot->moves_at_join = w.core_moves.load(std::memory_order_relaxed);
    slot->cpu_at_join = ThreadCpuSeconds();
    w.slots.push_back(slot);
  } catch (const std::exception& e) {
    slot->peer->Fail(e.what());
    slot->leaving = true;
    slot->left.store(true, std::memory_order_release);
  }
  slot->joined.store(true, std::memory_order_release);
}
// A share of a request to serve.
void Serve(std::unique_ptr<Share> share) {
  PeerSlot& slot = *share->slot;
  if (slot.leaving) return;  // a request that crossed its BYE
  slot.shares.push_back(std::move(share));
  slot.shares_held.store(slot.shares.size(), std::memory_order_relaxed);
  slot.last_work.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
}
// A client leaves: no new WRITEs for it. What is not begun is dropped, what is begun ends
// with the WRITEs already prepared, which complete (or fail) as any other.
void StartLeaving(PeerSlot* slot) {
  if (slot->left) return;
  slot->leaving = true;
  std::erase_if(slot->shares, [](const auto& s) { return s->prepared == 0; });
  for (auto& share : slot->shares) {
    share->total = share->prepared;
    for (Op*& last : share->last)
      if (last != nullptr) ReturnOp(std::exchange(last, nullptr), false);
  }
  // WRITEs prepared and not posted are dropped, unless some went out with FI_MORE before
  // them: the provider may hold those until a post rings the doorbell.
  for (size_t l = 0; l < slot->pending.size(); ++l) {
    for (PendingWrites& queue = slot->pending[l]; !slot->held_back[l] && !queue.empty();) {
      ReturnOp(queue.front(), false);
      queue.pop_front();
    }
  }
}
// What the control thread handed over since the last round, in the order it happened.
void TakeCommands(Worker& w) {
  if (!w.inbox.waiting()) return;
  for (WorkerCommand& command : w.inbox.TakeAll()) {
    switch (command.kind) {
      case WorkerCommand::kJoin:
        Join(w, command.slot);
        break;
      case WorkerCommand::kServe:
        Serve(std::move(command.share));
        break;
      case WorkerCommand::kLeave:
        StartLeaving(command.slot);
        break;
    }
  }
}
// Hands a client's prepared WRITEs on a lane to the provider; each post it sends at once
// rings the NIC's doorbell. A post the provider fails (not -FI_EAGAIN) fails that client alone;
// one it refuses (-FI_EAGAIN) holds back that client's queue only.
void Flush(Worker& w, PeerSlot& slot, size_t lane, bool in_poll) {
  PendingWrites& queue = slot.pending[lane];
  while (!queue.empty()) {
    // <rung doorbell>
    // --doorbell: in groups of the client's, FI_MORE on all but the last of each, so the
    // provider can ring the NIC once per group. A group cut short by -FI_EAGAIN leaves WRITEs
    // held back behind FI_MORE: the next post then goes without it and rings.
    const size_t group =
        slot.held_back[lane] ? 1 : std::min<size_t>(slot.peer->settings.doorbell, queue.size());
    // </rung doorbell>
    // <without doorbell> const size_t group = 1;
    for (size_t i = 0; i < group; ++i) {
      Op* op = queue.front();
      const bool more = i + 1 < group;
      bool posted = false;
      try {
        posted = w.lanes[lane].PostWrite(
            *op, slot.dest[lane], slot.peer->regions[w.first_lane + lane], op->remote_offset,
            op->share->request->transfer.request_id, more ? FI_MORE : 0);
      } catch (const std::exception& e) {
        slot.peer->Fail(std::string("a WRITE could not be posted: ") + e.what());
        queue.pop_front();
        CountWrite(op);
        break;
      }
      if (!posted) {
        Add(w.refused, 1);
        // <rung doorbell>
        if (i > 0) slot.held_back[lane] = 1;
        // </rung doorbell>
        return;
      }
      queue.pop_front();
      // <rung doorbell>
      op->rider = w.riders[lane];  // the chain so far: this one's completion vouches for it
      w.riders[lane] = op->signaled ? nullptr : op;  // else the lane's next reported one will
      // </rung doorbell>
      ++slot.posts;
      if (in_poll) ++slot.posted_in_poll;
      if (!more || !w.lanes[lane].reads_more) ++slot.doorbells;  // a post sent at once
      if (op->share->posted++ == 0) op->share->first_post = Clock::now();
      if (!more) break;
    }
    slot.held_back[lane] = 0;
  }
}
// Posts every eager (lazy == false) or every lazy client's prepared WRITEs on a lane, each
// client in turn from the thread's next one.
void FlushLane(Worker& w, size_t lane, [[maybe_unused]] bool lazy, bool in_poll) {
  const size_t n = w.slots.size();
  for (size_t k = 0; k < n; ++k) {
    PeerSlot& slot = *w.slots[(w.next + k) % n];
    if (slot.pending[lane].empty()) continue;
    // <rung lazy>
    if (slot.peer->On(wire::kEngineLazy) != lazy) continue;
    // </rung lazy>
    Flush(w, slot, lane, in_poll);
  }
}
// Reads every lane's completions; a failed WRITE fails its client alone.
size_t PollLanes(Worker& w) {
  size_t done = 0;
  for (size_t l = 0; l < w.lanes.size(); ++l) {
    done += ReadCompletions(
        w.lanes[l].cq.get(), false,
        [](const fi_cq_data_entry& e, fi_addr_t) {
          Op* op = OpOf(e.op_context);
          op->share->slot->completed = true;
          CountCompletion(op);
        },
        [&w](const CompletionError& e) {
          if (Op* op = OpOf(e.op_context); op != nullptr && op->share != nullptr) {
            op->share->slot->peer->Fail("a WRITE failed: " + e.text);
            CountCompletion(op);
            return;
          }
          for (PeerSlot* slot : w.slots) slot->peer->Fail("a completion failed: " + e.text);
        });
    // <rung lazy>
    // --lazy: posts a lane's prepared WRITEs right after its completions made room in its
    // queue (progress in the CQ poll).
    FlushLane(w, l, true, true);
    // </rung lazy>
  }
  return done;
}
// Prepares WRITEs of one client's shares, one share after another in turn, at most its
// --batch per visit of the thread, and posts them as soon as a doorbell's worth of a lane is
// ready (eager posting). Each page goes out on the lane LaneOf dealt it.
void PrepareFor(Worker& w, PeerSlot& slot) {
  const wire::Engine& settings = slot.peer->settings;
  // Byte-fair (deficit round robin): each visit adds the bytes of --batch WRITEs of the
  // thread's smallest pages in service to the client's credit, and a WRITE spends its
  // page's bytes. Clients of equal pages prepare --batch each, as without it; a client of
  // 1 MiB pages beside one of 64 KiB gets one WRITE for the other's sixteen: equal bytes.
  const uint64_t quantum = settings.batch * w.fair_page;
  slot.credit += quantum;
  const uint64_t byte_window = uint64_t{settings.window} * slot.lanes_used * w.fair_page;
  bool window_full = false;
  // <rung lazy>
  const bool eager = !slot.peer->On(wire::kEngineLazy);  // --eager-post: lazy posting off
  // </rung lazy>
  // <without lazy> const bool eager = true;
  // <without batch> const uint64_t batch = 1;  // one WRITE a visit, as 13_shard posted
  // <without batch> uint64_t budget = batch;
  // <without batch> {
  // <rung batch>
  // --batch: round the shares again and again until --batch WRITEs are prepared (or none is
  // left to prepare), and only then poll: one visit, many WRITEs. Per visit of the thread,
  // whatever its lanes, as the published 15_lazy prepared 16 (ContinuePostWrite).
  const uint64_t batch = settings.batch;
  uint64_t budget = batch;
  bool prepared_any = true;
  while (budget > 0 && prepared_any) {
    prepared_any = false;
    // </rung batch>
    for (auto& share : slot.shares) {
      if (share->prepared == share->total) continue;
      const uint64_t page_size = share->request->transfer.page_size;
      if (slot.credit < page_size) {  // its bytes for this visit are spent
        budget = 0;
        break;
      }
      // Its window in bytes too: --window WRITEs of the smallest pages in service, so that
      // larger pages do not hold more of the provider's queue than the others'. But at least
      // two of its own per lane where WRITEs complete out of order, so that one is on its way
      // while the last one's completion comes back (one alone waits a round trip each: 4 MiB
      // pages beside 64 KiB ones got 0.77 of their bytes over shm 2.6). Where a lane completes
      // in order (1.17's shm), a share is its bytes in flight, and one page is its share.
      const uint64_t least = (w.in_order ? 1 : 2) * slot.lanes_used * page_size;
      if (slot.bytes_in_flight > 0 &&
          slot.bytes_in_flight + page_size > std::max(byte_window, least)) {
        window_full = true;
        budget = 0;
        break;
      }
      Op* op = TakeOp(slot);
      if (op == nullptr) {
        window_full = true;
        budget = 0;
        break;
      }
      slot.credit -= page_size;
      slot.bytes_in_flight += page_size;
      const Share::Page& page = share->pages[share->next_page];
      if (++share->next_page == share->pages.size()) share->next_page = 0;
      ++share->prepared;
      const size_t lane = page.lane;
      op->kind = OpKind::kWrite;
      op->buffer = w.source_at[lane] + page.source;
      op->length = page_size;
      op->desc = w.source_desc[lane];
      op->share = share.get();
      op->remote_offset = page.target;
      op->lane = lane;
      op->immediate = true;
      op->delivered = false;
      // --immediate last: the lane's last WRITE of the share carries the immediate data and
      // vouches for the others, so it waits for their completions (ReturnOp).
      if (!share->unprepared.empty()) {
        op->immediate = --share->unprepared[lane] == 0;
        op->delivered =
            !op->immediate && !w.lanes[lane].write_completion && !w.lanes[lane].delivers_in_order;
        if (!op->immediate)
          ++share->unfinished[lane];
        else if (share->unfinished[lane] > 0)
          share->last[lane] = op;
      }
      if (share->unprepared.empty() || !op->immediate || share->last[lane] != op)
        slot.pending[lane].push_back(op);
      if (eager && slot.pending[lane].size() >= settings.doorbell) Flush(w, slot, lane, false);
      // <rung batch>
      prepared_any = true;
      // </rung batch>
      if (--budget == 0) break;
    }
  }
  slot.most_prepared = std::max(slot.most_prepared, batch - budget);
  // Credit is for bytes it could not send yet, not a hoard: none once it has nothing left to
  // prepare, at most one visit's while its window is full.
  if (window_full) slot.credit = std::min(slot.credit, quantum);
  if (!window_full && budget > 0) slot.credit = 0;
}
// Every client in turn, from a different one each round: K clients of equal demand each get
// about 1/K of the thread's WRITEs, each within its own window.
void PostWrites(Worker& w) {
  const size_t n = w.slots.size();
  // The fair share's unit: the smallest page among the shares being served (PrepareFor).
  uint64_t smallest = UINT64_MAX;
  for (const PeerSlot* slot : w.slots)
    if (!slot->leaving && !slot->shares.empty())
      smallest = std::min(smallest, slot->shares.front()->request->transfer.page_size);
  if (smallest != UINT64_MAX) w.fair_page = smallest;
  for (size_t k = 0; k < n; ++k) {
    PeerSlot& slot = *w.slots[(w.next + k) % n];
    if (!slot.leaving) PrepareFor(w, slot);
  }
  // What eager clients prepared goes out now; a lazy client's, from the next poll.
  for (size_t l = 0; l < w.lanes.size(); ++l) FlushLane(w, l, false, false);
  if (n > 0) w.next = (w.next + 1) % n;
}
// Shares whose WRITEs all completed are done; the last share of a request hands it back to
// the service, with its times.
void FinishShares(PeerSlot& slot, Clock::time_point now) {
  Peer& peer = *slot.peer;
  for (auto it = slot.shares.begin(); it != slot.shares.end();) {
    Share& share = **it;
    if (share.completed < share.total) {
      ++it;
      continue;
    }
    share.last_completion = now;  // its last completion came in this poll
    Request& r = *share.request;
    {
      std::lock_guard lock(peer.mutex);
      const auto ns = [](Clock::time_point t) {
        return static_cast<uint64_t>(t.time_since_epoch().count());
      };
      r.done.first_post_ns = std::min(r.done.first_post_ns, ns(share.first_post));
      r.done.last_completion_ns = std::max(r.done.last_completion_ns, ns(share.last_completion));
      r.done.writes += share.completed;
      if (--r.shares_left == 0 && !slot.leaving) peer.finished.push_back(r.done);
    }
    it = slot.shares.erase(it);
    slot.shares_held.store(slot.shares.size(), std::memory_order_relaxed);
  }
}
// A leaving client goes once none of its WRITEs is in flight: its AV entries are removed only
// then, so no fi_addr is reused while an operation can still complete on it; its slot (which
// their completions name) lives until then.
void Leave(Worker& w, PeerSlot& slot) {
  FinishShares(slot, Clock::now());
  if (slot.in_flight.load(std::memory_order_relaxed) > 0 || !slot.shares.empty()) return;
  // A client no WRITE ever reached may be a process gone before it was inserted; where the
  // provider cannot remove such a peer (Quirk::kRemoveNeedsMappedPeer) its entries stay, one each.
  const bool keep = slot.completions == 0 && Has(Quirk::kRemoveNeedsMappedPeer, *w.lanes[0].info);
  for (size_t l = 0; l < slot.dest.size() && !keep; ++l) {
    fi_addr_t dest = slot.dest[l];
    fi_av_remove(w.lanes[l].av.get(), &dest, 1, 0);
  }
  slot.entries_kept = keep;
  std::erase(w.slots, &slot);
  w.next = 0;
  slot.cpu_at_leave = ThreadCpuSeconds();
  slot.left.store(true, std::memory_order_release);
}
// No WRITE completed for this long while some are owed: the lanes have stalled. A live lane
// completes a WRITE every few microseconds, a 1 Gbit/s one a 64 KiB WRITE every 0.5 ms.
constexpr auto kStalled = std::chrono::milliseconds(20);
// One round: clients and shares taken, completions read, WRITEs posted, finished work handed
// back. Returns the completions read.
size_t Round(Worker& w) {
  TakeCommands(w);
  const size_t done = PollLanes(w);
  PostWrites(w);
  if (done > 0) {
    const auto now = Clock::now();
    const Clock::rep stamp = now.time_since_epoch().count();
    for (PeerSlot* slot : w.slots) {
      if (std::exchange(slot->completed, false)) {  // in this round's poll
        slot->last_completion.store(stamp, std::memory_order_relaxed);
        slot->last_work.store(stamp, std::memory_order_relaxed);
      }
      FinishShares(*slot, now);
    }
  }
  for (size_t i = w.slots.size(); i-- > 0;)
    if (w.slots[i]->leaving) Leave(w, *w.slots[i]);
  return done;
}
// A data thread: set up where it belongs, then serve every client until told to stop.
void RunWorker(Worker& w) {
  const Engine& e = *w.engine;
  w.tid = gettid();
  // Named for top -H, perf and the tests ("07 data" and its first lane; 15 characters at most).
  pthread_setname_np(pthread_self(), ("07 data " + std::to_string(w.first_lane)).c_str());
  try {
    // <rung pin>
    if (e.shape.pin) PinToGroupCore(w);
    // </rung pin>
    // <rung numa>
    if (e.shape.numa) BindToGroupMemory(w);
    // </rung numa>
    OpenLanes(w);
    w.ready = true;
    auto last_work = Clock::now();
    IdleBackoff backoff;  // --wait spin: an idle round naps, so that it never takes a core
    while (!w.stop) {
      Add(w.rounds, 1);
      if (const int core = sched_getcpu(); core != w.last_core) {
        if (w.last_core >= 0) Add(w.core_moves, 1);
        w.last_core = core;
      }
      const size_t done = Round(w);
      if (done > 0) {
        last_work = Clock::now();
        backoff.Busy();
      }
      const bool owed = std::any_of(w.slots.begin(), w.slots.end(),
                                    [](const PeerSlot* s) { return !s->shares.empty(); });
      if (!owed) {  // nothing to do: sleep until the control thread hands something over
        w.inbox.WaitFor(std::chrono::milliseconds(100), w.stop);
      } else if (done == 0 && e.wait == WaitMode::kBlock && !w.inbox.waiting() &&
                 std::all_of(w.slots.begin(), w.slots.end(), [](const PeerSlot* s) {
                   return std::all_of(s->pending.begin(), s->pending.end(),
                                      [](const auto& queue) { return queue.empty(); });
                 })) {
        WaitForCompletions(w.lanes, 100);  // nothing prepared waits to be posted
      } else if (done == 0 && Clock::now() - last_work > kStalled) {
        // Owed completions that stopped coming (a client that died: shm never completes a
        // WRITE to it): nap instead of spinning a core away until --peer-timeout drops it.
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      } else if (done == 0) {
        backoff.Idle();
      }
    }
  } catch (const std::exception& ex) {
    w.failure = ex.what();
  }
  w.exited = true;
}
}  // namespace p5
