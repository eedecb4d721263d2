// 07_full_p5's parts, shared by its files (README.md, "The files"):
//   main.cpp         the network, as in 06: lanes on every NIC of every group; the programs
//   data_thread.cpp  a data thread and the ladder's rungs: what makes it fast
//   engine.cpp       the engine (its lanes, source memory and data threads, opened once) and
//                    a client in it (Peer): added for its CONNECT, fed, removed when it goes
//   client.cpp       the client: receiving threads, warmup, the requests, --ladder
//   service.cpp      the service: the control endpoint on the front desk, sessions, liveness
//   check.cpp        --check: this host's readiness, a line per check with its fix
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <list>
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
#include "provider_quirks.hpp"
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
// The lane that carries page i of a request of `pages` pages: the pages of a client's
// requests are dealt to its lanes as one deck, request after request, so every lane carries
// bytes whatever --pages (page i on lane i % lanes left lanes 16-31 idle for 16-page
// requests over 32 NICs). The warmup request starts the deck at lane 0.
inline size_t LaneOf(uint32_t request_id, size_t pages, size_t i, size_t lanes) {
  const uint64_t before = request_id == kWarmupRequest ? 0 : uint64_t{request_id - 1} * pages;
  return static_cast<size_t>((before + i) % lanes);
}
// A data thread that owes WRITEs and has seen none complete for this long (or half of
// --peer-timeout, if shorter) is stalled: the server says so once, with what the thread did
// meanwhile (Session::Poll). A live lane completes a WRITE every few microseconds, a 1 Gbit/s
// one a 64 KiB WRITE every 0.5 ms.
inline constexpr auto kStallTold = std::chrono::seconds(5);
// The clients a lane takes at once: their windows fill its provider queue this many times
// over (Engine::Open). shm's 1024 commands: 32 clients of -W 64.
inline constexpr uint64_t kQueueTurns = 2;

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
  // whether this one does, and the WRITEs before it that its completion vouches for: a chain
  // through the unreported ones, `rider` to `rider`.
  bool signaled = true;
  Op* rider = nullptr;
  bool immediate = true;  // carries its request's immediate data (all but --immediate last)
  // --immediate last: a WRITE that its lane's last one vouches for completes only once it
  // landed (FI_DELIVERY_COMPLETE): SRD and shm 2.x deliver a lane's WRITEs in no set order.
  bool delivered = false;
};
// A lane's prepared WRITEs of one client, oldest first: a ring with room for the client's
// whole window on the thread (no WRITE is prepared without a place in the window), so that a
// WRITE on its way out allocates nothing.
class PendingWrites {
 public:
  void Reserve(size_t writes) {
    ring_.assign(std::bit_ceil(std::max<size_t>(writes, 1)), nullptr);
    mask_ = ring_.size() - 1;
  }
  bool empty() const { return head_ == tail_; }
  size_t size() const { return tail_ - head_; }
  Op* front() const { return ring_[head_ & mask_]; }
  void pop_front() { ++head_; }
  void push_back(Op* op) { ring_[tail_++ & mask_] = op; }

 private:
  std::vector<Op*> ring_;
  size_t mask_ = 0, head_ = 0, tail_ = 0;
};

