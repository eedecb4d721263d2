// 07_full_p5's parts, shared by its files (README.md, "The files"):
//   main.cpp     the network, as in 06: lanes on every NIC of every group; the two programs
//   engine.cpp   a data thread and the ladder's rungs: what makes it fast
//   session.cpp  a client's session on the server: its threads, lanes and source memory
//   client.cpp   the client: receiving threads, warmup, the requests, --ladder
//   service.cpp  the service: the control endpoint, admission, limits, liveness
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "completion.hpp"
#include "endpoint.hpp"
#include "fabric_handles.hpp"
#include "host_buffer.hpp"
#include "mailbox.hpp"
#include "nic_counters.hpp"
#include "options.hpp"
#include "page_buffer.hpp"
#include "preflight.hpp"
#include "protocol.hpp"
#include "registration.hpp"
#include "report.hpp"
#include "service.hpp"
#include "topology.hpp"

namespace p5 {

using namespace common;
using Clock = std::chrono::steady_clock;

inline constexpr const char* kProgram = "07_full_p5";
inline constexpr size_t kRecvDepth = 8;  // receives each side keeps posted
inline constexpr uint64_t kMaxRequestsInFlight = 64;
inline constexpr uint32_t kWarmupRequest = 0xffffffff;  // the id of the untimed warmup request
// A data thread that owes WRITEs and has seen none complete for this long (or half of
// --peer-timeout, if shorter) is stalled: the server says so once, with what the thread did
// meanwhile (Session::Poll). A live lane completes a WRITE every few microseconds, a 1 Gbit/s
// one a 64 KiB WRITE every 0.5 ms.
inline constexpr auto kStallTold = std::chrono::seconds(5);
// <rung pin>
// A pinned thread cannot leave its core: when something else takes that core (a real-time
// task, a busy host, a vCPU the hypervisor does not run), it waits on the core's run queue and
// no other core can help. Watched once a second by a thread that only watches (the server's
// service thread, the client's main thread): one kept off its core over the last second
// (common::KeptOffCore: ran under 10% of it, and queued or runnable all along) is moved to the
// other given cores, once, for the rest of its session: let back onto its core a second
// later, it was queued there again behind the same task (README.md, "A core that is taken").
class CoreWatch {
 public:
  // The line to print when it moved thread `tid` off `cpu` ("" otherwise); call it often.
  std::string Check(pid_t tid, unsigned cpu, const std::vector<unsigned>& given);

 private:
  Clock::time_point window_ = Clock::now();
  std::optional<CoreSample> first_, last_;  // the first sample: where steal time is counted from
  bool moved_ = false;                      // once: moved off its core, or refused
};
// </rung pin>

// One posted operation. libfabric hands `context` back in the completion (FI_CONTEXT2 mode
// reserves it for the provider), and from it we find the whole Op again.
enum class OpKind { kRecv, kSend, kWrite };
struct Share;

struct Op {
  fi_context2 context{};
  OpKind kind = OpKind::kRecv;
  uint8_t* buffer = nullptr;
  size_t length = 0;
  void* desc = nullptr;             // local descriptor of the registered buffer (FI_MR_LOCAL)
  fi_addr_t peer = FI_ADDR_UNSPEC;  // where a SEND or WRITE goes: whom its failure concerns
  Share* share = nullptr;           // the part of a request a WRITE belongs to
  uint64_t remote_offset = 0;       // where in the peer's region a WRITE goes
  size_t lane = 0;                  // the lane (of its thread) a WRITE goes out on
  // Where only one WRITE of a doorbell's group reports its completion (Network::selective),
  // whether this one does, and, if it does, the WRITEs before it that it vouches for.
  bool signaled = true;
  std::vector<Op*> riders;
};

inline Op* OpOf(void* context) {
  return reinterpret_cast<Op*>(context);
}
// A lane's endpoint: common::Endpoint's objects (fabric, domain, CQ, AV, endpoint, opened as
// 03-06 open theirs), with 07's operations and where its pages live.
class Network : public Endpoint {
 public:
  // A data lane gets `pages`, where its pages live: by GPUDirect RDMA it refuses the CUDA API.
  // `writer`: the server's data lane, which WRITEs (see WriteCompletion).
  static Network Open(FiInfoPtr nic, WaitMode wait, const MemoryPath* pages = nullptr,
                      size_t cq_entries = 0, bool writer = false);
  wire::RemoteRegion Advertise(fid_mr* mr, const void* data, size_t size) const;
  void PostRecv(Op& op);
  bool PostSend(Op& op, fi_addr_t dest);
  bool PostWrite(Op& op, fi_addr_t dest, const wire::RemoteRegion& region, uint64_t offset,
                 uint32_t immediate, uint64_t flags);
  // on_done(op, entry, source) for each completion, with op == nullptr for a remote write into
  // our memory (no operation of ours was posted for it); on_error(op, error) for a failure.
  template <typename OnDone, typename OnError>
  size_t PollCompletion(OnDone&& on_done, OnError&& on_error) {
    return ReadCompletions(
        cq.get(), source,
        [&](const fi_cq_data_entry& e, fi_addr_t from) {
          on_done(IsRemoteWrite(e) ? nullptr : OpOf(e.op_context), e, from);
        },
        [&](const CompletionError& e) { on_error(OpOf(e.op_context), e); });
  }

