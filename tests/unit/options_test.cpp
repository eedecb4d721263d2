#include <gtest/gtest.h>
#include <CLI/CLI.hpp>

#include "error.hpp"
#include "options.hpp"
#include "protocol.hpp"
#include "provider_watch.hpp"

using namespace common;

TEST(ParseSize, PlainNumbersAndSuffixes) {
  EXPECT_EQ(ParseSize("0", "-S"), 0u);
  EXPECT_EQ(ParseSize("4096", "-S"), 4096u);
  EXPECT_EQ(ParseSize("64k", "-S"), 65536u);
  EXPECT_EQ(ParseSize("64K", "-S"), 65536u);
  EXPECT_EQ(ParseSize("1m", "-S"), 1u << 20);
  EXPECT_EQ(ParseSize("1MiB", "-S"), 1u << 20);
  EXPECT_EQ(ParseSize("2g", "-S"), 2ull << 30);
  EXPECT_EQ(ParseSize("3t", "-S"), 3ull << 40);
}

TEST(ParseSize, RejectsNamingTheValueAndOption) {
  for (const char* bad :
       {"12q", "", "k", "-1", "1.5k", " 1", "1 k", "99999999999999999999", "16777216t"}) {
    try {
      ParseSize(bad, "--page-size");
      FAIL() << bad;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("'" + std::string(bad) + "' for --page-size"),
                std::string::npos)
          << e.what();
    }
  }
}

// Parses a command line the way a stage does; returns ParseCommandLine's answer.
static int Parse(Options& options, unsigned groups, std::vector<std::string> args) {
  CLI::App app{"test", "prog"};
  AddOptions(app, options, groups);
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return ParseCommandLine(app, static_cast<int>(argv.size()), argv.data());
}

TEST(Options, RequestSizeWithinTheWire) {
  Options o;
  EXPECT_NO_THROW(CheckRequestSize(o));
  auto refused = [](Options bad) {
    try {
      CheckRequestSize(bad);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  Options page = o;
  page.page_size = 0;
  EXPECT_EQ(refused(page).rfind("invalid --page-size 0 (1 to ", 0), 0u) << refused(page);
  Options pages = o;
  pages.pages = wire::kMaxPagesPerRequest + 1;
  EXPECT_EQ(refused(pages).rfind("invalid --pages " + std::to_string(pages.pages), 0), 0u);
  Options product = o;
  product.pages = wire::kMaxPagesPerRequest;
  product.page_size = wire::kMaxPageBytes;
  static_assert(wire::kMaxPagesPerRequest * wire::kMaxPageBytes > wire::kMaxRequestBytes);
  EXPECT_EQ(refused(product).rfind("--pages x --page-size is ", 0), 0u) << refused(product);
  Options repeat = o;
  repeat.repeat = 0;
  EXPECT_EQ(refused(repeat), "invalid --repeat 0");
}

TEST(Options, DefaultsAndEveryGroup) {
  Options o;
  ASSERT_EQ(Parse(o, ~0u, {}), -1);
  EXPECT_TRUE(o.peer.empty());
  EXPECT_EQ(o.page_size, 65536u);
  EXPECT_EQ(o.memory, MemoryKind::kAuto);

  Options p;
  ASSERT_EQ(
      Parse(p, ~0u, {"-p",      "tcp",          "--domain", "lo",          "-S",     "1m",
                     "--pages", "2k",           "--repeat", "3",           "-W",     "128",
                     "-w",      "10",           "--memory", "host",        "--json", "--nics",
                     "4",       "--wait",       "block",    "--link-gbps", "4",      "--timeout",
                     "2.5",     "--exit-after", "3",        "abcd"}),
      -1);
  EXPECT_EQ(p.provider, "tcp");
  EXPECT_EQ(p.domain, "lo");
  EXPECT_EQ(p.page_size, 1u << 20);
  EXPECT_EQ(p.pages, 2048u);
  EXPECT_EQ(p.repeat, 3u);
  EXPECT_EQ(p.window, 128u);
  EXPECT_EQ(p.warmup, 10u);
  EXPECT_EQ(p.memory, MemoryKind::kHost);
  EXPECT_TRUE(p.json);
  EXPECT_EQ(p.nics, 4u);
  EXPECT_EQ(p.wait, WaitMode::kBlock);
  EXPECT_DOUBLE_EQ(p.link_gbps, 4.0);
  EXPECT_DOUBLE_EQ(p.timeout_s, 2.5);
  EXPECT_EQ(p.exit_after, 3u);
  EXPECT_EQ(p.peer, "abcd");
}

TEST(Options, MemoryKinds) {
  for (const auto& [word, kind] :
       std::vector<std::pair<std::string, MemoryKind>>{{"host", MemoryKind::kHost},
                                                       {"cuda", MemoryKind::kCuda},
                                                       {"cuda-vmm", MemoryKind::kCudaVmm}}) {
    Options o;
    ASSERT_EQ(Parse(o, ~0u, {"--memory", word}), -1) << word;
    EXPECT_EQ(o.memory, kind) << word;
    EXPECT_EQ(MemoryName(kind), word);
  }
  EXPECT_TRUE(IsGpu(MemoryKind::kCuda));
  EXPECT_TRUE(IsGpu(MemoryKind::kCudaVmm));
  EXPECT_FALSE(IsGpu(MemoryKind::kHost));
  EXPECT_FALSE(IsGpu(MemoryKind::kAuto));
}

TEST(Options, BadUsageIsExitTwo) {
  Options o;
  EXPECT_EQ(Parse(o, ~0u, {"--bogus"}), kExitUsage);
  EXPECT_EQ(Parse(o, ~0u, {"-S", "12q"}), kExitUsage);
  EXPECT_EQ(Parse(o, ~0u, {"--memory", "gpu"}), kExitUsage);
  EXPECT_EQ(Parse(o, ~0u, {"--wait", "maybe"}), kExitUsage);
  EXPECT_EQ(Parse(o, ~0u, {"--timeout", "-1"}), kExitUsage);
  // An option of a group the stage did not add is unknown to it.
  EXPECT_EQ(Parse(o, kServeOptions, {"-S", "4k"}), kExitUsage);
}

TEST(Options, HelpIsExitZero) {
  Options o;
  testing::internal::CaptureStdout();
  EXPECT_EQ(Parse(o, kServeOptions, {"--help"}), kExitOk);
  EXPECT_NE(testing::internal::GetCapturedStdout().find("--provider"), std::string::npos);
}

// A client's receive may stay inside one fi_cq_read while its server feeds it (shm drains its
// whole queue in one call): a client gives a provider call its --timeout, a server 3 s.
TEST(Options, AClientGivesAProviderCallItsTimeout) {
  auto parse = [](std::vector<std::string> args) {
    Options o;
    args.insert(args.begin(), "prog");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    return ParseCommandLine(static_cast<int>(argv.size()), argv.data(), "test", "prog",
                            kServeOptions, o);
  };
  EXPECT_EQ(parse({}), -1);
  EXPECT_EQ(StuckSeconds(), kStuckSeconds);
  EXPECT_EQ(parse({"00ff", "--timeout", "20"}), -1);
  EXPECT_EQ(StuckSeconds(), 20);
  EXPECT_EQ(parse({"00ff", "--timeout", "1"}), -1);
  EXPECT_EQ(StuckSeconds(), kStuckSeconds);  // never below a server's
  SetStuckSeconds(kStuckSeconds);
}
