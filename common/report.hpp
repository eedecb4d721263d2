// The figures every transfer stage ends with (DESIGN.md, "Benchmarks").
#pragma once

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

}  // namespace common
