// 07_full_p5: the client. Its lanes' completions are read by receiving threads, a thread per
// group as on the server, so that lanes and threads add rate at both ends; its main thread
// speaks to the server on a control endpoint of its own, sends the warmup and the requests,
// times them, and verifies every page. --ladder runs one session per rung.

#include <pthread.h>
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "address.hpp"
#include "backoff.hpp"
#include "engine.hpp"
#include "error.hpp"
#include "nic_counters.hpp"
#include "page_data.hpp"
#include "program.hpp"
#include "provider.hpp"

namespace p5 {

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Over shm, our endpoints' files in /dev/shm, which a server opens to reach them: one that is
// gone (removed while we ran, by a cleanup that was not ours) is named, for a client whose
// CONNECT went unanswered: the server refuses every CONNECT naming it.
std::string EndpointFilesGone(const Network& control, const std::vector<Network>& lanes) {
  std::string gone;
  auto check = [&](const Network& n, const std::string& what) {
    const std::string file = ShmFileOf(n.Address(), *n.info);
    struct stat st {};
    if (!file.empty() && stat(file.c_str(), &st) != 0)
      gone += "; our " + what + "'s file " + file + " is gone, so no peer can reach it";
  };
  check(control, "control endpoint");
  for (size_t l = 0; l < lanes.size(); ++l) check(lanes[l], "lane " + std::to_string(l));
  return gone;
}

// The engine's options, besides what the wire allows of a request (CheckRequestSize).
void CheckClientOptions(const Options& options) {
  CheckRequestSize(options);
  if (options.requests == 0 || options.requests > kMaxRequestsInFlight)
    throw UsageError("invalid --requests " + std::to_string(options.requests) + " (1 to " +
                     std::to_string(kMaxRequestsInFlight) + ")");
  if (options.window == 0 || options.window > wire::kMaxWindow)
    throw UsageError("invalid --window " + std::to_string(options.window) + " (1 to " +
                     std::to_string(wire::kMaxWindow) + ")");
  if (options.threads > wire::kMaxLanes)
    throw UsageError("invalid --threads " + std::to_string(options.threads) + " (0 to " +
                     std::to_string(wire::kMaxLanes) + ")");
  if (options.batch == 0 || options.batch > wire::kMaxBatch)
    throw UsageError("invalid --batch " + std::to_string(options.batch) + " (1 to " +
                     std::to_string(wire::kMaxBatch) + ")");
  if (options.doorbell == 0 || options.doorbell > options.window)
    throw UsageError("invalid --doorbell " + std::to_string(options.doorbell) + " (1 to -W, " +
                     std::to_string(options.window) + ")");
  if (options.warmup > wire::kMaxRepeat)
    throw UsageError("invalid --warmup " + std::to_string(options.warmup));
  // A start further off than the wait for the server would be a silence the server drops.
  if (options.start_at > 0 && options.start_at > UnixSeconds() + options.timeout_s) {
    char line[160];
    std::snprintf(line, sizeof line,
                  "invalid --start-at %.3f (%.0f s from now; at most --timeout, %g s)",
                  options.start_at, options.start_at - UnixSeconds(), options.timeout_s);
    throw UsageError(line);
  }
}
// A receiving thread of the client: the remote-write completions of its block of lanes (a
// group's, with a thread per group), counted per request in counters of its own and
// published once per batch, so the main thread never touches a CQ of theirs.
struct Receiver {
  size_t first_lane = 0, lane_count = 0;
  std::optional<unsigned> cpu;
  std::vector<uint64_t> arrived;  // per request id; the last entry counts the warmup
  // --immediate last: per request id and lane of the thread, the WRITEs that the lane's one
  // completion of the request counts for (empty: every WRITE completes here, counting one).
  std::vector<std::vector<uint64_t>> vouches;
  std::atomic<uint64_t> total{0}, warm{0};
  uint64_t completions = 0;  // timed remote-write completions read (written as it ends)
  std::unique_ptr<std::atomic<uint64_t>[]> per_lane;  // per lane of the thread
  uint64_t owed = 0;                                  // timed WRITEs its lanes receive in all
  std::atomic<Clock::rep> last_arrival{0};            // read once, when the last of them lands
  std::atomic<Clock::rep> first_arrival{0};           // and when the first timed one did
  std::mutex mutex;
  std::string failure;
  std::atomic<bool> failed{false};
  // How often it went round, and whether it is inside the provider's fi_cq_read now: one call
  // can last seconds while data flows (shm 2.x drains its command queue in one progress call,
  // as long as the writer keeps it from emptying), and the main thread must not take that for
  // silence (docs/failure-modes.md, "When a client waits").
  std::atomic<uint64_t> rounds{0};
  std::atomic<bool> reading{false};
  std::atomic<pid_t> tid{0};
  double cpu_seconds = 0;  // its CPU time, written as it ends (read after join)
  std::thread thread;
};
void RunReceiver(Receiver& r, std::span<Network> lanes, size_t requests, WaitMode wait,
                 const std::atomic<bool>& stop, const Topology* pin) {
  r.tid = gettid();
  pthread_setname_np(pthread_self(), ("07 recv " + std::to_string(r.first_lane)).c_str());
  std::string why;
  if (pin != nullptr && r.cpu && !PinThread(*pin, *r.cpu, why))
    std::printf("warning: receiver not pinned: %s\n", why.c_str());
  std::vector<uint64_t> lane_counts(r.lane_count);
  uint64_t total = 0, warm = 0, completions = 0;
  IdleBackoff backoff(8);  // --wait spin: idle rounds nap (at most 256 us), never taking a core
  try {
    while (!stop) {
      size_t n = 0;
      r.rounds.store(r.rounds.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      r.reading.store(true, std::memory_order_relaxed);
      for (size_t l = 0; l < r.lane_count; ++l) {
        n += ReadCompletions(
            lanes[l].cq.get(), false,
            [&](const fi_cq_data_entry& e, fi_addr_t) {
              if (!IsRemoteWrite(e)) return;
              if (e.data == kWarmupRequest) {
                ++warm;
              } else if (e.data == 0 || e.data > requests) {
                throw Error("a WRITE arrived for unknown request " + std::to_string(e.data));
              } else {
                // Never assume the last WRITE lands last: count them, or, where the server
                // marks only a lane's last one, posted once the others completed, count for
                // them all.
                const uint64_t n = r.vouches.empty() ? 1 : r.vouches[e.data][l];
                if (n == 0)
                  throw Error("lane " + std::to_string(r.first_lane + l) +
                              " received a WRITE of request " + std::to_string(e.data) +
                              ", which it carries no page of");
                r.arrived[e.data] += n;
                ++completions;
                total += n;
                lane_counts[l] += n;
              }
            },
            [&](const CompletionError& e) {
              throw Error("lane " + std::to_string(r.first_lane + l) + " (" +
                          lanes[l].info->domain_attr->name + "): " + e.text);
            });
      }
      r.reading.store(false, std::memory_order_relaxed);
      if (n > 0) {
        backoff.Busy();
        // The clock is read once, not per completion: at 1.5 M WRITEs a second reading it
        // for each batch cost 2% of this thread.
        if (total > 0 && r.first_arrival == 0)
          r.first_arrival = Clock::now().time_since_epoch().count();
        if (total == r.owed && r.last_arrival == 0)
          r.last_arrival = Clock::now().time_since_epoch().count();
        for (size_t l = 0; l < r.lane_count; ++l) r.per_lane[l] = lane_counts[l];
        r.warm = warm;
        r.total = total;
      } else if (wait == WaitMode::kBlock) {
        WaitForCompletions(lanes, 20);
      } else if (!r.vouches.empty() && total < r.owed) {
        // --immediate last: WRITEs land with no completion here, and over shm 2.x only inside
        // our polls (the target copies them): no nap while some are owed.
        std::this_thread::yield();
      } else {
        backoff.Idle();
      }
    }
  } catch (const std::exception& e) {
    std::lock_guard lock(r.mutex);
    r.failure = e.what();
    r.failed = true;
  }
  r.cpu_seconds = ThreadCpuSeconds();
  r.completions = completions;
}
// Stops and joins the receiving threads when it goes out of scope (declared after the lanes
// they poll, so it goes first), also when the session ends in an error.
struct Receivers {
  std::vector<std::unique_ptr<Receiver>> threads;
  std::atomic<bool> stop{false};
  void Stop() {
    stop = true;
    for (auto& r : threads)
      if (r->thread.joinable()) r->thread.join();
  }
  ~Receivers() { Stop(); }
};
// One client session: connect with `engine`, warm every lane up, send the requests, count
// and time the WRITEs, verify. The server makes it an entry of its engine. Each step is a
// method of its own; the members are the session's state, in the order it is built (and torn
// down in reverse: the receiving threads stop before the lanes they poll close).
class ClientSession {
 public:
  ClientSession(const Options& options, std::span<const uint8_t> peer, wire::Engine engine,
                bool warm, bool print);
  Summary Run();

 private:
  // The clock of the timed part, from the first request sent (Transfer).
  struct Timing {
    Clock::time_point start;
    double started_at = 0, seconds = 0, until_done = 0, main_cpu = 0;
    std::map<std::string, uint64_t> wire_bytes;
  };
  void OpenLanes();
  void RegisterRegions();
  void PlanRequests();
  void PlanReceivers();
  void OnControl(Op* op, const fi_cq_data_entry& entry, fi_addr_t source);
  void OnAccept(const wire::Accept& accept);
  void OnRefused(const wire::ErrorReply& error);
  bool Answers(uint32_t id);
  void Send(const wire::Message& message) { mail_->Send(server_, message); }
  void Progress();
  size_t PollControl();  // the control endpoint's completions
  void WatchLanes();
  std::string Missing() const;
  bool InsideProvider();
  std::string CountLags() const;
  uint64_t ArrivedTotal() const;
  void Connect();
  void StartReceivers();
  void WarmUp();
  void WaitForStart();
  Timing Transfer();
  void Finish();
  uint64_t Verify();
  Summary Summarize(const Timing& t, uint64_t verified);

  const Options& options_;
  wire::Engine engine_;
  bool warm_;
  const bool print_;
  const Clock::time_point began_ = Clock::now();
  const Clock::duration limit_;  // --timeout
  std::string no_hmem_;
  MemoryKind memory_kind_;
  Plan plan_;
  WaitMode wait_;
  // Control messages have an endpoint of their own, as on the server: the data lanes' CQs
  // then belong to the receiving threads alone.
  Network control_;
  fi_addr_t server_;
  std::vector<Network> lanes_;
  std::vector<std::string> domains_;  // each lane's NIC
  size_t cq_entries_ = 0;
  std::optional<bool> emulated_write_;
  std::map<size_t, PageBuffer> regions_;  // per group
  std::vector<MrPtr> region_mrs_;         // per lane
  Clock::duration registering_{};  // registration alone, apart from allocating and the transfer
  uint64_t registered_ = 0;
  std::optional<Mail> mail_;
  std::vector<wire::Transfer> requests_;
  wire::Transfer warmup_;
  std::vector<uint64_t> expected_per_lane_;
  std::vector<std::vector<uint64_t>> expected_per_request_;  // [request id][lane]: WRITEs
  // The topology receivers pin with is declared before them, so it outlives them: an early
  // exit (a refused warmup) joins them in ~Receivers, and one may only be pinning itself then.
  Topology topology_;
  std::vector<unsigned> given_;  // the cores this client was given, before any thread pinned
  CoreClaims claims_;            // the cores its pinned receivers hold, until they stopped
  Receivers receivers_;
  // What the server said.
  uint64_t expected_ = 0;  // WRITEs owed to us, less what the server refuses
  size_t done_count_ = 0, refused_count_ = 0;
  wire::Done served_{0, 0, UINT64_MAX, 0};  // the server's clock, from its DONEs
  uint64_t setup_ns_ = 0;
  uint64_t source_bytes_ = 0;  // the server's data set, what our pages are checked against
  std::string refused_;
  bool accepted_ = false;
  Clock::duration told_to_wait_{};  // the server's ERROR wire::kWait: its ACCEPT comes later
  std::string served_as_is_;        // the server's ERROR wire::kAsIs: the engine that serves us
  // Only our server's messages count: whoever reaches our control endpoint can send it
  // anything, and it is dropped and counted. Each request is answered once (DONE or ERROR): a
  // second answer, or one for a request we never made, is no answer of our server's.
  ServerFilter from_server_;
  std::vector<bool> answered_;
  bool warmup_answered_ = false;
  // Signs of life: WRITEs seen, each lane's count and when it last moved, each receiver's
  // rounds and since when they stood still.
  double link_gbps_ = 0;
  std::optional<ProgressLine> progress_line_;
  Clock::duration inside_for_{};  // the longest provider call a receiver is in now
  Clock::time_point last_progress_ = Clock::now();
  Clock::time_point progressed_at_ = Clock::now();  // this thread's last round
  uint64_t seen_ = 0;
  std::vector<uint64_t> lane_seen_;
  std::vector<Clock::time_point> lane_moved_;
  std::vector<uint64_t> rounds_seen_;
  std::vector<Clock::time_point> same_since_;
  ControlNap nap_;
  // This thread only watches: with the receivers pinned it keeps off their cores while another
  // is given, and gets all of them back when the session ends (the ladder's next rung).
  struct Unbind {
    const std::vector<unsigned>& given;
    bool bound = false;
    ~Unbind() {
      std::string why;
      if (bound) BindThreadTo(given, why);
    }
  } unbind_{given_};
};

ClientSession::ClientSession(const Options& options, std::span<const uint8_t> peer,
                             wire::Engine engine, bool warm, bool print)
    : options_(options),
      engine_(engine),
      warm_(warm),
      print_(print),
      limit_(std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(options.timeout_s))),
      memory_kind_(MemoryFor(options)),
      plan_(FindNics(options, peer, memory_kind_, &no_hmem_, print)),
      wait_(ChooseWaitMode(options.wait, *plan_.lanes[0])),
      control_(Network::Open(FiInfoPtr(fi_dupinfo(plan_.lanes[0].get())), wait_)),
      server_(control_.AddPeerAddress(peer)),
      topology_(LoadTopology(options)),
      from_server_(server_, wire::NewToken()) {
  OpenLanes();
  RegisterRegions();
  mail_.emplace(control_, kRecvDepth, options_.requests + 4);
  PlanRequests();
  PlanReceivers();
  for (const auto& lane : lanes_)  // --link-gbps is the rate of one NIC
    link_gbps_ += options_.link_gbps > 0 ? options_.link_gbps : LinkGbps(*lane.info);
  progress_line_.emplace(expected_, link_gbps_, options_.progress_every);
}
void ClientSession::OpenLanes() {
  control_.memory = ChooseMemoryPath(control_.domain.get(), *control_.info, memory_kind_,
                                     options_.gpu_path, no_hmem_, options_.dmabuf);
  cq_entries_ = ReceiverCqEntries(options_.window);
  for (const auto& nic : plan_.lanes)
    lanes_.push_back(Network::Open(DataLane(*nic), wait_, &control_.memory, cq_entries_));
  for (const auto& lane : lanes_) domains_.push_back(lane.info->domain_attr->name);
  emulated_write_ = EmulatedWrite(lanes_[0].ep.get());
  RequireDeviceWrites(control_.memory, emulated_write_);
  if (print_) PrintHeader("client", plan_, wait_, control_.memory, emulated_write_);
  const size_t tx = lanes_[0].info->tx_attr->size;
  if (options_.window > tx)
    throw UsageError("invalid --window " + std::to_string(options_.window) +
                     ": the provider's queue holds " + std::to_string(tx));
  if (!options_.address_file.empty()) {           // our lane addresses, then our control endpoint's
    std::vector<std::vector<uint8_t>> addresses;  // (tests play a thief and a forger with them)
    for (const auto& lane : lanes_) addresses.push_back(lane.Address());
    addresses.push_back(control_.Address());
    WriteAddressList(addresses, options_.address_file);
  }
  lane_seen_.assign(lanes_.size(), 0);
  lane_moved_.assign(lanes_.size(), Clock::now());
}
// The region has room for twice the pages asked for, so the chosen pages are scattered; each
// request gets its own share of them. One region per group, in its GPU's memory or host
// memory, registered once on each of the group's lanes (each domain gives it a key).
void ClientSession::RegisterRegions() {
  const uint64_t region_pages = 2 * options_.pages * options_.requests;
  for (size_t l = 0; l < lanes_.size(); ++l) {
    const size_t g = plan_.group_of[l];
    if (!regions_.count(g))
      regions_.try_emplace(g, region_pages * options_.page_size, control_.memory,
                           plan_.groups[g].gpu.value_or(0));
    const auto before = Clock::now();
    region_mrs_.push_back(RegisterPages(lanes_[l].domain.get(), *lanes_[l].info, regions_.at(g),
                                        FI_REMOTE_WRITE, control_.memory));
    registering_ += Clock::now() - before;
    registered_ += regions_.at(g).size();
  }
}
// The requests (and the warmup), what each lane is owed, and what the server keeps for us.
void ClientSession::PlanRequests() {
  const uint64_t total_pages = options_.pages * options_.requests;
  const uint64_t region_pages = 2 * total_pages;
  if (total_pages < lanes_.size())  // a lane dealt no page would sit idle, unsaid
    throw UsageError(
        "--pages " + std::to_string(options_.pages) + " x --requests " +
        std::to_string(options_.requests) + " = " + Plural(total_pages, "page") + " over " +
        Plural(lanes_.size(), "lane") + ": " +
        (total_pages + 1 == lanes_.size()
             ? "lane " + std::to_string(total_pages)
             : "lanes " + std::to_string(total_pages) + "-" + std::to_string(lanes_.size() - 1)) +
        " would carry nothing (ask for " + std::to_string(lanes_.size()) +
        " pages or more, or fewer --nics)");
  const std::vector<uint32_t> all_pages = SamplePages(options_.seed, total_pages, region_pages);
  requests_.resize(options_.requests);
  for (size_t r = 0; r < requests_.size(); ++r) {
    requests_[r].request_id = static_cast<uint32_t>(r + 1);
    requests_[r].seed = options_.seed;
    requests_[r].page_size = options_.page_size;
    requests_[r].repeat = options_.repeat;
    requests_[r].pages.assign(all_pages.begin() + r * options_.pages,
                              all_pages.begin() + (r + 1) * options_.pages);
  }
  answered_.assign(requests_.size() + 1, false);
  expected_ = total_pages * options_.repeat;
  // <rung warmup>
  // Warmup: the first page of each lane, --warmup times, untimed. It lands where the timed
  // WRITEs land later, with the same data (the deck's first pages, one per lane).
  warmup_ = requests_[0];
  warmup_.request_id = kWarmupRequest;
  warmup_.pages.assign(all_pages.begin(),
                       all_pages.begin() + std::min<uint64_t>(lanes_.size(), total_pages));
  warmup_.repeat = options_.warmup;
  warm_ = warm_ && options_.warmup > 0;
  // </rung warmup>
  // What each lane receives: the pages LaneOf deals it.
  expected_per_lane_.assign(lanes_.size(), 0);
  expected_per_request_.assign(requests_.size() + 1, std::vector<uint64_t>(lanes_.size()));
  for (const auto& r : requests_)
    for (size_t i = 0; i < r.pages.size(); ++i) {
      const size_t lane = LaneOf(r.request_id, r.pages.size(), i, lanes_.size());
      expected_per_lane_[lane] += r.repeat;
      expected_per_request_[r.request_id][lane] += r.repeat;
    }
  const size_t control_limit = MessageLimit(control_.ep.get(), *control_.info);
  if (std::max(wire::Encode(requests_[0]).size(), wire::Encode(warmup_).size()) > control_limit)
    throw UsageError("--pages " + std::to_string(options_.pages) + ": a TRANSFER of that many " +
                     "pages is longer than the " + std::to_string(control_limit) +
                     "-byte messages this fabric carries (efa-direct: at most its MTU)");
}
// Receiving threads: as many as the server's data threads, over the same blocks of lanes.
void ClientSession::PlanReceivers() {
  // <rung threads>
  const size_t threads = ThreadsFor(engine_.threads, plan_, lanes_.size());
  // </rung threads>
  // <without threads> const size_t threads = 1;
  std::map<const DeviceGroup*, size_t> per_group;
  given_ = GivenCpus();  // before any thread pins itself
  bool claim = false;    // pinned receivers hold their cores for this host (CoreClaims)
  // <rung pin>
  claim = (engine_.flags & wire::kEnginePin) && IsThisSystem(topology_);
  // </rung pin>
  std::vector<unsigned> sharing;
  for (size_t t = 0; t < threads; ++t) {
    auto r = std::make_unique<Receiver>();
    // <rung threads>
    r->first_lane = t * lanes_.size() / threads;  // the server's thread t's block of lanes
    r->lane_count = (t + 1) * lanes_.size() / threads - r->first_lane;
    // </rung threads>
    // <without threads> r->lane_count = lanes_.size();  // the one thread: every lane
    r->arrived.assign(requests_.size() + 1, 0);
    r->per_lane = std::make_unique<std::atomic<uint64_t>[]>(r->lane_count);
    for (size_t l = r->first_lane; l < r->first_lane + r->lane_count; ++l)
      r->owed += expected_per_lane_[l];
    if (engine_.flags & wire::kEngineLastImmediate)  // its lanes' part of each request
      for (const auto& per_lane : expected_per_request_)
        r->vouches.emplace_back(per_lane.begin() + r->first_lane,
                                per_lane.begin() + r->first_lane + r->lane_count);
    // Cores from the group's last one down, among those this client was given (taskset,
    // Slurm, a cpuset) and, pinned, those no other process of this host holds: a server and
    // its clients on one host (shm, loopback) then pin to different cores, as on K hosts they
    // would not share one. Only when every core is held does a receiver share one.
    const DeviceGroup& group = plan_.groups[plan_.group_of[r->first_lane]];
    const std::vector<unsigned> cpus =
        IsThisSystem(topology_) ? CpusWithin(group.cpus, given_) : group.cpus;
    if (!cpus.empty()) {
      std::string why;
      const auto held = claim ? claims_.Take({cpus.rbegin(), cpus.rend()}, &why) : std::nullopt;
      r->cpu = held ? *held : cpus[cpus.size() - 1 - per_group[&group]++ % cpus.size()];
      if (claim && !held) sharing.push_back(*r->cpu);
      if (!why.empty() && print_) std::printf("note: %s\n", why.c_str());
    }
    receivers_.threads.push_back(std::move(r));
  }
  if (!sharing.empty() && print_)
    std::printf(
        "note: every core this client may use is held by a pinned thread of this host; "
        "receivers share cpu %s\n",
        FormatCpuList(sharing).c_str());
  rounds_seen_.assign(receivers_.threads.size(), 0);
  same_since_.assign(receivers_.threads.size(), Clock::now());
}
uint64_t ClientSession::ArrivedTotal() const {
  uint64_t n = 0;
  for (const auto& r : receivers_.threads) n += r->total;
  return n;
}
bool ClientSession::Answers(uint32_t id) {
  if (id == kWarmupRequest) return warm_ && !std::exchange(warmup_answered_, true);
  if (id == 0 || id > requests_.size() || answered_[id]) return false;
  answered_[id] = true;
  return true;
}
// A control completion: a send of ours done, or a message, which counts only if our server
// sent it.
void ClientSession::OnControl(Op* op, const fi_cq_data_entry& entry, fi_addr_t source) {
  if (op == nullptr) return;  // the control endpoint receives no WRITEs
  if (op->kind == OpKind::kSend) {
    mail_->Sent(op);
    return;
  }
  std::optional<wire::Message> message =
      from_server_.Take({op->buffer, entry.len}, control_.source ? source : FI_ADDR_UNSPEC);
  control_.PostRecv(*op);
  if (!message) return;
  if (auto* accept = std::get_if<wire::Accept>(&*message); accept != nullptr && !accepted_) {
    OnAccept(*accept);
  } else if (auto* d = std::get_if<wire::Done>(&*message); d && Answers(d->request_id)) {
    if (d->request_id == kWarmupRequest) return;
    ++done_count_;
    served_.first_post_ns = std::min(served_.first_post_ns, d->first_post_ns);
    served_.last_completion_ns = std::max(served_.last_completion_ns, d->last_completion_ns);
  } else if (auto* error = std::get_if<wire::ErrorReply>(&*message);
             error && (!accepted_ || error->request_id == 0 || Answers(error->request_id))) {
    OnRefused(*error);
  } else {
    from_server_.Ignore("a message that answers nothing we asked");
  }
}
// efa-direct takes a WRITE only from an initiator in the target's AV (fi_efa(7)): each lane's
// writer goes into that lane's AV before anything of ours asks for a WRITE. Done on every
// provider, so that CI runs the path a p5 on efa-direct needs.
void ClientSession::OnAccept(const wire::Accept& accept) {
  if (accept.writers.size() > lanes_.size())
    throw Error("the server named " + std::to_string(accept.writers.size()) + " writers for our " +
                std::to_string(lanes_.size()) + " lanes");
  for (size_t l = 0; l < accept.writers.size(); ++l) lanes_[l].AddPeerAddress(accept.writers[l]);
  if (print_)
    std::printf("the server's writers are in our lanes' AVs: %zu of %zu lanes\n",
                accept.writers.size(), lanes_.size());
  if (accept.source_bytes < options_.page_size)
    throw Error("the server's source pages (" + std::to_string(accept.source_bytes) +
                " bytes a buffer) hold no page of " + std::to_string(options_.page_size) +
                " bytes: start it with a larger --server-memory");
  accepted_ = true;
  setup_ns_ = accept.setup_ns;
  source_bytes_ = accept.source_bytes;
  mail_->Seal(server_, accept.session);  // our requests and BYE carry it
}
void ClientSession::OnRefused(const wire::ErrorReply& error) {
  if (!accepted_ && error.text.rfind(wire::kWait, 0) == 0) {
    if (told_to_wait_ == Clock::duration{}) {  // once: a server that says so again gets no more
      told_to_wait_ = wire::kOpeningWait;
      if (print_)
        std::printf("the server answers later: %s; waiting up to %s more\n",
                    error.text.substr(wire::kWait.size()).c_str(),
                    FormatSeconds(told_to_wait_).c_str());
    }
    return;
  }
  if (!accepted_ && error.text.rfind(wire::kAsIs, 0) == 0) {
    served_as_is_ = error.text.substr(wire::kAsIs.size());
    if (print_)
      std::printf("the server serves us with its engine as it is: %s\n", served_as_is_.c_str());
    return;
  }
  if (!accepted_ && error.text.rfind(wire::kBusy, 0) == 0)
    throw Busy("the server is busy (" + error.text.substr(wire::kBusy.size()) +
               "): try again later");
  if (!accepted_) throw Error("the server refused the connection: " + error.text);
  if (error.request_id == 0 && error.text.rfind(wire::kSessionEnded, 0) == 0)
    throw Error("the server ended this session: " + error.text.substr(wire::kSessionEnded.size()));
  if (refused_.empty())
    refused_ =
        (error.request_id == kWarmupRequest ? std::string("warmup")
                                            : "request " + std::to_string(error.request_id)) +
        ": " + error.text;
  // The other requests are still being written: wait for them before saying BYE.
  if (error.request_id >= 1 && error.request_id <= requests_.size()) {
    expected_ -= requests_[error.request_id - 1].pages.size() * options_.repeat;
    ++refused_count_;
  }
}
// Each lane's count, as its receiver published it, and when it last moved.
void ClientSession::WatchLanes() {
  for (const auto& r : receivers_.threads)
    for (size_t l = 0; l < r->lane_count; ++l)
      if (const uint64_t got = r->per_lane[l]; got != lane_seen_[r->first_lane + l]) {
        lane_seen_[r->first_lane + l] = got;
        lane_moved_[r->first_lane + l] = Clock::now();
      }
}
// Names the lanes still owed WRITEs, and the cause where one is seen: a NIC whose link is
// down, else the lane whose WRITEs stopped landing first (a path that failed beyond the NIC;
// docs/failure-modes.md, "When a NIC fails"). The others stall after it, once its WRITEs hold
// the whole window; the session ends with that, not a wait without end.
std::string ClientSession::Missing() const {
  std::string lanes_owed;
  std::vector<size_t> owed;  // lanes still owed WRITEs, the one that stopped first at front
  for (size_t lane = 0; lane < lanes_.size(); ++lane) {
    if (lane_seen_[lane] >= expected_per_lane_[lane]) continue;
    lanes_owed += std::string(lanes_owed.empty() ? "" : ", ") + "lane " + std::to_string(lane) +
                  " (" + domains_[lane] + ") " +
                  std::to_string(expected_per_lane_[lane] - lane_seen_[lane]) + " of " +
                  std::to_string(expected_per_lane_[lane]);
    owed.push_back(lane);
  }
  // A NIC whose kernel says its link is down is named as the cause, whichever lane stopped
  // first: a lane that lagged may stop a moment after the others fill the window.
  std::string down;
  for (const size_t lane : owed)
    if (common::LinkUp(domains_[lane]) == false)
      down += std::string(down.empty() ? "" : ", ") + "lane " + std::to_string(lane) + " (" +
              domains_[lane] + ")";
  if (!down.empty())
    return lanes_owed + "; " + down + ": its NIC's link is down (07 does not fail over)";
  std::sort(owed.begin(), owed.end(),
            [&](size_t x, size_t y) { return lane_moved_[x] < lane_moved_[y]; });
  if (owed.size() > 1 &&
      lane_moved_[owed[1]] - lane_moved_[owed[0]] > std::chrono::milliseconds(50))
    lanes_owed += "; lane " + std::to_string(owed[0]) + " (" + domains_[owed[0]] +
                  ") stopped first, " + FormatSeconds(lane_moved_[owed[1]] - lane_moved_[owed[0]]) +
                  " before the others: its NIC or its path failed (07 does not fail over)";
  return lanes_owed;
}
// A receiver inside one call of the provider's (its round count unchanged): the provider may be
// moving our data there, so its silence is not the server's; but a call that does not return
// in 6 x --timeout (at least a minute) is the provider's wedge.
bool ClientSession::InsideProvider() {
  const auto bound = std::max<Clock::duration>(6 * limit_, std::chrono::seconds(60));
  bool inside = false;
  const auto now = Clock::now();
  inside_for_ = {};
  for (size_t i = 0; i < receivers_.threads.size(); ++i) {
    const Receiver& r = *receivers_.threads[i];
    const uint64_t rounds = r.rounds.load(std::memory_order_relaxed);
    if (rounds != rounds_seen_[i]) {
      rounds_seen_[i] = rounds;
      same_since_[i] = now;
      continue;
    }
    if (!r.reading.load(std::memory_order_relaxed)) continue;
    inside_for_ = std::max(inside_for_, now - same_since_[i]);
    if (now - same_since_[i] < limit_ / 100) continue;
    if (now - same_since_[i] > bound)
      Abandon(kProgram, "a receiving thread has been inside the provider's fi_cq_read for " +
                            FormatSeconds(now - same_since_[i]) + ": it does not return");
    inside = true;
  }
  return inside;
}
// Why the count lags what landed now, for the progress line ("": it does not): a receiver
// that has been inside one provider call for a tenth of a line's span or more (shm 2.x drains
// its command queue in one call while the writer keeps it full). With --immediate last the
// count moves only as a lane's part of a request ends: a line with no new count says so.
std::string ClientSession::CountLags() const {
  const double inside = std::chrono::duration<double>(inside_for_).count();
  if (inside >= 0.1 * progress_line_->every_seconds())
    return "a receiver is " + FormatSeconds(inside_for_) + " into one provider call";
  return "";
}
// One round of the main thread: control messages, our sends, the receivers' failures and signs
// of life; it ends the session when the server has been silent for --timeout.
size_t ClientSession::PollControl() {
  return control_.PollCompletion(
      [this](Op* op, const fi_cq_data_entry& e, fi_addr_t from) { OnControl(op, e, from); },
      [](Op*, const CompletionError& error) {
        Abandon(kProgram, "a control message failed: " + error.text);
      });
}
void ClientSession::Progress() {
  // A round over a second after the last one: this process was stopped (SIGSTOP, a debugger)
  // or not run. That time is ours, not the server's silence (the server keeps a stopped
  // client's place): the wait for the server resumes where it stood.
  const auto now = Clock::now();
  if (now - progressed_at_ > std::chrono::seconds(1)) last_progress_ += now - progressed_at_;
  progressed_at_ = now;
  if (StopRequested()) {  // Ctrl-C or SIGTERM: BYE; then no thread left in the provider, exit
    SayBye(*mail_, server_, [this] { PollControl(); });
    // WRITEs the server had in flight land before the receivers stop (1.17's shm completes
    // a lane's WRITEs in order: one left behind would stop the server's lane for good).
    const auto end = Clock::now() + std::chrono::seconds(3);
    for (auto [seen, quiet] = std::pair(ArrivedTotal(), Clock::now());
         Clock::now() - quiet < std::chrono::milliseconds(300) && Clock::now() < end;) {
      PollControl();
      if (ArrivedTotal() != seen) std::tie(seen, quiet) = std::pair(ArrivedTotal(), Clock::now());
    }
    receivers_.Stop();
    Abandon(kProgram, kStoppedWhy);
  }
  size_t n = PollControl();
  if (!mail_->Flush(limit_).empty())
    Abandon(kProgram, "no answer from the server within " + FormatSeconds(limit_) +
                          ": it takes none of our messages (is it running at that address?)");
  for (const auto& r : receivers_.threads)
    if (r->failed) {
      std::lock_guard lock(r->mutex);
      Abandon(kProgram, r->failure);
    }
  const uint64_t now_seen = ArrivedTotal();
  if (n > 0 || now_seen != seen_ || InsideProvider()) last_progress_ = Clock::now();
  WatchLanes();
  seen_ = now_seen;
  // The receivers count the data; this thread only watches, so it naps unless a control
  // message came (a spinning watcher takes a core from the lanes on a small machine).
  if (n == 0)
    nap_.Idle();  // 1 ms, doubling to 8 ms (common/backoff.hpp)
  else
    nap_.Busy();
  if (accepted_ && Clock::now() - last_progress_ > limit_) {  // before ACCEPT: Connect's loop
    const std::string owed = Missing();
    Abandon(kProgram,
            "no answer from the server within " + FormatSeconds(limit_) +
                (owed.empty() ? " (is it running at that address?)" : "; missing: " + owed));
  }
}
// CONNECT, again until answered: the server answers a CONNECT once one came from the address
// it names.
void ClientSession::Connect() {
  wire::Connect connect;
  connect.engine = engine_;
  for (size_t l = 0; l < lanes_.size(); ++l) {
    PageBuffer& region = regions_.at(plan_.group_of[l]);
    connect.lanes.push_back(
        {lanes_[l].Address(),
         lanes_[l].Advertise(region_mrs_[l].get(), region.nic_data(), region.size())});
  }
  connect.reply = control_.Address();
  mail_->Seal(server_, from_server_.token());  // the server's answers carry it back
  Send(connect);
  for (ConnectRepeat again; !accepted_; Progress()) {
    // A server that has never heard us takes none of our CONNECTs; one that told us to wait
    // has kOpeningWait more.
    if (again.Expired(limit_ + told_to_wait_))
      Abandon(kProgram,
              "no answer from the server within " + FormatSeconds(limit_ + told_to_wait_) +
                  " to our CONNECT (" +
                  (mail_->Queued(server_) ? "its endpoint has not taken it" : "taken, unanswered") +
                  ": is it running at that address?)" + EndpointFilesGone(control_, lanes_));
    if (mail_->Idle() && again.Due()) Send(connect);  // our address is in the server's AV now
  }
}
// The receivers start only now: until ACCEPT this thread puts the server's writers into the
// lanes' AVs, and a lane is used by one thread at a time (FI_THREAD_DOMAIN: the provider locks
// nothing for us). An insert beside a receiver polling the same lane was a data race on shm's
// state, the likely cause of a 2.6 shm client that saw no WRITE after its warmup.
void ClientSession::StartReceivers() {
  for (auto& r : receivers_.threads) {
    const Topology* pin = nullptr;  // where a receiver pins itself: nowhere
    // <rung pin>
    if ((engine_.flags & wire::kEnginePin) && IsThisSystem(topology_)) pin = &topology_;
    // </rung pin>
    r->thread = std::thread(RunReceiver, std::ref(*r),
                            std::span<Network>(lanes_).subspan(r->first_lane, r->lane_count),
                            requests_.size(), wait_, std::cref(receivers_.stop), pin);
  }
  // <rung pin>
  if ((engine_.flags & wire::kEnginePin) && IsThisSystem(topology_)) {
    std::vector<unsigned> pinned;
    for (const auto& r : receivers_.threads)
      if (r->cpu) pinned.push_back(*r->cpu);
    std::string why;
    unbind_.bound = BindThreadTo(ControlCpus(given_, pinned), why);
    if (!unbind_.bound && print_)
      std::printf("warning: the main thread stays where it was: %s\n", why.c_str());
  }
  // </rung pin>
}
void ClientSession::WarmUp() {
  // <rung warmup>
  if (!warm_) return;
  Send(warmup_);
  auto warmed = [&] {
    uint64_t n = 0;
    for (const auto& r : receivers_.threads) n += r->warm;
    return n;
  };
  while (warmed() < warmup_.pages.size() * warmup_.repeat && refused_.empty()) Progress();
  // </rung warmup>
}
// --start-at: clients started one after another are timed together (scripts/bench-clients).
// Waiting is not silence: the control messages are still read meanwhile.
void ClientSession::WaitForStart() {
  for (double left; (left = options_.start_at - UnixSeconds()) > 0 && refused_.empty();) {
    if (left > 0.01)
      Progress();
    else
      std::this_thread::sleep_for(std::chrono::duration<double>(left));
    last_progress_ = Clock::now();
  }
}
// The clock runs from the first request sent to the last WRITE landed: the pages it moves
// exist before it starts (the server made them once), and nothing a provider does with
// completions can shrink it.
// What the NICs themselves count on the wire (common/nic_counters), from here to the last
// WRITE landed, beside the pages they carried.
ClientSession::Timing ClientSession::Transfer() {
  WireBytes wire(domains_, WireDirection::kReceived);
  wire.Start();
  Timing t;
  t.start = Clock::now();
  t.started_at = UnixSeconds();
  const double cpu_start = ThreadCpuSeconds();  // this thread only watches: it should nap
  for (const auto& request : requests_) Send(request);
  while (ArrivedTotal() < expected_) {
    Progress();
    const uint64_t n = ArrivedTotal();
    progress_line_->Update(n, n * options_.page_size,
                           std::chrono::duration<double>(Clock::now() - t.start).count(),
                           CountLags(),
                           (engine_.flags & wire::kEngineLastImmediate)
                               ? "--immediate last: counted as a lane's part of a request "
                                 "ends"
                               : "");
  }
  t.wire_bytes = wire.Bytes();
  Clock::rep last = 0;
  for (const auto& r : receivers_.threads) last = std::max(last, r->last_arrival.load());
  t.seconds =
      std::chrono::duration<double>(Clock::time_point{Clock::duration(last)} - t.start).count();
  t.main_cpu = ThreadCpuSeconds() - cpu_start;
  progress_line_->End();
  while (done_count_ + refused_count_ < requests_.size()) Progress();  // the server's own clock
  // Every DONE comes after the server's last completion: its span fits inside this one.
  t.until_done = std::chrono::duration<double>(Clock::now() - t.start).count();
  return t;
}
// BYE, the receivers stopped, and every request's WRITEs counted.
void ClientSession::Finish() {
  Send(wire::Bye{});
  while (!mail_->Idle()) Progress();  // every message of ours has left
  receivers_.stop = true;
  for (auto& r : receivers_.threads) r->thread.join();
  if (!refused_.empty()) throw Error("the server refused " + refused_);
  std::vector<uint64_t> arrived(requests_.size() + 1);
  for (const auto& r : receivers_.threads)
    for (size_t i = 1; i < arrived.size(); ++i) arrived[i] += r->arrived[i];
  for (size_t r = 1; r < arrived.size(); ++r) {
    if (arrived[r] != requests_[r - 1].pages.size() * options_.repeat)
      throw Error("request " + std::to_string(r) + " received " + std::to_string(arrived[r]) +
                  " WRITEs");
  }
}
// Every page of every request, as it landed; returns the bytes verified.
uint64_t ClientSession::Verify() {
  std::map<size_t, std::span<uint8_t>> views;
  for (auto& [g, region] : regions_) {
    region.SyncFromNic();
    views[g] = region.HostView();
  }
  std::vector<std::span<const uint8_t>> lane_views;
  for (size_t l = 0; l < lanes_.size(); ++l) lane_views.push_back(views.at(plan_.group_of[l]));
  uint64_t verified = 0;
  for (const auto& request : requests_)
    verified += VerifySourcePages(lane_views, request.pages, request.page_size, request.seed,
                                  source_bytes_);
  return verified;
}
Summary ClientSession::Summarize(const Timing& t, uint64_t verified) {
  Summary summary;
  summary.bytes = ArrivedTotal() * options_.page_size;
  summary.writes = ArrivedTotal();
  summary.seconds = t.seconds;
  summary.started_at = t.started_at;
  summary.answered_seconds = t.until_done;
  summary.server_seconds =
      static_cast<double>(served_.last_completion_ns - served_.first_post_ns) / 1e9;
  summary.link_gbps = link_gbps_;
  summary.verified_bytes = verified;
  summary.lanes = static_cast<int>(lanes_.size());
  summary.memory = MemoryWord(control_.memory);
  summary.memory_why = control_.memory.why;
  summary.server_setup_seconds = static_cast<double>(setup_ns_) / 1e9;
  summary.registered_bytes = registered_;
  summary.registration_seconds = std::chrono::duration<double>(registering_).count();
  summary.source_bytes = source_bytes_;
  // The first timed WRITE's arrival, from the first TRANSFER sent: what the warmup moves.
  Clock::rep first = 0;
  for (const auto& r : receivers_.threads)
    if (r->first_arrival != 0 && (first == 0 || r->first_arrival < first)) first = r->first_arrival;
  if (first != 0)
    summary.first_write_seconds =
        std::chrono::duration<double>(Clock::time_point{Clock::duration(first)} - t.start).count();
  summary.ignored_messages = from_server_.ignored();
  summary.main_cpu_seconds = t.main_cpu;
  summary.receiver_cpu_seconds = 0;
  for (const auto& r : receivers_.threads) summary.receiver_cpu_seconds += r->cpu_seconds;
  summary.receiver_threads = static_cast<int>(receivers_.threads.size());
  summary.emulated_write = emulated_write_ ? *emulated_write_ : -1;
  summary.receiver_cq_entries = cq_entries_;
  for (const auto& r : receivers_.threads) summary.receiver_completions += r->completions;
  WatchLanes();                                 // each lane's WRITEs, as its receiver counted
  for (size_t l = 0; l < lanes_.size(); ++l) {  // lanes that share a NIC add up
    const std::string& name = domains_[l];
    auto nic = std::find_if(summary.nics.begin(), summary.nics.end(),
                            [&](const Summary::Nic& n) { return n.name == name; });
    if (nic == summary.nics.end()) {
      auto w = t.wire_bytes.find(name);
      summary.nics.push_back({name, 0,
                              w == t.wire_bytes.end() ? -1 : static_cast<long long>(w->second),
                              CountsDeviceWrites(name)});
      nic = summary.nics.end() - 1;
    }
    nic->bytes += lane_seen_[l] * options_.page_size;
  }
  if (print_ && from_server_.ignored() > 0) std::printf("%s\n", from_server_.Describe().c_str());
  for (const std::string& line : WireWarnings(summary)) std::printf("warning: %s\n", line.c_str());
  const std::string problem =
      ClockProblem(summary, std::chrono::duration<double>(Clock::now() - began_).count());
  if (!problem.empty()) throw Error("figures that cannot be true: " + problem);
  return summary;
}
Summary ClientSession::Run() {
  Connect();
  StartReceivers();
  WarmUp();
  WaitForStart();
  const Timing timing = Transfer();
  Finish();
  const auto checking = Clock::now();
  const uint64_t verified = Verify();
  Summary summary = Summarize(timing, verified);
  summary.verify_seconds = std::chrono::duration<double>(Clock::now() - checking).count();
  summary.served_as_is = served_as_is_;
  return summary;
}
Summary RunSession(const Options& options, std::span<const uint8_t> peer, wire::Engine engine,
                   bool warm, bool print) {
  ClientSession session(options, peer, engine, warm, print);
  return session.Run();
}
// The engine the client's switches ask for.
wire::Engine EngineFromOptions(const Options& options) {
  wire::Engine e;
  e.flags = (options.pin ? wire::kEnginePin : 0) | (options.shard ? wire::kEngineShard : 0) |
            (options.lazy ? wire::kEngineLazy : 0) | (options.numa ? wire::kEngineNuma : 0) |
            (options.immediate == ImmediateMode::kLast ? wire::kEngineLastImmediate : 0);
  e.threads = static_cast<uint32_t>(options.threads);
  e.batch = static_cast<uint32_t>(options.batch);
  e.doorbell = static_cast<uint32_t>(options.doorbell);
  e.window = static_cast<uint32_t>(options.window);
  return e;
}
// The ladder: the published journey's rungs, each optimization switched on in turn over the
// one before; then two of ours the published table did not have.
struct Rung {
  std::string name;
  bool warm;
  wire::Engine engine;
};
std::vector<Rung> LadderRungs(const Options& options) {
  wire::Engine e;
  e.threads = 1;
  e.window = static_cast<uint32_t>(options.window);
  // --immediate last on every rung, as the published programs all marked WRITEs.
  if (options.immediate == ImmediateMode::kLast) e.flags = wire::kEngineLastImmediate;
  std::vector<Rung> rungs;
  rungs.push_back({"lanes, one thread", false, e});
  rungs.push_back({"+ warmup", true, e});
  e.threads = static_cast<uint32_t>(options.threads);
  rungs.push_back({"+ one thread per group", true, e});
  e.flags |= wire::kEnginePin;
  rungs.push_back({"+ pinning threads to cores", true, e});
  e.flags |= wire::kEngineShard;
  rungs.push_back({"+ sharded per-thread state", true, e});
  e.batch = static_cast<uint32_t>(options.batch);
  rungs.push_back({"+ batching " + std::to_string(options.batch) + " WRITEs per post", true, e});
  e.flags |= wire::kEngineLazy;
  rungs.push_back({"+ lazy posting (progress in CQ poll)", true, e});
  e.flags |= wire::kEngineNuma;
  rungs.push_back({"+ NUMA-aware allocation", true, e});
  e.doorbell = static_cast<uint32_t>(options.doorbell);
  rungs.push_back(
      {"+ one doorbell per " + std::to_string(options.doorbell) + " WRITEs (FI_MORE)", true, e});
  return rungs;
}
// --repeat for runs of at least --min-seconds: one calibration session at the fastest rung
// (every switch on), so that slower rungs run longer still. Its rate is the server's own WRITE
// time (first posted to last completed), not the client's clock, which also holds the
// request's round trip and the server filling its pages, on a p5 far longer than the WRITEs.
uint64_t CalibratedRepeat(const Options& options, std::span<const uint8_t> peer,
                          const Rung& fastest) {
  const Summary s = RunSession(options, peer, fastest.engine, fastest.warm, true);
  const double writing = s.server_seconds > 0 ? s.server_seconds : s.seconds;
  uint64_t repeat = options.repeat;
  if (writing < options.min_seconds) {
    const double wanted = std::ceil(static_cast<double>(options.repeat) * 1.5 *
                                    options.min_seconds / std::max(writing, 1e-6));
    repeat = static_cast<uint64_t>(std::min(wanted, static_cast<double>(wire::kMaxRepeat)));
  }
  std::printf(
      "ladder: calibration at the fastest rung: %.3f Gbps, WRITEs for %.4f s at --repeat "
      "%llu; every run at --repeat %llu\n",
      Gbps(s.bytes, s.seconds), writing, static_cast<unsigned long long>(options.repeat),
      static_cast<unsigned long long>(repeat));
  if (repeat == wire::kMaxRepeat)
    std::printf(
        "warning: --repeat is at its limit (%llu): runs may be shorter than "
        "--min-seconds; ask for more --pages\n",
        static_cast<unsigned long long>(wire::kMaxRepeat));
  return repeat;
}
// One table row (and record) per rung: the median run's figures, the runs' range and the
// verdict against the rung below.
Summary RungSummary(std::vector<Summary> runs, const std::vector<double>& below) {
  std::vector<double> rates;
  for (const auto& r : runs) rates.push_back(Gbps(r.bytes, r.seconds));
  std::sort(runs.begin(), runs.end(), [](const Summary& a, const Summary& b) {
    return Gbps(a.bytes, a.seconds) < Gbps(b.bytes, b.seconds);
  });
  Summary s = runs[(runs.size() - 1) / 2];  // the median run (the lower middle of an even count)
  s.runs = static_cast<int>(runs.size());
  s.gbps_min = *std::min_element(rates.begin(), rates.end());
  s.gbps_max = *std::max_element(rates.begin(), rates.end());
  if (!below.empty()) s.verdict = RunsVerdict(below, rates);
  return s;
}
int RunLadder(const Options& given, std::span<const uint8_t> peer) {
  std::vector<Rung> rungs = LadderRungs(given);
  Options options = given;
  const size_t sessions = (given.min_seconds > 0 ? 1 : 0) + rungs.size() * given.runs;
  std::printf("ladder: %zu rungs, %llu run%s each%s: %zu sessions at the server\n", rungs.size(),
              static_cast<unsigned long long>(given.runs), given.runs == 1 ? "" : "s",
              given.min_seconds > 0 ? ", after a calibration session" : "", sessions);
  if (given.min_seconds > 0) {
    options.repeat = CalibratedRepeat(given, peer, rungs.back());
    ThisRun().repeat = options.repeat;  // what the records name
  }
  std::vector<double> below;
  for (size_t i = 0; i < rungs.size(); ++i) {
    std::vector<Summary> runs;
    std::vector<double> rates;
    for (uint64_t n = 0; n < options.runs; ++n) {
      runs.push_back(RunSession(options, peer, rungs[i].engine, rungs[i].warm,
                                i == 0 && n == 0 && given.min_seconds == 0));
      rates.push_back(Gbps(runs.back().bytes, runs.back().seconds));
      std::printf(
          "ladder: %s, run %llu: %.3f Gbps in %.3f s%s\n", rungs[i].name.c_str(),
          static_cast<unsigned long long>(n + 1), rates.back(), runs.back().seconds,
          runs.back().served_as_is.empty()
              ? ""
              : (" (served by the engine as it was: " + runs.back().served_as_is + ")").c_str());
    }
    // A run served by another engine than its rung's (another client was on) does not
    // measure the rung: its row says so.
    const bool as_is = std::any_of(runs.begin(), runs.end(),
                                   [](const Summary& r) { return !r.served_as_is.empty(); });
    if (i == 0) {
      rungs[0].name = std::to_string(runs[0].lanes) + " " + rungs[0].name;
      std::printf("ladder: immediate data %s\n",
                  options.immediate == ImmediateMode::kLast
                      ? "on each lane's last WRITE of a request (--immediate last), as the "
                        "published run marked its WRITEs"
                      : "on every WRITE, counted one by one (the published run marked only the "
                        "last: --immediate last)");
      std::printf(
          "| step | Gbps (median) | range | %% of link | Mpps | runs | verdict |\n"
          "|---|---:|---:|---:|---:|---:|---|\n");
    }
    Summary s = RungSummary(runs, i == 0 ? std::vector<double>{} : below);
    below = rates;
    s.step = rungs[i].name + (as_is ? " (not its engine: another client was on)" : "");
    const double gbps = Gbps(s.bytes, s.seconds);
    char percent[32] = "-";  // unknown without a link rate (--link-gbps)
    if (s.link_gbps > 0) std::snprintf(percent, sizeof(percent), "%.1f", 100 * gbps / s.link_gbps);
    std::printf("| %s | %.3f | %.3f-%.3f | %s | %.4f | %d | %s |\n", s.step.c_str(), gbps,
                s.gbps_min, s.gbps_max, percent,
                s.seconds > 0 ? static_cast<double>(s.writes) / s.seconds / 1e6 : 0, s.runs,
                s.verdict.empty() ? "-" : s.verdict.c_str());
    if (options.json) PrintSummary(s, true);
    std::fflush(stdout);
  }
  return kExitOk;
}
}  // namespace p5