inline Op* OpOf(void* context) {
  return reinterpret_cast<Op*>(context);
}
// A lane's endpoint: common::Endpoint's objects (fabric, domain, CQ, AV, endpoint, opened as
// 03-06 open theirs), with 07's operations and where its pages live.
class Network : public Endpoint {
 public:
  // A data lane gets `pages`, where its pages live: by GPUDirect RDMA it refuses the CUDA API.
  // `selective`: a writer's lane whose WRITEs report one completion per doorbell's group
  // (OneCompletionPerGroup, FI_SELECTIVE_COMPLETION); else every WRITE reports its own.
  static Network Open(FiInfoPtr nic, WaitMode wait, const MemoryPath* pages = nullptr,
                      size_t cq_entries = 0, bool selective = false);
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
  // The provider reads FI_MORE (Quirk::kReadsMore): a WRITE posted with it waits for the next
  // doorbell.
  bool reads_more = false;
  // Its WRITEs to a peer land in the order posted (Quirk::kDeliversInOrder).
  bool delivers_in_order = false;
};
// The lanes: every group's NICs, group after group, and which group each lane belongs to.
struct Plan {
  std::vector<FiInfoPtr> lanes;
  std::vector<size_t> group_of;  // per lane
  std::vector<DeviceGroup> groups;
};
Topology LoadTopology(const Options& options);
MemoryKind MemoryFor(const Options& options);
// What 07 asks of a provider (FindNics; the preflight probes efa's fabrics with the same).
FiInfoPtr EngineHints(const Options& options, MemoryKind memory);
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
// own completion would come before the target has the data (Quirk::kCompletesBeforeDelivery),
// else 0 (its default).
uint64_t WriteCompletion(const fi_info& nic);
// Whether a writer's data lane reports one completion per doorbell's group instead of one per
// WRITE (FI_SELECTIVE_COMPLETION): where WriteCompletion asks for delivery, for pages in host
// memory (main.cpp).
bool OneCompletionPerGroup(const fi_info& nic, const MemoryPath* pages);
void WaitForCompletions(std::span<Network> lanes, int timeout_ms);
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
struct Peer;
struct PeerSlot;
struct Request {
  wire::Transfer transfer;
  Peer* peer = nullptr;
  std::atomic<size_t> shares_left{0};
  wire::Done done;  // filled in by the shares as they finish (under the peer's mutex)
};
// A data thread's part of a request: the pages striped onto its lanes, each WRITE's source
// and target worked out by the control thread as it hands the share over (Peer::Dispatch), so
// the data thread only posts.
struct Share {
  std::shared_ptr<Request> request;
  PeerSlot* slot = nullptr;  // the client, as the thread that serves this share sees it
  struct Page {
    uint64_t source = 0;  // where in the thread's source buffer (SourceOffset)
    uint64_t target = 0;  // where in the client's region
    size_t lane = 0;      // the thread's lane it goes out on
  };
  std::vector<Page> pages;
  uint64_t total = 0;  // pages x repeat
  uint64_t prepared = 0, posted = 0, completed = 0;
  // --immediate last, per lane of the thread: its WRITEs not yet prepared and those not yet
  // completed, and its last one, held back until the others completed (empty otherwise).
  std::vector<uint64_t> unprepared, unfinished;
  std::vector<Op*> last;
  size_t next_page = 0;  // the page the next WRITE sends: pages cycle `repeat` times
  Clock::time_point first_post{}, last_completion{};
};

// What the control thread hands a data thread, in the order it happens: a client joins (its
// slot), a share of a request to serve, a client leaves. One queue, so a thread takes them
// as they were given (pplx-garden's fabric-lib feeds its workers so: WorkerCommand).
struct WorkerCommand {
  enum Kind { kJoin, kServe, kLeave } kind;
  PeerSlot* slot = nullptr;      // kJoin, kLeave
  std::unique_ptr<Share> share;  // kServe
};
// A data thread's inbox. The control thread pushes (and wakes the thread); the thread takes
// everything at once each round. `waiting` is read without the lock: a round with nothing to
// take costs one load.
class CommandQueue {
 public:
  void Push(WorkerCommand command);
  std::vector<WorkerCommand> TakeAll();
  bool waiting() const { return waiting_.load(std::memory_order_acquire); }
  // Sleeps until a command comes, `stop` is set (Wake) or `limit` passes.
  void WaitFor(std::chrono::milliseconds limit, const std::atomic<bool>& stop);
  void Wake();

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<WorkerCommand> commands_;
  std::atomic<bool> waiting_{false};
};

