#include <gtest/gtest.h>

#include "report.hpp"

using namespace common;

TEST(Report, SummaryCarriesTheFigures) {
  Summary s;
  s.bytes = 125'000'000;
  s.writes = 1000;
  s.seconds = 1;
  s.link_gbps = 2;
  s.verified_bytes = 4096;
  s.lanes = 2;
  EXPECT_EQ(FormatSummary(s, false),
            "summary: 125000000 bytes in 1.000 s = 1.000 Gbps (50.0% of 2 Gbps), 0.001 Mpps, "
            "1000 WRITEs, 2 lanes, verified 4096 bytes");
  s.step = "+ warmup";
  const std::string json = FormatSummary(s, true);
  EXPECT_NE(json.find("\"gbps\":1.000"), std::string::npos) << json;
  EXPECT_NE(json.find("\"percent_of_link\":50.00"), std::string::npos) << json;
  EXPECT_NE(json.find(",\"step\":\"+ warmup\"}"), std::string::npos) << json;
}

TEST(Report, ProgressLineInThePublishedForm) {
  EXPECT_EQ(FormatProgress(1500, 6000, 250'000'000, 2, 4),
            "progress: 2.0 s, 25.0% done, 1500 ops, 250.0 MB, 1.000 Gbps (25.0% of link), "
            "0.0008 Mpps");
  // Without a known link rate there is no percentage of it.
  EXPECT_EQ(FormatProgress(10, 0, 1000, 1, 0),
            "progress: 1.0 s, 0.0% done, 10 ops, 0.0 MB, 0.000 Gbps, 0.0000 Mpps");
}
