#include "report.hpp"

#include <unistd.h>

#include <cstdio>

namespace common {

double Gbps(uint64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) * 8 / seconds / 1e9 : 0;
}

std::string FormatSummary(const Summary& s, bool json) {
  const double gbps = Gbps(s.bytes, s.seconds);
  const double mpps = s.seconds > 0 ? static_cast<double>(s.writes) / s.seconds / 1e6 : 0;
  const double percent = s.link_gbps > 0 ? 100 * gbps / s.link_gbps : 0;
  char line[512];
  if (json) {
    std::snprintf(line, sizeof(line),
                  "{\"bytes\":%llu,\"writes\":%llu,\"seconds\":%.6f,\"gbps\":%.3f,"
                  "\"link_gbps\":%.3f,\"percent_of_link\":%.2f,\"mpps\":%.4f,"
                  "\"verified_bytes\":%llu,\"lanes\":%d%s%s%s}",
                  static_cast<unsigned long long>(s.bytes),
                  static_cast<unsigned long long>(s.writes), s.seconds, gbps, s.link_gbps, percent,
                  mpps, static_cast<unsigned long long>(s.verified_bytes), s.lanes,
                  s.step.empty() ? "" : ",\"step\":\"", s.step.c_str(), s.step.empty() ? "" : "\"");
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
  return line;
}

void PrintSummary(const Summary& s, bool json) {
  std::printf("%s\n", FormatSummary(s, json).c_str());
  std::fflush(stdout);
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

ProgressLine::ProgressLine(uint64_t expected_writes, double link_gbps)
    : expected_(expected_writes),
      link_gbps_(link_gbps),
      tty_(isatty(STDOUT_FILENO) == 1),
      next_(std::chrono::steady_clock::now() + std::chrono::seconds(1)) {}

void ProgressLine::Update(uint64_t writes, uint64_t bytes, double seconds) {
  const auto now = std::chrono::steady_clock::now();
  if (now < next_ || seconds <= 0) return;
  next_ = now + std::chrono::seconds(tty_ ? 1 : 5);
  const std::string line = FormatProgress(writes, expected_, bytes, seconds, link_gbps_);
  std::printf(tty_ ? "\r%s\033[K" : "%s\n", line.c_str());
  std::fflush(stdout);
  printed_ = true;
}

void ProgressLine::End() {
  if (tty_ && printed_) std::printf("\n");
}

}  // namespace common