struct Engine;
// How the engine is built, for all its clients: what the engine rungs switch (threads,
// pinning, sharding, NUMA). A client's posting settings (batch, lazy, doorbell, window) are
// its own (wire::Engine).
struct Shape {
  size_t threads = 1;
  bool pin = false, shard = false, numa = false;
  bool operator==(const Shape&) const = default;
};
// One data thread of the engine and everything only it touches (the sharded state): its
// lanes' endpoints, its source memory, the clients it serves on them, its queues and counters.
struct Worker {
  Engine* engine = nullptr;
  size_t index = 0;
  size_t first_lane = 0;  // its lanes: first_lane .. first_lane + lane_count - 1
  size_t lane_count = 0;
  const DeviceGroup* group = nullptr;
  std::optional<unsigned> cpu;  // the core --pin puts it on
  // Declared before the MRs, so that they close before their domains.
  std::vector<Network> lanes;
  // Per lane: its group's source buffer (Engine::sources) and its registration in the lane's
  // domain. A lane writes from its own group's pages, never across PCIe switches and sockets.
  std::vector<uint8_t*> source_at;
  std::vector<MrPtr> source_mrs;
  std::vector<void*> source_desc;             // fi_mr_desc of each, read once
  std::vector<std::vector<uint8_t>> writers;  // per lane: our endpoint's address
  std::vector<Op*> riders;  // per lane: the chain of posted WRITEs that report no completion
  // The clients it serves, in turn from `next` (PostWrites).
  std::vector<PeerSlot*> slots;
  size_t next = 0;
  bool in_order = false;   // its lanes complete WRITEs in order (Quirk::kCompletesInOrder)
  uint64_t fair_page = 1;  // bytes: the smallest page in service, the unit of each visit's credit
  // Engine-wide counters (a client's own are in its PeerSlot): written by the thread only,
  // read by the control thread.
  std::atomic<uint64_t> rounds{0}, refused{0};
  // Pinning's figure: how often the thread found itself on another core than in its last
  // round (sched_getcpu, read from the vDSO each round; -1 before the first).
  std::atomic<uint64_t> core_moves{0};
  int last_core = -1;
  std::string placement;  // where the OS says the thread runs and allocates
  CommandQueue inbox;     // clients and shares, from the control thread
  // The control thread's alone, never touched by the thread: the rounds it saw last, and when
  // (a thread stuck in the provider), and its CPU time then (a spin spends it; a thread kept
  // waiting does not).
  struct Watch {
    uint64_t rounds_seen = 0;
    Clock::time_point seen_at = Clock::now();
    double cpu_at_seen = -1;
  } watch;
  std::atomic<bool> ready{false}, exited{false}, stop{false};
  std::string failure;  // why it could not open (read once exited)
  std::atomic<pid_t> tid{0};
  std::thread thread;
};
// --no-shard: one window and one set of counters for all the threads that serve a client,
// behind a lock that every WRITE takes twice.
struct SharedState {
  std::mutex mutex;
  std::vector<Op> ops;
  std::vector<Op*> free_ops;
  uint64_t writes = 0, bytes = 0;
  uint64_t locks = 0;  // how often a thread took the lock
};
// A client as one data thread sees it: its address in each of the thread's lanes' AVs (an
// entry, not an endpoint), its window there, its shares, and what the thread did for it.
// The thread alone touches it between joining and leaving.
struct PeerSlot {
  Peer* peer = nullptr;
  Worker* worker = nullptr;
  size_t lanes_used = 0;        // the thread's first lanes that the client has
  std::vector<fi_addr_t> dest;  // per lane used: the client's entry in that lane's AV
  std::vector<Op> ops;          // its window on these lanes (--shard)
  std::vector<Op*> free_ops;
  // Per lane: its WRITEs prepared and not yet posted, and whether some went out with FI_MORE
  // and no doorbell yet. A queue per client, so that posts refused for one (a peer whose
  // connection is gone) never hold back another's.
  std::vector<PendingWrites> pending;
  std::vector<char> held_back;
  std::list<std::unique_ptr<Share>> shares;
  bool leaving = false;          // no new WRITEs; it leaves once those in flight completed
  uint64_t credit = 0;           // bytes it may still prepare in this visit (PrepareFor)
  uint64_t bytes_in_flight = 0;  // of the WRITEs it took from its window on this thread
  bool completed = false;        // a WRITE of its completed in this round's poll
  // What landed: read by the control thread too, for the line of a client dropped while its
  // thread still holds WRITEs of its.
  std::atomic<uint64_t> writes{0}, bytes{0};
  // What each rung does, counted, so that a switch that changed nothing shows (README.md).
  uint64_t most_prepared = 0, posts = 0, doorbells = 0, posted_in_poll = 0, completions = 0;
  bool entries_kept = false;  // Leave: its AV entries stay (Quirk::kRemoveNeedsMappedPeer)
  // WRITEs of this client's taken from the window and not yet completed; shares of its
  // requests the thread holds unfinished; its last completion or new share (Peer::Poll).
  std::atomic<uint64_t> in_flight{0};
  std::atomic<size_t> shares_held{0};
  std::atomic<Clock::rep> last_completion{Clock::now().time_since_epoch().count()};
  std::atomic<Clock::rep> last_work{Clock::now().time_since_epoch().count()};
  // The control thread's alone (Peer::Poll), never touched by the data thread: at the
  // client's last work, the thread's rounds, refused posts and CPU time then, and whether the
  // stall since has been told.
  struct Watch {
    Clock::rep completion_seen = 0;
    uint64_t rounds_at_completion = 0, refused_at_completion = 0;
    double cpu_at_completion = -1;
    bool stall_told = false;
  } watch;
  uint64_t moves_at_join = 0;  // the thread's core moves and CPU when the client came
  double cpu_at_join = 0, cpu_at_leave = 0;
  std::atomic<bool> joined{false}, left{false};
};
inline Clock::time_point LastWork(const PeerSlot& s) {
  return Clock::time_point{Clock::duration(s.last_work.load(std::memory_order_relaxed))};
}
// Everything the server holds for one client: an entry in the engine, freed when it goes.
struct Peer : service::Session {
  ~Peer() override;
  bool On(uint32_t flag) const { return settings.flags & flag; }
  std::vector<std::vector<uint8_t>> Writers() const override;
  std::string Describe() const override;
  uint64_t SourceBytes() const override;
  std::string Dispatch(wire::Transfer transfer) override;
  Report Poll() override;
  PeerProcess Process() const override;
  std::string WaitingCosts() const override;
  Leaving Leave() override;
  std::string Totals() const override;
  void AddTotals(JsonRecord& record) const override;
  void Fail(const std::string& why);

