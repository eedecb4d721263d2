// End to end, the transfer stages (03 onward): real server and client processes over shm and
// tcp (loopback) with host memory, asserting exit codes and the exact verified byte counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <tuple>

#include <rdma/fabric.h>

#include "cuda_memory.hpp"
#include "process.hpp"

using namespace testing_support;
using namespace std::chrono_literals;

namespace {

// How many requests a client of this stage sends (03 sends one; later stages --requests).
int RequestsOf(const std::string& stage) {
  return stage == "03_gpudirect_write" ? 1 : 4;
}

// Lanes from 06 on: two here, so striping is always exercised.
std::vector<std::string> LaneArgs(const std::string& stage) {
  if (stage < "06") return {};
  return {"--nics", "2"};
}

std::vector<std::string> ServerArgs(const std::string& stage) {
  std::vector<std::string> args = {"--memory", "host"};
  for (auto& a : LaneArgs(stage)) args.push_back(a);
  return args;
}

class Transfer : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  std::string stage() const { return std::get<0>(GetParam()); }
  std::string provider() const { return std::get<1>(GetParam()); }
  // Extra client arguments every run of this stage needs.
  std::vector<std::string> With(std::vector<std::string> args) const {
    if (RequestsOf(stage()) > 1) {
      args.push_back("--requests");
      args.push_back(std::to_string(RequestsOf(stage())));
    }
    args.push_back("--memory");
    args.push_back("host");
    for (auto& a : LaneArgs(stage())) args.push_back(a);
    return args;
  }
};

TEST_P(Transfer, VerifiesEveryPageForSeveralSizes) {
  const struct {
    const char* page_size;
    long long bytes;
    int pages;
  } cases[] = {{"4k", 4096, 100}, {"64k", 65536, 37}, {"1m", 1 << 20, 8}, {"1000", 1000, 5}};
  StageServer server(stage(), provider(), 4, ServerArgs(stage()));
  ASSERT_FALSE(server.address().empty());
  for (const auto& c : cases) {
    Result client =
        RunClient(stage(), provider(), server.address(),
                  With({"-S", c.page_size, "--pages", std::to_string(c.pages), "--repeat", "2"}));
    ASSERT_EQ(client.exit_code, 0) << c.page_size << "\n" << client.out << client.err;
    EXPECT_EQ(NumberAfter(client.out, "verified "), c.bytes * c.pages * RequestsOf(stage()))
        << client.out;
  }
  Result done = server.Wait();
  EXPECT_EQ(done.exit_code, 0) << done.err;
  EXPECT_NE(done.out.find("served 4 clients"), std::string::npos) << done.out;
}

TEST_P(Transfer, ClientWithoutServerGivesUpInBoundedTime) {
  std::string address;
  {
    StageServer server(stage(), provider(), 0, ServerArgs(stage()));
    address = server.address();
  }  // killed here
  ASSERT_FALSE(address.empty());
  const auto start = std::chrono::steady_clock::now();
  Result client = RunClient(stage(), provider(), address, With({"--timeout", "2", "--pages", "4"}));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(client.exit_code, 1) << client.out << client.err;
  // Over shm the address is refused at once: the server's name left /dev/shm with it.
  EXPECT_TRUE(
      client.err.find("no answer from the server") != std::string::npos ||
      (provider() == "shm" && client.err.find("no shm endpoint is named") != std::string::npos))
      << client.err;
  // Its --timeout of 2 s, plus starting libfabric and closing endpoints whose peer is gone,
  // with room for a loaded 2-core host (messages_test.cpp's twin once took 9.4 s of its 8).
  EXPECT_LT(took, 20.0);
}