  MemoryPath memory;    // where our pages live and how they reach the NIC (common/registration)
  bool source = false;  // completions name their sender (FI_SOURCE): control endpoints only
  uint64_t write_completion = 0;  // added to a reported WRITE's flags (WriteCompletion)
  // Only the last WRITE of a doorbell's group reports its completion, and vouches for the
  // WRITEs before it that were copied out at once (WriteCompletion).
  bool selective = false;
  // The provider reads FI_MORE (ReadsMore): a WRITE posted with it waits for the next doorbell.
  bool reads_more = false;
};
// The lanes: every group's NICs, group after group, and which group each lane belongs to.
struct Plan {
  std::vector<FiInfoPtr> lanes;
  std::vector<size_t> group_of;  // per lane
  std::vector<DeviceGroup> groups;
};
Topology LoadTopology(const Options& options);
MemoryKind MemoryFor(const Options& options);
Plan FindNics(const Options& options, std::span<const uint8_t> peer, MemoryKind memory,
              std::string* no_hmem, bool print);
FiInfoPtr DataLane(const fi_info& nic);
// The entries of a receiving lane's CQ. Each WRITE carries immediate data, so it lands as one
// completion there. Where the device receives such WRITEs unsolicited (efa-direct is offered
// for RMA only then, since 07 asks no FI_RX_CQ_DATA: fi_efa(7), FI_OPT_EFA_USE_UNSOLICITED_
// WRITE_RECV), no posted receive is spent on it and nothing at the target holds the writer
// back: the CQ alone holds what lands while the receiver is away from it, and an efa CQ that
// overflows fails its queue pair. The writer's window does not bound that (a WRITE completes
// at the writer once delivered, not once read), so the CQ is sized far past it: 4 windows,
// and at least 16384 entries (efa's own default is 12288), 5 ms of 4 KiB WRITEs at 100 Gbps.
inline size_t ReceiverCqEntries(size_t window) {
  return std::max<size_t>(16384, 4 * window);
}
WaitMode ChooseWaitMode(WaitMode requested, const fi_info& nic);
// When a WRITE counts as complete at the writer: FI_DELIVERY_COMPLETE where the provider's
// own completion would come before the target has the data (main.cpp), else 0 (its default).
uint64_t WriteCompletion(const fi_info& nic);
// Whether a writer's data lane reports one completion per doorbell's group instead of one per
// WRITE (FI_SELECTIVE_COMPLETION): where WriteCompletion asks for delivery, for pages in host
// memory (main.cpp).
bool OneCompletionPerGroup(const fi_info& nic, const MemoryPath* pages);
void WaitForCompletions(std::span<Network> lanes, int timeout_ms);
// "10 s", "0.25 s": for messages.
std::string FormatSeconds(Clock::duration d);
void PrintHeader(const char* role, const Plan& plan, WaitMode wait, const MemoryPath& memory,
                 std::optional<bool> emulated_write);

// The control messages: receives kept posted, and a queue of messages to send that never
// makes us wait (common/mailbox.hpp).
using Mail = Mailbox<Network, Op>;
// "1 thread, pinned, sharded, batch 16, ...": the settings of an engine, for the log.
std::string DescribeEngine(const wire::Engine& e, size_t threads);
// <rung threads>
// How many data threads serve `lanes` lanes: --threads, or 0 for one per topology group
// among them; never more than lanes. The client receives with as many.
size_t ThreadsFor(uint32_t asked, const Plan& plan, size_t lanes);
// </rung threads>

// One TRANSFER being served. The service hands it over; each data thread serves the pages
// that go out on its lanes (its share), and the last one to finish hands it back.
struct Request {
  wire::Transfer transfer;
  std::atomic<size_t> shares_left{0};
  wire::Done done;  // filled in by the shares as they finish (under the session's mutex)
};
// A data thread's part of a request: the pages striped onto its lanes, in its source memory.
struct Share {
  std::shared_ptr<Request> request;
  std::vector<uint32_t> positions;  // indices into transfer.pages
  size_t pool = 0;                  // the thread's source buffer it is placed in (its group's)
  uint64_t offset = 0, bytes = 0;   // its pages' place there
  bool placed = false;              // that place taken and the pages filled
  uint64_t total = 0;               // positions x repeat
  uint64_t prepared = 0, posted = 0, completed = 0;
  Clock::time_point first_post{}, last_completion{};
  uint64_t fill_ns = 0;
};
// A data thread's source memory: allocated and registered on its lanes once per session
// (the published engine registered its GPU buffers once), and lent to the shares of its
// requests as they come, first fit. Filling pages is then all a request costs.
struct SourcePool {
  PageBuffer memory;
  std::vector<MrPtr> mrs;              // per lane of the thread (of its group; else none)
  std::map<uint64_t, uint64_t> holes;  // free parts: offset -> bytes

