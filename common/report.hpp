// The figures every transfer stage ends with (docs/architecture.md, "Clocks and figures").
#pragma once

#include <time.h>

#include <cstdio>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace common {

struct Summary {
  uint64_t bytes = 0;   // payload written, repeats included
  uint64_t writes = 0;  // RDMA WRITE operations
  // The client's clock: from its first TRANSFER sent to its last WRITE landed. Nothing a
  // provider does with its completions can shrink it below the transfer's real duration.
  double seconds = 0;
  // The server's clock: from its first WRITE posted to its last completed (DONE messages).
  double server_seconds = 0;
  // The client's clock from its first TRANSFER sent to its last DONE received (0: not taken).
  // The server's clock must fit inside it; it may exceed `seconds`, since the server reads its
  // last completion after that WRITE landed, later still when its thread waits for a core.
  double answered_seconds = 0;
  // 07: what opening the session cost the server (once), and filling pages (per request).
  double server_setup_seconds = -1;  // negative: not measured (before 07)
  uint64_t source_bytes = 0;         // 07: the data set of each server source buffer (0: not 07)
  double verify_seconds = -1;        // checking every page received, after the clock
  // 07: the client's clock from its first TRANSFER sent to its first WRITE landed, the
  // figure the warmup rung moves: without warmup it carries the lanes' first use (connections
  // made, the peer's memory first mapped). Negative: not measured.
  double first_write_seconds = -1;
  // When the timed span began, in seconds since the Unix epoch (07: the first request sent), so
  // that several clients' spans can be laid side by side (scripts/bench-clients); 0: unknown.
  double started_at = 0;
  // 07: what registering the client's own region cost it, apart from the transfer.
  uint64_t registered_bytes = 0;
  double registration_seconds = -1;  // negative: not measured
  double link_gbps = 0;              // theoretical rate; 0 when unknown
  uint64_t verified_bytes = 0;       // distinct bytes checked against the seed's data
  int lanes = 1;
  std::string memory = "host";  // host, cuda-direct, cuda-staged, cuda-vmm-direct, ...
  std::string memory_why;       // how GPU memory moves (direct), or why it is staged
  std::string step;             // 07 --ladder: which rung of the ladder this is
  std::string served_as_is;     // 07: the engine that served it, where not the one it asked
  // 07 --ladder: a rung's record is its median run's, with the runs' count and Gbps range and
  // the verdict against the rung below ("": none); a single run is 1 run and no range.
  int runs = 1;
  double gbps_min = -1, gbps_max = -1;
  std::string verdict;
  uint64_t ignored_messages = 0;  // messages dropped as not our server's (common/mailbox.hpp)
  // 07: CPU time by thread role, so that a thread that should only wait and spins shows
  // (negative: not measured): the main thread's while the transfer was timed (it only watches),
  // and the receiving threads' sum over their whole life (warmup included).
  double main_cpu_seconds = -1;
  double receiver_cpu_seconds = -1;
  int receiver_threads = 0;
  // efa: whether its RDMA WRITE was emulated with messages (1) or the device's own (0); -1
  // where the provider does not say (FI_OPT_EFA_EMULATED_WRITE, common/registration.hpp).
  int emulated_write = -1;
  // 07: the entries of each receiving lane's CQ (0: the provider's default, not asked).
  size_t receiver_cq_entries = 0;
  // 07: the timed WRITEs' completions its receivers read: one per WRITE, or with --immediate
  // last one per lane of each request (0: not counted).
  uint64_t receiver_completions = 0;
  // 07: per NIC, the bytes of the pages its lanes received and what the NIC itself counted on
  // the wire meanwhile (-1: no counter, e.g. shm), in the order of the lanes.
  struct Nic {
    std::string name;
    uint64_t bytes = 0;
    long long wire_bytes = -1;
    bool device_writes = false;  // the counter counts the device's RDMA WRITEs alone (efa)
  };
  std::vector<Nic> nics;
};

// CPU time the calling thread has used (CLOCK_THREAD_CPUTIME_ID), in seconds.
inline double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

// "" when the figures are possible, else what is wrong: a span longer than the wall time of
// the run it was measured in, a server busier than its client waited, a rate above the link.
// Every transfer stage checks before it prints: a figure that cannot be true is a bug.
std::string ClockProblem(const Summary& s, double wall_seconds);

double Gbps(uint64_t bytes, double seconds);

