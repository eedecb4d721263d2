#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "error.hpp"
#include "registration.hpp"
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
  s.server_seconds = 0.75;
  EXPECT_EQ(FormatSummary(s, false),
            "summary: 125000000 bytes in 1.000 s = 1.000 Gbps (50.0% of 2 Gbps), 0.001 Mpps, "
            "1000 WRITEs, 2 lanes, verified 4096 bytes");
  EXPECT_EQ(SummaryDetail(s), "detail: server 0.750 s; pages in host memory");
  s.step = "+ warmup";
  s.memory = "cuda-staged";
  s.memory_why = "shm does not register GPU memory: \"no\"";
  const std::string json = FormatSummary(s, true);
  EXPECT_NE(json.find("\"gbps\":1.000"), std::string::npos) << json;
  EXPECT_NE(json.find("\"server_seconds\":0.750000"), std::string::npos) << json;
  EXPECT_NE(json.find("\"percent_of_link\":50.00"), std::string::npos) << json;
  EXPECT_NE(json.find("\"memory\":\"cuda-staged\""), std::string::npos) << json;
  // The reason is quoted as JSON text: its quotes escaped.
  EXPECT_NE(json.find("\"memory_why\":\"shm does not register GPU memory: \\\"no\\\"\""),
            std::string::npos)
      << json;
  EXPECT_NE(json.find(",\"step\":\"+ warmup\","), std::string::npos) << json;
  // What this run does not measure is null, not 0 or -1 (docs/record.schema.json).
  for (const char* unknown : {"\"server_setup_seconds\":null", "\"registered_bytes\":null",
                              "\"first_write_seconds\":null", "\"emulated_write\":null",
                              "\"main_cpu_seconds\":null", "\"threads\":null"})
    EXPECT_NE(json.find(unknown), std::string::npos) << unknown << "\n" << json;
  EXPECT_EQ(json.rfind("{\"record\":\"client\",\"stage\":", 0), 0u) << json;
  s.link_gbps = 0;
  const std::string unknown_link = FormatSummary(s, true);
  EXPECT_NE(unknown_link.find("\"link_gbps\":null,\"percent_of_link\":null"), std::string::npos)
      << unknown_link;
}

// Each memory word has its own words in the summary line (cuda-vmm once read "GPU (staged)"
// whatever its path), and a registration is reported per GiB.
TEST(Report, SummarySaysWhichMemoryAndTheRegistrationPerGib) {
  Summary s;
  s.bytes = 1 << 20;
  s.writes = 16;
  s.seconds = 0.5;
  for (const auto& [word, words] : std::vector<std::pair<std::string, std::string>>{
           {"host", "pages in host memory"},
           {"cuda-direct", "pages in GPU (direct) memory"},
           {"cuda-staged", "pages in GPU (staged) memory"},
           {"cuda-vmm-direct", "pages in GPU VMM (direct) memory"},
           {"cuda-vmm-staged", "pages in GPU VMM (staged) memory"}}) {
    s.memory = word;
    EXPECT_NE(SummaryDetail(s).find(words), std::string::npos) << word;
  }
  EXPECT_EQ(SummaryDetail(s).find("registered"), std::string::npos);
  s.registered_bytes = 8ull << 30;
  s.registration_seconds = 0.4;
  EXPECT_NE(SummaryDetail(s).find("; registered 8.00 GiB in 400.000 ms (50.000 ms per GiB)"),
            std::string::npos)
      << SummaryDetail(s);
  const std::string json = FormatSummary(s, true);
  EXPECT_NE(json.find("\"registered_bytes\":8589934592,\"registration_seconds\":0.400000"),
            std::string::npos)
      << json;
}

// The clock check every transfer stage runs before it prints: figures that cannot be true.
TEST(Report, ClockCheckRefusesImpossibleFigures) {
  Summary s;
  s.bytes = 1'000'000'000;
  s.writes = 1000;
  s.seconds = 1;
  s.server_seconds = 0.9;
  EXPECT_EQ(ClockProblem(s, 1.5), "");
  // The span cannot be longer than the run it was measured in.
  EXPECT_NE(ClockProblem(s, 0.5).find("a span of 1.000000 s measured inside a run of 0.500000 s"),
            std::string::npos);
  // Bytes in no time: a clock that started at the last completion (a burst of them).
  s.seconds = 0;
  EXPECT_NE(ClockProblem(s, 1).find("in no measurable time"), std::string::npos);
  // The server cannot have written for longer than the client waited.
  s.seconds = 1;
  s.server_seconds = 2;
  EXPECT_NE(ClockProblem(s, 3).find("the server wrote for 2.000000 s"), std::string::npos);
  // Unless its DONEs came later: the server reads its last completion after that WRITE
  // landed (on a busy host 22 ms after a 12 ms transfer, measured), and only then answers.
  s.seconds = 0.012;
  s.server_seconds = 0.035;
  s.answered_seconds = 0.040;
  EXPECT_EQ(ClockProblem(s, 3), "");
  s.answered_seconds = 0.013;  // a DONE that claims more than the client waited for it
  EXPECT_NE(ClockProblem(s, 3).find("the server wrote for 0.035000 s, longer than the client "
                                    "waited for it (0.013000 s)"),
            std::string::npos)
      << ClockProblem(s, 3);
  s.seconds = 1;
  s.server_seconds = 2;
  s.answered_seconds = 0;
  // Nor faster than the link.
  s.server_seconds = 1;
  s.link_gbps = 4;
  EXPECT_NE(ClockProblem(s, 3).find("above the link"), std::string::npos);
  s.link_gbps = 8;
  EXPECT_EQ(ClockProblem(s, 3), "");
}