  Engine* engine = nullptr;
  std::vector<std::vector<uint8_t>> addresses;  // per lane used
  std::vector<wire::RemoteRegion> regions;      // per lane used
  std::vector<PeerSlot*> at_lane;               // per lane used: the slot of its thread
  wire::Engine settings;  // its posting settings; the engine's shape in its flags
  std::string asked;      // the shape it asked for, where the engine has another
  SharedState shared;     // before the slots: --no-shard's window
  std::vector<std::unique_ptr<PeerSlot>> slots;  // per thread that drives one of its lanes
  std::mutex mutex;                              // guards failure and finished
  std::string failure;
  std::vector<wire::Done> finished;
  // What its NICs sent on the wire while it was connected (their own counters; other
  // clients' traffic on the same NICs included): beside the bytes it wrote.
  std::unique_ptr<WireBytes> wire;
  std::unique_ptr<WireBytes> resent;               // what they sent again (efa; absent elsewhere)
  std::optional<Clock::time_point> leaving_since;  // when Leave was first called
  bool stuck = false;             // its WRITEs were still in flight a while after it left
  std::vector<uint64_t> held_at;  // per lane: those WRITEs, counted in Engine::held
  uint64_t generation = 0;        // the engine's Build it joined
  uint64_t committed = 0;         // its window, in Engine::committed until it left or is kept
  void Uncommit();
};
// The cores this server was given (GivenCpus at its start) and those its pinned data threads
// hold. Only the service thread touches it, and moves itself off the held cores while another
// is given (ControlCpus, common/topology.hpp).
struct Cores {
  std::vector<unsigned> given;
  std::vector<unsigned> held;
  CoreClaims claims;  // the pinned threads' cores, held for this host (common/topology.hpp)
  void Hold(const std::vector<unsigned>& cpus);
};
// The data thread (data_thread.cpp).
void RunWorker(Worker& w);

// The engine: its lanes, source memory and data threads, opened once (engine.cpp), and the
// clients it serves, each an entry in its lanes' AVs with its own region, keys and window.
struct Engine : service::Engine {
  Engine(const Options& options, const Plan& plan, const Topology& topology, WaitMode wait,
         MemoryPath memory);
  ~Engine() override;
  std::unique_ptr<service::Session> Open(const wire::Connect& connect) override;
  std::string Notice(const wire::Engine& asked) const override;
  Report Watch() override;
  bool Reclaim() override;
  // The WRITE commands the windows of a lane's clients may add up to (Open tells the next
  // client busy past it): the provider's queue where a WRITE holds its command until answered,
  // less what gone clients hold; else kQueueTurns queues' worth.
  uint64_t WindowRoom(size_t lane) const;
  // Opens the lanes and threads for `shape` (closing what was open first).
  void Build(const Shape& shape);
  void MakeSources();
  bool On(uint32_t flag) const;

  const Options& options;
  const Plan& plan;
  const Topology& topology;
  WaitMode wait;
  MemoryPath memory;
  Shape shape;
  // The source pages (common/page_data.hpp, FillSource): a buffer per group, in its GPU or on
  // its NUMA node, each holding the same data set of --server-memory over the groups, made
  // once before any client and resident (the published engine moved a KV cache that was
  // already there, and kept a buffer per GPU). Requests only read them; the data threads
  // register them on their lanes, again when the engine is rebuilt.
  std::vector<PageBuffer> sources;  // per group of the plan (empty where it has no lane)
  uint64_t source_bytes = 0;
  uint64_t generation = 0;    // Builds so far: a kept client's count holds only in its own
  bool stopped_clean = true;  // every thread of the last engine stopped before this Build
  size_t peers = 0;           // clients connected, or kept (a stuck leave)
  Clock::time_point watched_at = Clock::now();  // Watch's last call: a gap is time we were stopped
  size_t stuck_leaves = 0;          // clients kept: their WRITEs had not completed as they left
  std::vector<uint64_t> held;       // per lane: WRITEs of those clients, still in the provider
  std::vector<uint64_t> committed;  // per lane: the windows of the clients connected or leaving
  Cores cores;
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<size_t> owner;  // per lane: the worker that drives it
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