// "summary: ..." on one line, or the same figures as one JSON object.
// What a run's records name beside their figures (docs/record.schema.json): the stage and
// the request from the command line (ParseCommandLine), the provider and fabric from the
// one chosen (SelectDomains).
struct RunContext {
  std::string stage;
  std::string provider;
  std::string fabric;
  uint64_t page_size = 0, pages = 0, repeat = 0, requests = 0;
};
RunContext& ThisRun();
void NoteProvider(const std::string& provider, const std::string& fabric);
// A JSON object built field by field: numbers, text, booleans, and null for what is unknown.
class JsonRecord {
 public:
  explicit JsonRecord(const char* record);  // "record": "client", "session", ...
  static JsonRecord Object();               // an object inside a record: no "record" key
  JsonRecord& Add(const char* key, double value, int digits = 6);
  JsonRecord& Add(const char* key, uint64_t value);
  JsonRecord& Add(const char* key, const std::string& value);
  JsonRecord& AddBool(const char* key, bool value);
  JsonRecord& AddNull(const char* key);
  JsonRecord& AddRaw(const char* key, const std::string& json);  // an array or object
  std::string Text() const { return text_ + "}"; }

 private:
  JsonRecord() : text_("{") {}
  std::string text_;
};
// Prints a record on the real stdout (--json), one a line.
void PrintRecord(const JsonRecord& record);
// A server's record of a client's session, as its last line says it ("done", "lost: why"):
// stage, provider, fabric, client and how it ended; the caller adds writes, bytes and engine.
JsonRecord SessionRecord(uint64_t client, const std::string& ended);

// A ladder rung's verdict against the rung below from their runs' figures, higher better:
// "gain" when every run beats every run below (the ranges do not overlap), "loss" when every
// run is worse, "no change" when the ranges overlap, "too few runs" under 3 on either side
// (the rule of scripts/benchlib.py's runs_verdict).
std::string RunsVerdict(const std::vector<double>& below, const std::vector<double>& runs);

// The wire's verdict: where a NIC counts the device's own RDMA WRITEs (efa), fewer than 99% of
// the pages' bytes means the rest came as emulated WRITEs (messages): a line each, with the
// share and the likely causes. Host-wide counters: another process's WRITEs count too.
std::vector<std::string> WireWarnings(const Summary& s);

// The headline: bytes, seconds, Gbps beside the link, Mpps, WRITEs, lanes, verified bytes (and
// messages ignored, if any); --json: the whole record.
std::string FormatSummary(const Summary& s, bool json);
// The rest, printed under -v: the server's clock, where the pages were, registration, the
// check, CPU, the NICs' own counts.
std::string SummaryDetail(const Summary& s);
void PrintSummary(const Summary& s, bool json);
// 03's summary: "received N WRITEs (B bytes) in S s (server: T s); verified V bytes", printed
// at every output level (-q too), as PrintSummary's is.
void PrintReceived(uint64_t writes, uint64_t bytes, double seconds, double server_seconds,
                   uint64_t verified);
// --json: stdout holds the JSON records only (PrintSummary's), one a line, for jq and
// scripts; every line for people, printed to stdout by whatever code, goes to stderr.
void RecordsOnStdout();

// Output levels. Normal: the header, progress and the summary. -q (quiet, -1): the summary
// and errors only (a server: its address and errors); every other line printed to stdout goes
// nowhere. -v (verbose, 1): diagnostics too (program.hpp, Diagnostic).
void SetOutputLevel(int level);
// Where a line goes that the user needs at every level (a server's address): stdout, or
// under -q the real stdout, under --json stderr.
FILE* EssentialOut();

// "progress: 4.0 s, 45.1% done, 1847 ops, 121.0 MB, 3.918 Gbps (98.0% of link), 0.0075 Mpps"
// (no "% of link" when link_gbps is 0).
std::string FormatProgress(uint64_t writes, uint64_t expected_writes, uint64_t bytes,
                           double seconds, double link_gbps);

// What a progress line says of the span since the last line whose count was current: "; last
// 1.0 s: 3.918 Gbps", or, where the count lags what landed (`late_why`: a receiver inside one
// long provider call, or a count that moves once per part of a request), "; last 2.0 s: not
// counted yet (WHY)": a rate over a count that comes in bursts would claim more than the link
// carries (a 2-core host printed 336 Gbps over shm).
std::string FormatSinceLast(uint64_t bytes, double seconds, const std::string& late_why);

// The progress line of a running transfer: rewritten in place on a terminal, one line every
// few seconds otherwise, the first a second after it was made.
class ProgressLine {
 public:
  // A line every `every` seconds (0: each second on a terminal, every 5 s otherwise), each
  // with the rate since the last line whose count was current (what a client that shares the
  // server sees change).
  ProgressLine(uint64_t expected_writes, double link_gbps, double every = 0);
  // `late_why`: why the count lags what landed now ("": it does not); `unmoved_why`: why a
  // count that has not moved since the last line need not mean nothing landed ("": it does).
  void Update(uint64_t writes, uint64_t bytes, double seconds, const std::string& late_why = "",
              const std::string& unmoved_why = "");
  void End();  // ends the line on a terminal
  double every_seconds() const;

 private:
  uint64_t expected_;
  double link_gbps_;
  bool tty_;
  bool printed_ = false;
  std::chrono::steady_clock::duration every_;
  std::chrono::steady_clock::time_point next_;
  uint64_t last_bytes_ = 0;  // at the last line whose count was current
  double last_seconds_ = 0;
};

}  // namespace common
