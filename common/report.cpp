#include "report.hpp"

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

}  // namespace common