// The clock cannot lie: the client times a request from sending it to its last WRITE, so its
// seconds lie within the process's wall time and cover the server's own (first post to last
// completion); the rate printed is the bytes over those seconds. A clock started at the first
// arrival, with completions delivered in a burst (shm 2.x), failed the second check.
TEST_P(Transfer, ReportedRateAgreesWithWallTime) {
  StageServer server(stage(), provider(), 1, ServerArgs(stage()));
  ASSERT_FALSE(server.address().empty());
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> args = {"-S", "64k", "--pages", "256", "--repeat", "8"};
  if (stage() >= "04") args.push_back("--json");
  Result r = RunClient(stage(), provider(), server.address(), With(args));
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  if (stage() >= "04") {
    EXPECT_TRUE(OnlyJsonLines(r.out)) << r.out;  // --json: records only
  }
  const double expected_bytes = 256.0 * 65536 * 8 * RequestsOf(stage());
  double bytes = 0, seconds = 0, server_seconds = 0;
  if (stage() < "04") {  // 03 prints "received N WRITEs (B bytes) in S s (server: T s)"
    bytes = DecimalAfter(r.out, "WRITEs (");
    seconds = DecimalAfter(r.out, " bytes) in ");
    server_seconds = DecimalAfter(r.out, "(server: ");
  } else {  // the JSON line
    bytes = DecimalAfter(r.out, "\"bytes\":");
    seconds = DecimalAfter(r.out, "\"seconds\":");
    server_seconds = DecimalAfter(r.out, "\"server_seconds\":");
    const double gbps = DecimalAfter(r.out, "\"gbps\":");
    EXPECT_NEAR(gbps, bytes * 8 / seconds / 1e9, gbps * 0.01 + 0.001) << r.out;
  }
  EXPECT_EQ(bytes, expected_bytes) << r.out;
  EXPECT_GT(seconds, 0) << r.out;
  EXPECT_LT(seconds, wall) << r.out;
  EXPECT_GE(seconds, server_seconds * 0.9) << r.out;
  EXPECT_EQ(server.Wait().exit_code, 0);
}

