// The figures every transfer stage ends with (DESIGN.md, "Benchmarks").
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace common {

struct Summary {
  uint64_t bytes = 0;   // payload written, repeats included
  uint64_t writes = 0;  // RDMA WRITE operations
  double seconds = 0;
  double link_gbps = 0;         // theoretical rate; 0 when unknown
  uint64_t verified_bytes = 0;  // distinct bytes checked against the seed's data
  int lanes = 1;
  std::string step;  // 07 --ladder: which rung of the ladder this is
};

double Gbps(uint64_t bytes, double seconds);

// "summary: ..." on one line, or the same figures as one JSON object.
std::string FormatSummary(const Summary& s, bool json);
void PrintSummary(const Summary& s, bool json);

// "progress: 4.0 s, 45.1% done, 1847 ops, 121.0 MB, 3.918 Gbps (98.0% of link), 0.0075 Mpps"
// (no "% of link" when link_gbps is 0).
std::string FormatProgress(uint64_t writes, uint64_t expected_writes, uint64_t bytes,
                           double seconds, double link_gbps);

// The progress line of a running transfer: rewritten in place on a terminal, one line every
// few seconds otherwise, the first a second after it was made.
class ProgressLine {
 public:
  ProgressLine(uint64_t expected_writes, double link_gbps);
  void Update(uint64_t writes, uint64_t bytes, double seconds);
  void End();  // ends the line on a terminal

 private:
  uint64_t expected_;
  double link_gbps_;
  bool tty_;
  bool printed_ = false;
  std::chrono::steady_clock::time_point next_;
};

}  // namespace common