  std::optional<uint64_t> Take(uint64_t bytes) {
    for (auto it = holes.begin(); it != holes.end(); ++it) {
      if (it->second < bytes) continue;
      const uint64_t at = it->first, left = it->second - bytes;
      holes.erase(it);
      if (left > 0) holes[at + bytes] = left;
      return at;
    }
    return std::nullopt;
  }
  void Give(uint64_t at, uint64_t bytes) {
    auto next = holes.lower_bound(at);
    if (next != holes.end() && at + bytes == next->first) {  // join the hole after
      bytes += next->second;
      next = holes.erase(next);
    }
    if (next != holes.begin()) {  // and the one before
      auto prev = std::prev(next);
      if (prev->first + prev->second == at) {
        prev->second += bytes;
        return;
      }
    }
    holes[at] = bytes;
  }
};
struct Session;
// One data thread of a session and everything only it touches (the sharded state): its
// lanes' endpoints, its source memory, its window of WRITEs, its queues and its counters.
struct Worker {
  Session* session = nullptr;
  size_t first_lane = 0;  // its lanes: first_lane .. first_lane + lane_count - 1
  size_t lane_count = 0;
  const DeviceGroup* group = nullptr;
  std::optional<unsigned> cpu;  // the core --pin puts it on
  // Declared before the pools, so that the pools' MRs close before their domains.
  std::vector<Network> lanes;
  // A source buffer per group among its lanes, in that group's GPU (the published engine kept
  // a buffer per GPU, also when one thread drove every NIC): a lane writes from its own
  // group's, never across PCIe switches and sockets. A thread per group has one.
  std::vector<SourcePool> pools;
  std::vector<size_t> pool_of;  // per lane of the thread: its group's pool
  HostBuffer staging;  // GPU memory: a share's pages are filled here, then copied in one go
  std::vector<fi_addr_t> dest;                // per lane: the client's address in that lane's AV
  std::vector<std::vector<uint8_t>> writers;  // per lane: our endpoint's address
  std::vector<Op> ops;
  std::vector<Op*> free_ops;
  std::vector<std::deque<Op*>> pending;  // per lane: WRITEs prepared, not yet posted
  std::vector<char> held_back;           // per lane: WRITEs posted with FI_MORE, no doorbell yet
  std::vector<std::vector<Op*>> riders;  // per lane: posted WRITEs that report no completion
  std::list<std::unique_ptr<Share>> shares;
  uint64_t writes = 0, bytes = 0;  // sharded counters, summed when reporting
  // WRITEs of this thread's taken from the window and not yet completed, and the posts the
  // provider refused (-FI_EAGAIN): written by the thread only, read by the control thread
  // when the WRITEs stop completing (Session::Poll says which of the three ways they stopped).
  std::atomic<uint64_t> in_flight{0}, refused{0};
  std::atomic<size_t> shares_held{0};  // shares of requests it holds unfinished (the same way)
  // What each rung does, counted, so that a switch that changed nothing shows (README.md).
  uint64_t most_prepared = 0, posts = 0, doorbells = 0, posted_in_poll = 0, completions = 0;
  // Pinning's figure: how often the thread found itself on another core than in its last
  // round (sched_getcpu, read from the vDSO each round; -1 before the first).
  uint64_t core_moves = 0;
  int last_core = -1;
  std::string placement;   // where the OS says the thread runs and allocates
  std::mutex inbox_mutex;  // the control thread hands new shares over here
  std::condition_variable inbox_ready;
  std::vector<std::unique_ptr<Share>> inbox;
  std::atomic<bool> has_inbox{false};
  // For the control thread: how often the loop went round (a counter, not a clock: reading a
  // clock in every round costs more than the round), and when a WRITE last completed.
  std::atomic<uint64_t> rounds{0};
  uint64_t rounds_seen = 0;  // the control thread's: the count it saw last, and when
  Clock::time_point seen_at = Clock::now();
  // The control thread's, at the thread's last work (last_work): its rounds, refused posts
  // and CPU time then, and whether the stall since has been told.
  Clock::rep completion_seen = 0;
  uint64_t rounds_at_completion = 0, refused_at_completion = 0;
  double cpu_at_completion = -1;  // its CPU seconds then: a spin and a wait tell apart
  bool stall_told = false;
  // <rung pin>
  CoreWatch core;  // the control thread's: whether something else took its core
  // </rung pin>
  std::atomic<Clock::rep> last_completion{Clock::now().time_since_epoch().count()};
  // A WRITE completed or a share came: the thread's own stall clock (a nap instead of a spin
  // once owed completions stop) and the control thread's (Session::Poll).
  std::atomic<Clock::rep> last_work{0};
  std::atomic<bool> exited{false};
  std::atomic<double> cpu_seconds{0};  // its CPU time, written as it ends
  std::atomic<pid_t> tid{0};
  std::thread thread;
};
inline Clock::time_point LastWork(const Worker& w) {
  return Clock::time_point{Clock::duration(w.last_work.load(std::memory_order_relaxed))};
}
// --no-shard: one window and one set of counters for all of a session's threads, behind a
// lock that every WRITE takes twice.
struct SharedState {
  std::mutex mutex;
  std::vector<Op> ops;
  std::vector<Op*> free_ops;
  uint64_t writes = 0, bytes = 0;
  uint64_t locks = 0;  // how often a thread took the lock
};
// The cores this server was given (GivenCpus at its start) and those its sessions' pinned data
// threads hold. Only the service thread touches it: it opens and ends sessions, and each time
// moves itself off the held cores while another is given (ControlCpus, common/topology.hpp).
struct Cores {
  std::vector<unsigned> given;
  std::multiset<unsigned> held;
  void Hold(const std::vector<unsigned>& cpus);
  void Release(const std::vector<unsigned>& cpus);

