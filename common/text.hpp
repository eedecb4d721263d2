// How the programs write what a person reads: one way for a duration, one for a count.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace common {

// A duration to three significant digits: "10 s", "2.5 s", "0.0123 s", "150 s" (never
// "10.000000 s", which is what std::to_string makes of a double).
inline std::string FormatSeconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, seconds >= 100 ? "%.0f s" : "%.3g s", seconds);
  return text;
}
template <class Rep, class Period>
std::string FormatSeconds(std::chrono::duration<Rep, Period> d) {
  return FormatSeconds(std::chrono::duration<double>(d).count());
}

// "1 client", "3 clients"; `many` where the plural is not `one` and an s.
inline std::string Plural(uint64_t n, const std::string& one, const std::string& many = "") {
  return std::to_string(n) + " " + (n == 1 ? one : many.empty() ? one + "s" : many);
}

}  // namespace common