// GPU memory, from cudaMalloc and mapped by the CUDA VMM API (--memory cuda-vmm, on both
// sides): runs where there is a GPU; elsewhere the client must answer 77 (skipped).
TEST_P(Transfer, CudaMemoryOrExit77) {
  const bool gpu = common::CudaDeviceCount() > 0;
  for (const std::string kind : {"cuda", "cuda-vmm"}) {
    SCOPED_TRACE("--memory " + kind);
    std::vector<std::string> server_args = ServerArgs(stage());  // host memory, unless a GPU
    auto memory = std::find(server_args.begin(), server_args.end(), "--memory");
    if (gpu && memory != server_args.end()) *(memory + 1) = kind;
    StageServer server(stage(), provider(), 1, server_args);
    ASSERT_FALSE(server.address().empty());
    std::vector<std::string> args = {"--pages", "64", "-S", "64k", "--memory", kind};
    if (RequestsOf(stage()) > 1) args.insert(args.end(), {"--requests", "2"});
    for (auto& a : LaneArgs(stage())) args.push_back(a);
    Result client = RunClient(stage(), provider(), server.address(), args, 120s);
    if (client.exit_code == 77) {
      EXPECT_NE(client.err.find("--memory " + kind + ":"), std::string::npos) << client.err;
      EXPECT_EQ(std::count(client.err.begin(), client.err.end(), '\n'), 1) << client.err;
      EXPECT_FALSE(gpu) << client.err;
      if (kind == "cuda-vmm") GTEST_SKIP() << "no GPU: " << client.err;
      continue;
    }
    ASSERT_EQ(client.exit_code, 0) << client.out << client.err;
    EXPECT_NE(client.out.find(kind == "cuda" ? "GPU memory"
                                             : "GPU memory mapped in 20 MiB chunks "
                                               "by the CUDA VMM API"),
              std::string::npos)
        << client.out;
    EXPECT_EQ(NumberAfter(client.out, "verified "),
              64 * 65536LL * (RequestsOf(stage()) > 1 ? 2 : 1));
    EXPECT_EQ(server.Wait().exit_code, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Stages, Transfer,
    ::testing::Combine(::testing::Values("03_gpudirect_write", "04_concurrent", "05_queuing",
                                         "06_multi_nic", "07_full_p5"),
                       ::testing::Values("shm", "tcp")),
    [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

// Which way GPU pages go over shm, and that the program says so, for every stage that has
// GPU memory. libfabric 2.x's shm registers GPU memory (and copies it with CUDA IPC):
// --gpu-path direct and auto both say "pages in GPU memory, direct (...)". 1.17's shm has no
// CUDA: direct exits 77 with the probe's reason in one line, and auto takes the staged path,
// saying why. Skipped without a GPU.
class GpuPath : public ::testing::TestWithParam<std::string> {
 protected:
  std::string stage() const { return GetParam(); }
  std::string provider() const { return "shm"; }
};

TEST_P(GpuPath, IsTheOneThisLibfabricOffers) {
  StageServer server(stage(), provider(), 2, ServerArgs(stage()));
  ASSERT_FALSE(server.address().empty());
  std::vector<std::string> args = {"--pages", "32", "-S", "64k", "--memory", "cuda"};
  for (auto& a : LaneArgs(stage())) args.push_back(a);
  auto with = [&](const char* path) {
    auto a = args;
    a.insert(a.end(), {"--gpu-path", path});
    return a;
  };
  Result direct = RunClient(stage(), provider(), server.address(), with("direct"));
  if (direct.exit_code == 77 && direct.err.find("--memory cuda") != std::string::npos)
    GTEST_SKIP() << "no GPU: " << direct.err;
  if (FI_MAJOR(fi_version()) >= 2) {
    ASSERT_EQ(direct.exit_code, 0) << direct.out << direct.err;
    EXPECT_NE(direct.out.find("pages in GPU memory, direct ("), std::string::npos) << direct.out;
    EXPECT_EQ(NumberAfter(direct.out, "verified "), 32 * 65536LL * RequestsOf(stage()));
    Result again = RunClient(stage(), provider(), server.address(), with("auto"));
    ASSERT_EQ(again.exit_code, 0) << again.out << again.err;
    EXPECT_NE(again.out.find("pages in GPU memory, direct ("), std::string::npos) << again.out;
  } else {
    EXPECT_EQ(direct.exit_code, 77) << direct.out << direct.err;
    EXPECT_NE(direct.err.find("--gpu-path direct: shm does not register GPU memory"),
              std::string::npos)
        << direct.err;
    EXPECT_EQ(std::count(direct.err.begin(), direct.err.end(), '\n'), 1) << direct.err;
    Result staged = RunClient(stage(), provider(), server.address(), with("auto"));
    ASSERT_EQ(staged.exit_code, 0) << staged.out << staged.err;
    EXPECT_NE(staged.out.find("GPU memory, staged through pinned host memory (shm does not"),
              std::string::npos)
        << staged.out;
    EXPECT_EQ(NumberAfter(staged.out, "verified "), 32 * 65536LL * RequestsOf(stage()));
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, GpuPath,
                         ::testing::Values("03_gpudirect_write", "04_concurrent", "05_queuing",
                                           "06_multi_nic", "07_full_p5"),
                         [](const auto& info) { return info.param; });

// The summary of 04 onward, as one JSON line.
TEST(Summary, JsonLineCarriesTheFigures) {
  StageServer server("05_queuing", "shm", 1, {"--memory", "host"});
  ASSERT_FALSE(server.address().empty());
  Result client = RunClient("05_queuing", "shm", server.address(),
                            {"--memory", "host", "--pages", "10", "-S", "8k", "--repeat", "3",
                             "--requests", "2", "--json", "--link-gbps", "100"});
  ASSERT_EQ(client.exit_code, 0) << client.err;
  EXPECT_EQ(NumberAfter(client.out, "\"bytes\":"), 10 * 8192 * 3 * 2);
  EXPECT_EQ(NumberAfter(client.out, "\"writes\":"), 60);  // every WRITE counts: the clock
  EXPECT_EQ(NumberAfter(client.out, "\"verified_bytes\":"), 10 * 8192 * 2);  // starts at send
  EXPECT_NE(client.out.find("\"link_gbps\":100.000"), std::string::npos) << client.out;
  EXPECT_NE(client.out.find("\"server_seconds\":"), std::string::npos) << client.out;
  EXPECT_NE(client.out.find("\"memory\":\"host\""), std::string::npos) << client.out;
  EXPECT_EQ(server.Wait().exit_code, 0);
}

// A million WRITEs through the pending queue finish with zero errors and full verification.
TEST(Queue, MillionWritesAllVerified) {
  StageServer server("05_queuing", "shm", 1, {"--memory", "host"});
  ASSERT_FALSE(server.address().empty());
  Result client = RunClient("05_queuing", "shm", server.address(),
                            {"--memory", "host", "--pages", "8192", "-S", "64", "--repeat", "32",
                             "--requests", "4", "-W", "4096", "--json"},
                            300s);
  ASSERT_EQ(client.exit_code, 0) << client.err;
  EXPECT_EQ(NumberAfter(client.out, "\"writes\":"), 8192LL * 32 * 4);
  EXPECT_EQ(NumberAfter(client.out, "\"verified_bytes\":"), 8192LL * 64 * 4);
  EXPECT_EQ(server.Wait().exit_code, 0);
}

}  // namespace

// 06 on one host: 4 lanes (several endpoints of one domain), pages striped, all verified;
// and a client with more lanes than the server uses only the server's.
class Lanes : public ::testing::TestWithParam<std::string> {};

TEST_P(Lanes, FourLanesVerified) {
  StageServer server("06_multi_nic", GetParam(), 2, {"--memory", "host", "--nics", "4"});
  ASSERT_FALSE(server.address().empty());
  Result four = RunClient("06_multi_nic", GetParam(), server.address(),
                          {"--memory", "host", "--nics", "4", "--pages", "257", "-S", "16k",
                           "--requests", "3", "--repeat", "2", "--json"});
  ASSERT_EQ(four.exit_code, 0) << four.err;
  EXPECT_EQ(NumberAfter(four.out, "\"verified_bytes\":"), 257LL * 16384 * 3);
  EXPECT_EQ(NumberAfter(four.out, "\"lanes\":"), 4);
  EXPECT_NE(four.err.find("4 lanes"), std::string::npos) << four.err;
  // Every lane's initiator is in that lane's AV before the first WRITE (efa-direct's rule).
  EXPECT_NE(four.err.find("the server's writers are in our lanes' AVs: 4 of 4 lanes"),
            std::string::npos)
      << four.err;
  EXPECT_TRUE(OnlyJsonLines(four.out)) << four.out;
  Result six = RunClient("06_multi_nic", GetParam(), server.address(),
                         {"--memory", "host", "--nics", "6", "--pages", "64", "-S", "4k"});
  ASSERT_EQ(six.exit_code, 0) << six.err;
  EXPECT_EQ(NumberAfter(six.out, "verified "), 64LL * 4096 * 4);
  EXPECT_NE(six.out.find("the server's writers are in our lanes' AVs: 4 of 6 lanes"),
            std::string::npos)
      << six.out;
  Result done = server.Wait();
  EXPECT_EQ(done.exit_code, 0) << done.err;
  EXPECT_NE(done.out.find("4 lanes"), std::string::npos) << done.out;
}

TEST_P(Lanes, PrintsTheTopologyGroups) {
  Result r =
      RunToEnd({StageBinary("06_multi_nic"), "-p", GetParam() == "tcp" ? "tcp" : "shm", "--domain",
                GetParam() == "tcp" ? "lo" : "shm", "--memory", "host", "--exit-after", "1",
                "--timeout", "1", "--address-file", "/dev/null", "--nics", "3"},
               3s);  // a server: stopped by the limit after it printed its header
  EXPECT_NE(r.out.find("GPUs: 0, NICs: 1, Total Bandwidth:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  host NUMA0 CPU "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("3 lanes"), std::string::npos) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Providers, Lanes, ::testing::Values("shm", "tcp"));

// shm names an endpoint's region after the process id, and a process killed with SIGKILL
// leaves its file in /dev/shm: a later process with the same id must still start.
TEST(Shm, RegionLeftByADeadProcessWithOurIdIsNoObstacle) {
  StageServer server("05_queuing", "shm", 1, {"--memory", "host"});
  ASSERT_FALSE(server.address().empty());
  // The shell plants a stale region under its own id, then becomes the client (same id).
  const std::string client = StageBinary("05_queuing") + " -p shm " + server.address() +
                             " --memory host --pages 8 -S 4k --requests 1";
  Result r =
      RunToEnd({"/bin/sh", "-c",
                "head -c 4096 /dev/zero > /dev/shm/$$:0:0 && echo planted $$ && exec " + client});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(NumberAfter(r.out, "verified "), 8 * 4096) << r.out;
  const long long pid = NumberAfter(r.out, "planted ");
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + std::to_string(pid) + ":0:0"));
  EXPECT_EQ(server.Wait().exit_code, 0);
}