TEST(Report, ProgressLineInThePublishedForm) {
  EXPECT_EQ(FormatProgress(1500, 6000, 250'000'000, 2, 4),
            "progress: 2.0 s, 25.0% done, 1500 ops, 250.0 MB, 1.000 Gbps (25.0% of link), "
            "0.0008 Mpps");
  // Without a known link rate there is no percentage of it.
  EXPECT_EQ(FormatProgress(10, 0, 1000, 1, 0),
            "progress: 1.0 s, 0.0% done, 10 ops, 0.0 MB, 0.000 Gbps, 0.0000 Mpps");
  // The span since the last current count: a rate, or, while the count lags, no rate at all.
  EXPECT_EQ(FormatSinceLast(500'000'000, 2, ""), "; last 2.0 s: 2.000 Gbps");
  EXPECT_EQ(FormatSinceLast(0, 1, "a receiver is 1.2 s into one provider call"),
            "; last 1.0 s: not counted yet (a receiver is 1.2 s into one provider call)");
}

// Per NIC, the pages' bytes and the wire's, for 32 NICs whole (a JSON line far longer than a
// fixed buffer would hold), and efa's WRITE; the summary adds up the NICs that have counters.
TEST(Report, NicsAndEmulatedWrite) {
  Summary s;
  s.bytes = 32ull << 20;
  s.seconds = 1;
  s.emulated_write = 0;
  for (int i = 0; i < 32; ++i)
    s.nics.push_back({"rdmap" + std::to_string(79 + i) + "s0-rdm", 1 << 20, (1 << 20) + 1000});
  s.nics.push_back({"shm", 4096, -1});
  s.step = "+ warmup";
  const std::string json = FormatSummary(s, true);
  EXPECT_NE(json.find(",\"emulated_write\":false,\"receiver_cq_entries\":null,\"receiver_"
                      "completions\":null,\"nics\":[{\"name\":"
                      "\"rdmap79s0-rdm\",\"bytes\":1048576,\"wire_bytes\":1049576},"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("{\"name\":\"shm\",\"bytes\":4096,\"wire_bytes\":null}],"), std::string::npos)
      << json;
  const std::string text = SummaryDetail(s);
  EXPECT_NE(text.find("; NIC counters (host-wide): 32 NICs received 33.6 MB on the wire for 33.6 "
                      "MB of pages (100.1%)"),
            std::string::npos)
      << text;
}

// The ladder's verdict: by the runs' ranges, never by one lucky run.
TEST(Report, RunsVerdictByRanges) {
  EXPECT_EQ(RunsVerdict({1, 2, 3}, {4, 5, 6}), "gain");
  EXPECT_EQ(RunsVerdict({4, 5, 6}, {1, 2, 3}), "loss");
  EXPECT_EQ(RunsVerdict({1, 2, 4}, {3, 5, 6}), "no change");  // 3 < 4: the ranges overlap
  EXPECT_EQ(RunsVerdict({1, 2}, {4, 5, 6}), "too few runs");
  EXPECT_EQ(RunsVerdict({1, 2, 3}, {9}), "too few runs");
}

// Where GPUDirect RDMA is the point of the instance, --gpu-path auto means direct.
TEST(Registration, InstanceTypesMadeForGpuDirect) {
  for (const char* type :
       {"p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "p4d.24xlarge", "p6-b200.48xlarge"})
    EXPECT_TRUE(ExpectsGpuDirect(type)) << type;
  for (const char* type :
       {"", "g5.48xlarge", "p3dn.24xlarge", "Standard PC (Q35 + ICH9, 2009)", "p5"})
    EXPECT_FALSE(ExpectsGpuDirect(type)) << type;
  EXPECT_EQ(InstanceType("/nonexistent"), "");
  const auto dmi = std::filesystem::temp_directory_path() / "report_test_dmi";
  std::filesystem::create_directories(dmi);
  std::ofstream(dmi / "product_name") << "p5.48xlarge\n";  // as EC2's DMI reads
  EXPECT_EQ(InstanceType(dmi.string()), "p5.48xlarge");
  std::filesystem::remove_all(dmi);
}

// efa's device counts its own RDMA WRITEs: a NIC that counted fewer than 99% of the bytes its
// pages brought was sent the rest as emulated WRITEs, and says so; a netdev's byte counter
// (tcp) and NICs without a counter say nothing.
TEST(Report, WireWarningsWhereWritesWereEmulated) {
  Summary s;
  s.nics.push_back({"rdmap79s0-rdm", 1000000, 995000, true});  // 99.5%: the device's own
  s.nics.push_back({"rdmap80s0-rdm", 1000000, 400000, true});  // 40%: the rest emulated
  s.nics.push_back({"mcb0", 1000000, 10, false});              // tcp: every byte, not WRITEs
  s.nics.push_back({"shm", 1000000, -1, false});
  const std::vector<std::string> lines = WireWarnings(s);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].rfind("rdmap80s0-rdm: the device counted RDMA WRITEs for 40.0% of the "
                           "1000000 bytes of pages it received: efa emulated the rest",
                           0),
            0u)
      << lines[0];
}

// Under --gpu-path direct an RDMA WRITE that efa emulates with messages is refused (exit 77);
// elsewhere, or where the provider does not say, nothing is.
TEST(Registration, DirectRefusesEmulatedWrites) {
  MemoryPath path{PageBuffer::Path::kGpuDirect, "GPUDirect RDMA", GpuAllocation::kMalloc};
  path.direct_required = true;
  EXPECT_THROW(RequireDeviceWrites(path, true), HardwareAbsent);
  EXPECT_NO_THROW(RequireDeviceWrites(path, false));
  EXPECT_NO_THROW(RequireDeviceWrites(path, std::nullopt));
  path.direct_required = false;
  EXPECT_NO_THROW(RequireDeviceWrites(path, true));
}
