#include "report.hpp"

#include "program.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace common {

double Gbps(uint64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) * 8 / seconds / 1e9 : 0;
}

// A JSON string's contents: quotes, backslashes and control characters escaped.
static std::string JsonText(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

// The summary line's words for the JSON's memory word.
static std::string MemoryWords(const std::string& memory) {
  if (memory == "host") return "host";
  const bool vmm = memory.rfind("cuda-vmm", 0) == 0;
  const auto ends = [&](const std::string& end) {
    return memory.size() > end.size() &&
           memory.compare(memory.size() - end.size(), end.size(), end) == 0;
  };
  return std::string(vmm ? "GPU VMM" : "GPU") + (ends("direct")   ? " (direct)"
                                                 : ends("copied") ? " (copied by the provider)"
                                                                  : " (staged)");
}

RunContext& ThisRun() {
  static RunContext context;
  return context;
}
void NoteProvider(const std::string& provider, const std::string& fabric) {
  RunContext& run = ThisRun();
  if (!run.provider.empty()) return;  // the first chosen: the run's
  run.provider = provider;
  run.fabric = fabric;
}

JsonRecord::JsonRecord(const char* record) : text_("{\"record\":\"" + JsonText(record) + "\"") {}
JsonRecord JsonRecord::Object() {
  return JsonRecord();
}
static std::string JsonNumber(double value, int digits) {
  char number[64];
  std::snprintf(number, sizeof(number), "%.*f", digits, value);
  return number;
}
JsonRecord& JsonRecord::Add(const char* key, double value, int digits) {
  return AddRaw(key, JsonNumber(value, digits));
}
JsonRecord& JsonRecord::Add(const char* key, uint64_t value) {
  return AddRaw(key, std::to_string(value));
}
JsonRecord& JsonRecord::Add(const char* key, const std::string& value) {
  return AddRaw(key, "\"" + JsonText(value) + "\"");
}
JsonRecord& JsonRecord::AddBool(const char* key, bool value) {
  return AddRaw(key, value ? "true" : "false");
}
JsonRecord& JsonRecord::AddNull(const char* key) {
  return AddRaw(key, "null");
}
JsonRecord& JsonRecord::AddRaw(const char* key, const std::string& json) {
  text_ += (text_.size() > 1 ? ",\"" : "\"") + JsonText(key) + "\":" + json;
  return *this;
}

// The record of a client's run (docs/record.schema.json): what ran, the figures, and null for
// what this stage or provider does not measure.
static std::string SummaryRecord(const Summary& s) {
  const RunContext& run = ThisRun();
  const double gbps = Gbps(s.bytes, s.seconds);
  JsonRecord r("client");
  auto text_or_null = [&](const char* key, const std::string& v) {
    v.empty() ? r.AddNull(key) : r.Add(key, v);
  };
  auto count_or_null = [&](const char* key, uint64_t v) { v ? r.Add(key, v) : r.AddNull(key); };
  auto seconds_or_null = [&](const char* key, double v) {
    v >= 0 ? r.Add(key, v) : r.AddNull(key);
  };
  text_or_null("stage", run.stage);
  text_or_null("provider", run.provider);
  text_or_null("fabric", run.fabric);
  r.Add("memory", s.memory).Add("memory_why", s.memory_why);
  count_or_null("page_size", run.page_size);
  count_or_null("pages", run.pages);
  count_or_null("repeat", run.repeat);
  count_or_null("requests", run.requests);
  r.Add("lanes", static_cast<uint64_t>(s.lanes));
  count_or_null("threads", static_cast<uint64_t>(s.receiver_threads));
  r.Add("runs", static_cast<uint64_t>(s.runs));
  text_or_null("step", s.step);
  if (s.gbps_min >= 0)
    r.AddRaw("gbps_range", "[" + JsonNumber(s.gbps_min, 3) + "," + JsonNumber(s.gbps_max, 3) + "]");
  else
    r.AddNull("gbps_range");
  text_or_null("verdict", s.verdict);
  r.Add("bytes", s.bytes).Add("writes", s.writes).Add("seconds", s.seconds);
  r.Add("server_seconds", s.server_seconds).Add("gbps", gbps, 3);
  if (s.link_gbps > 0)
    r.Add("link_gbps", s.link_gbps, 3).Add("percent_of_link", 100 * gbps / s.link_gbps, 2);
  else
    r.AddNull("link_gbps").AddNull("percent_of_link");
  r.Add("mpps", s.seconds > 0 ? static_cast<double>(s.writes) / s.seconds / 1e6 : 0, 4);
  r.Add("verified_bytes", s.verified_bytes);
  seconds_or_null("server_setup_seconds", s.server_setup_seconds);
  count_or_null("source_bytes", s.source_bytes);
  seconds_or_null("verify_seconds", s.verify_seconds);
  if (s.registration_seconds >= 0)
    r.Add("registered_bytes", s.registered_bytes)
        .Add("registration_seconds", s.registration_seconds);
  else
    r.AddNull("registered_bytes").AddNull("registration_seconds");
  r.Add("ignored_messages", s.ignored_messages);
  seconds_or_null("first_write_seconds", s.first_write_seconds);
  if (s.started_at > 0)
    r.Add("started_at", s.started_at).Add("ended_at", s.started_at + s.seconds);
  else
    r.AddNull("started_at").AddNull("ended_at");
  s.emulated_write >= 0 ? r.AddBool("emulated_write", s.emulated_write)
                        : r.AddNull("emulated_write");
  count_or_null("receiver_cq_entries", s.receiver_cq_entries);
  count_or_null("receiver_completions", s.receiver_completions);
  std::string nics = "[";
  for (size_t i = 0; i < s.nics.size(); ++i) {
    JsonRecord nic = JsonRecord::Object();
    nic.Add("name", s.nics[i].name).Add("bytes", s.nics[i].bytes);
    s.nics[i].wire_bytes < 0 ? nic.AddNull("wire_bytes")
                             : nic.Add("wire_bytes", static_cast<uint64_t>(s.nics[i].wire_bytes));
    nics += (i ? "," : "") + nic.Text();
  }
  r.AddRaw("nics", nics + "]");
  seconds_or_null("main_cpu_seconds", s.main_cpu_seconds);
  seconds_or_null("receiver_cpu_seconds", s.main_cpu_seconds >= 0 ? s.receiver_cpu_seconds : -1);
  return r.Text();
}

std::string RunsVerdict(const std::vector<double>& below, const std::vector<double>& runs) {
  if (below.size() < 3 || runs.size() < 3) return "too few runs";
  const auto [low, high] = std::minmax_element(runs.begin(), runs.end());
  const auto [below_low, below_high] = std::minmax_element(below.begin(), below.end());
  return *low > *below_high ? "gain" : *high < *below_low ? "loss" : "no change";
}

std::vector<std::string> WireWarnings(const Summary& s) {
  std::vector<std::string> lines;
  for (const auto& n : s.nics) {
    if (!n.device_writes || n.wire_bytes < 0 || n.bytes == 0) continue;
    const double share = static_cast<double>(n.wire_bytes) / static_cast<double>(n.bytes);
    if (share >= 0.99) continue;
    char line[512];
    std::snprintf(line, sizeof(line),
                  "%s: the device counted RDMA WRITEs for %.1f%% of the %llu bytes of pages it "
                  "received: efa emulated the rest with messages (a peer without the same "
                  "unsolicited-write-recv support or without GPU peer-to-peer, or WRITEs before "
                  "efa's handshake: efa_rdm_rma.c); the figures are of that slower path",
                  n.name.c_str(), 100 * share, static_cast<unsigned long long>(n.bytes));
    lines.push_back(line);
  }
  return lines;
}

std::string FormatSummary(const Summary& s, bool json) {
  const double gbps = Gbps(s.bytes, s.seconds);
  const double mpps = s.seconds > 0 ? static_cast<double>(s.writes) / s.seconds / 1e6 : 0;
  const double percent = s.link_gbps > 0 ? 100 * gbps / s.link_gbps : 0;
  char line[1024];
  if (json) {
    return SummaryRecord(s);
  } else {
    char link[64] = "link rate unknown: --link-gbps";
    if (s.link_gbps > 0)
      std::snprintf(link, sizeof(link), "%.1f%% of %.3g Gbps", percent, s.link_gbps);
    std::snprintf(line, sizeof(line),
                  "summary: %llu bytes in %.3f s = %.3f Gbps (%s), %.3f Mpps, %llu WRITEs, "
                  "%d lane%s, verified %llu bytes",
                  static_cast<unsigned long long>(s.bytes), s.seconds, gbps, link, mpps,
                  static_cast<unsigned long long>(s.writes), s.lanes, s.lanes == 1 ? "" : "s",
                  static_cast<unsigned long long>(s.verified_bytes));
  }
  std::string text = line;
  if (s.ignored_messages > 0)
    text +=
        "; ignored " + std::to_string(s.ignored_messages) + " messages that were not our server's";
  return text;
}

std::string SummaryDetail(const Summary& s) {
  char line[256];
  std::snprintf(line, sizeof(line), "detail: server %.3f s; pages in %s memory", s.server_seconds,
                MemoryWords(s.memory).c_str());
  std::string text = line;
  if (s.registered_bytes > 0) {  // per GiB, so that memory kinds and sizes compare
    const double gib = static_cast<double>(s.registered_bytes) / (1ull << 30);
    char reg[128];
    std::snprintf(reg, sizeof(reg), "; registered %.2f GiB in %.3f ms (%.3f ms per GiB)", gib,
                  s.registration_seconds * 1e3, s.registration_seconds * 1e3 / gib);
    text += reg;
  }
  if (s.verify_seconds >= 0) {  // after the clock: the check, apart from the transfer
    char check[64];
    std::snprintf(check, sizeof(check), "; checked in %.3f s", s.verify_seconds);
    text += check;
  }
  if (s.main_cpu_seconds >= 0) {
    char cpu[160];
    std::snprintf(cpu, sizeof(cpu), "; CPU: main thread %.3f s while timed, %d receiver%s %.3f s",
                  s.main_cpu_seconds, s.receiver_threads, s.receiver_threads == 1 ? "" : "s",
                  s.receiver_cpu_seconds);
    text += cpu;
  }
  uint64_t moved = 0, wire = 0;
  size_t counted = 0;
  for (const auto& n : s.nics)
    if (n.wire_bytes >= 0) {
      moved += n.bytes;
      wire += static_cast<uint64_t>(n.wire_bytes);
      ++counted;
    }
  if (counted > 0) {  // the NICs' own count beside ours (JSON: per NIC)
    char w[160];
    std::snprintf(
        w, sizeof(w),
        "; NIC counters (host-wide): %zu NIC%s received %.1f MB on the wire for %.1f MB of pages "
        "(%.1f%%)",
        counted, counted == 1 ? "" : "s", static_cast<double>(wire) / 1e6,
        static_cast<double>(moved) / 1e6,
        moved ? 100.0 * static_cast<double>(wire) / static_cast<double>(moved) : 0.0);
    text += w;
  }
  return text;
}

std::string ClockProblem(const Summary& s, double wall_seconds) {
  char why[256] = "";
  const double gbps = Gbps(s.bytes, s.seconds);
  const double waited = std::max(s.seconds, s.answered_seconds);  // until its DONEs came
  if (s.bytes > 0 && !(s.seconds > 0))
    std::snprintf(why, sizeof(why), "%llu bytes in no measurable time",
                  static_cast<unsigned long long>(s.bytes));
  else if (s.seconds > wall_seconds + 1e-3)
    std::snprintf(why, sizeof(why), "a span of %.6f s measured inside a run of %.6f s", s.seconds,
                  wall_seconds);
  else if (s.server_seconds > waited * 1.05 + 0.02)
    std::snprintf(why, sizeof(why),
                  "the server wrote for %.6f s, longer than the client waited for it (%.6f s)",
                  s.server_seconds, waited);
  else if (s.link_gbps > 0 && gbps > 1.05 * s.link_gbps)
    std::snprintf(why, sizeof(why),
                  "%.3f Gbps is above the link's %.3f Gbps (is --link-gbps right?)", gbps,
                  s.link_gbps);
  else if (s.main_cpu_seconds > wall_seconds + 0.05 ||
           s.receiver_cpu_seconds > s.receiver_threads * wall_seconds + 0.05)
    std::snprintf(why, sizeof(why),
                  "CPU time of %.3f s (main) and %.3f s (%d receivers) in a run of %.6f s",
                  s.main_cpu_seconds, s.receiver_cpu_seconds, s.receiver_threads, wall_seconds);
  return why;
}

namespace {
FILE* records = nullptr;  // --json, -q: the real stdout, for records and the summary
bool records_json = false;

// Keeps the real stdout as `records` and points fd 1 at `to`: what any code prints to stdout
// then goes there.
void KeepStdout(int to) {
  if (records != nullptr || to < 0) return;
  std::fflush(stdout);
  const int fd = dup(STDOUT_FILENO);
  if (fd < 0 || (records = fdopen(fd, "w")) == nullptr) return;  // then both share stdout
  dup2(to, STDOUT_FILENO);
}
// Where what every level prints goes: the real stdout.
FILE* RealStdout() {
  return records != nullptr ? records : stdout;
}
}  // namespace

void RecordsOnStdout() {
  records_json = true;
  KeepStdout(STDERR_FILENO);
}

void SetOutputLevel(int level) {
  SetVerbose(level > 0);
  if (level >= 0) return;
  const int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
  KeepStdout(records_json ? -1 : null);  // with --json, fd 1 already goes to stderr
  if (records_json && null >= 0) dup2(null, STDOUT_FILENO);
  if (null >= 0) close(null);
}

FILE* EssentialOut() {
  return records_json ? stderr : RealStdout();
}

JsonRecord SessionRecord(uint64_t client, const std::string& ended) {
  const RunContext& run = ThisRun();
  JsonRecord r("session");
  r.Add("stage", run.stage).Add("provider", run.provider).Add("fabric", run.fabric);
  return std::move(r.Add("client", client).Add("ended", ended));
}

void PrintRecord(const JsonRecord& record) {
  FILE* out = RealStdout();
  std::fprintf(out, "%s\n", record.Text().c_str());
  std::fflush(out);
}

void PrintSummary(const Summary& s, bool json) {
  FILE* out = RealStdout();
  std::fprintf(out, "%s\n", FormatSummary(s, json).c_str());
  std::fflush(out);
  if (!json) Diagnostic("%s\n", SummaryDetail(s).c_str());  // -v: the rest of the run's figures
}

void PrintReceived(uint64_t writes, uint64_t bytes, double seconds, double server_seconds,
                   uint64_t verified) {
  FILE* out = RealStdout();
  std::fprintf(
      out, "received %llu WRITEs (%llu bytes) in %.3f s (server: %.3f s); verified %llu bytes\n",
      static_cast<unsigned long long>(writes), static_cast<unsigned long long>(bytes), seconds,
      server_seconds, static_cast<unsigned long long>(verified));
  std::fflush(out);
}

std::string FormatProgress(uint64_t writes, uint64_t expected_writes, uint64_t bytes,
                           double seconds, double link_gbps) {
  const double gbps = Gbps(bytes, seconds);
  char link[64] = "";
  if (link_gbps > 0) std::snprintf(link, sizeof(link), " (%.1f%% of link)", 100 * gbps / link_gbps);
  char line[256];
  std::snprintf(line, sizeof(line),
                "progress: %.1f s, %.1f%% done, %llu ops, %.1f MB, %.3f Gbps%s, %.4f Mpps", seconds,
                expected_writes > 0
                    ? 100.0 * static_cast<double>(writes) / static_cast<double>(expected_writes)
                    : 0.0,
                static_cast<unsigned long long>(writes), static_cast<double>(bytes) / 1e6, gbps,
                link, seconds > 0 ? static_cast<double>(writes) / seconds / 1e6 : 0.0);
  return line;
}

ProgressLine::ProgressLine(uint64_t expected_writes, double link_gbps, double every)
    : expected_(expected_writes),
      link_gbps_(link_gbps),
      tty_(isatty(STDOUT_FILENO) == 1),
      every_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(every > 0 ? every : (tty_ ? 1.0 : 5.0)))),
      next_(std::chrono::steady_clock::now() + every_) {}