 private:
  void PlaceCaller() const;  // binds the calling thread to ControlCpus(given, held)
};
// Everything the server holds for one client, freed when the client goes.
struct Session : service::Session {
  ~Session() override {
    if (reserved != nullptr) *reserved -= reservation;
    if (cores != nullptr) cores->Release(pinned);
  }
  bool On(uint32_t flag) const { return engine.flags & flag; }
  std::vector<std::vector<uint8_t>> Writers() const override;
  std::string Describe() const override;
  std::string Dispatch(wire::Transfer transfer) override;
  Report Poll() override;
  bool Stop(const std::function<void()>& meanwhile = {}) override;
  void Abandon();  // a thread is stuck in the provider: give back what can be
  std::string Totals() const override;

  std::vector<std::vector<uint8_t>> addresses;  // per lane used
  std::vector<wire::RemoteRegion> regions;      // per lane used
  std::vector<size_t> owner;                    // per lane used: the worker that drives it
  wire::Engine engine;
  WaitMode wait = WaitMode::kSpin;
  double peer_timeout_s = 10;
  MemoryPath memory;
  const Plan* plan = nullptr;
  const Topology* topology = nullptr;
  SharedState shared;  // before the workers: their endpoints close first
  std::vector<std::unique_ptr<Worker>> workers;
  std::atomic<size_t> ready{0};  // workers whose lanes are open
  std::atomic<bool> stop{false};
  std::mutex mutex;  // guards failure and finished
  std::string failure;
  std::vector<wire::Done> finished;
  // What its NICs sent on the wire while it was open (their own counters; other sessions'
  // traffic on the same NICs included): beside the bytes it wrote, in the session's last line.
  std::unique_ptr<WireBytes> wire;
  std::atomic<uint64_t>* reserved = nullptr;  // the engine's count of all sessions' memory
  uint64_t reservation = 0;                   // this session's part of it
  Cores* cores = nullptr;        // the engine's, where its data threads are pinned here
  std::vector<unsigned> pinned;  // the cores they hold
};
// The data thread (engine.cpp).
void RunWorker(Worker& w);
void Fail(Session& s, const std::string& why);

// The engine the service drives: a session per CONNECT (session.cpp).
class Engine : public service::Engine {
 public:
  Engine(const Options& options, const Plan& plan, const Topology& topology, WaitMode wait,
         MemoryPath memory)
      : options_(options), plan_(plan), topology_(topology), wait_(wait), memory_(memory) {
    cores_.given = GivenCpus();  // constructed before any thread pins itself
  }
  std::unique_ptr<service::Session> Open(const wire::Connect& connect) override;

 private:
  const Options& options_;
  const Plan& plan_;
  const Topology& topology_;
  WaitMode wait_;
  MemoryPath memory_;
  std::atomic<uint64_t> reserved_{0};  // source memory of all open sessions (--server-memory)
  Cores cores_;
};

// --check: the preflight of this host (check.cpp); 0 ready, 1 not.
int RunCheck(const Options& options);

// The client (client.cpp).
void CheckClientOptions(const Options& options);
wire::Engine EngineFromOptions(const Options& options);
Summary RunSession(const Options& options, std::span<const uint8_t> peer, wire::Engine engine,
                   bool warm, bool print);
int RunLadder(const Options& options, std::span<const uint8_t> peer);

}  // namespace p5