std::string FormatSinceLast(uint64_t bytes, double seconds, const std::string& late_why) {
  char since[64];
  if (!late_why.empty()) {
    std::snprintf(since, sizeof(since), "; last %.1f s: not counted yet (", seconds);
    return since + late_why + ")";
  }
  std::snprintf(since, sizeof(since), "; last %.1f s: %.3f Gbps", seconds, Gbps(bytes, seconds));
  return since;
}

double ProgressLine::every_seconds() const {
  return std::chrono::duration<double>(every_).count();
}

void ProgressLine::Update(uint64_t writes, uint64_t bytes, double seconds,
                          const std::string& late_why, const std::string& unmoved_why) {
  const auto now = std::chrono::steady_clock::now();
  if (now < next_ || seconds <= 0) return;
  next_ = now + every_;
  const std::string why = !late_why.empty() ? late_why : bytes == last_bytes_ ? unmoved_why : "";
  const std::string since = FormatSinceLast(bytes - last_bytes_, seconds - last_seconds_, why);
  if (why.empty()) {  // the next line's span starts here
    last_bytes_ = bytes;
    last_seconds_ = seconds;
  }
  const std::string line = FormatProgress(writes, expected_, bytes, seconds, link_gbps_) + since;
  std::printf(tty_ ? "\r%s\033[K" : "%s\n", line.c_str());
  std::fflush(stdout);
  printed_ = true;
}

void ProgressLine::End() {
  if (tty_ && printed_) std::printf("\n");
}

}  // namespace common
