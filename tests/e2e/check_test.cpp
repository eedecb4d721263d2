// 07_full_p5 --check on this host: every check has its line, each OK, WARN or FAIL, the exit
// code follows the FAILs, and what it cannot find here (EFA, a GPU) it says, with the fix.
// The checks' logic on p5-shaped and failing hosts is in tests/unit/preflight_test.cpp.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "cuda_memory.hpp"
#include "process.hpp"

using namespace testing_support;

namespace {

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

TEST(Check, EveryCheckHasItsLine) {
  const Result r = RunToEnd({StageBinary("07_full_p5"), "--check", "-p", "shm"});
  ASSERT_GE(r.exit_code, 0) << r.err;
  const auto lines = Lines(r.out);
  ASSERT_FALSE(lines.empty());
  bool failed = false;
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    const std::string word = lines[i].substr(0, 6);
    EXPECT_TRUE(word == "OK    " || word == "WARN  " || word == "FAIL  ") << lines[i];
    failed = failed || word == "FAIL  ";
    if (word != "OK    ") {
      EXPECT_NE(lines[i].find(" -> "), std::string::npos) << "no fix: " << lines[i];
    }
  }
  EXPECT_EQ(r.exit_code, failed ? 1 : 0) << r.out;
  EXPECT_NE(lines.back().find(failed ? ": not ready" : ": ready"), std::string::npos) << r.out;
  for (const char* name :
       {"EFA devices", "/dev/infiniband", "GPUs", "GPU peer memory", "huge pages", "memlock",
        "ptrace scope", "FI_* variables", "libfabric", "providers", "NICs per GPU",
        "GPU memory in libfabric", "efa RDMA WRITE"})
    EXPECT_NE(r.out.find(std::string("  ") + name + ": "), std::string::npos) << name << "\n"
                                                                              << r.out;
  // shm's lane: in the first GPU's group where there is a GPU (an H200 host), else the host's.
  EXPECT_NE(r.out.find(common::CudaDeviceCount() > 0 ? "NICs per GPU: cuda:0: "
                                                     : "NICs per GPU: host NUMA"),
            std::string::npos)
      << r.out;
  bool efa = false;
  std::error_code ec;
  for (const auto& d : std::filesystem::directory_iterator("/sys/class/infiniband", ec))
    efa = efa || std::filesystem::read_symlink(d.path() / "device/driver", ec).filename() == "efa";
  if (!efa) {
    EXPECT_NE(r.out.find("WARN  EFA devices: none in /sys/class/infiniband: not an EFA host"),
              std::string::npos)
        << r.out;
  }
  std::printf("%s", r.out.c_str());
}

TEST(Check, NamesTheVariablesThatChangeLibfabric) {
  const Result r = RunToEnd({"/usr/bin/env", "FI_EFA_USE_DEVICE_RDMA=0", "FI_LOG_LEVEL=warn",
                             StageBinary("07_full_p5"), "--check", "-p", "shm"});
  // Named, beside any the environment already sets (FI_PROVIDER_PATH for a vendored
  // libfabric); FI_LOG_* only logs, and is left out.
  const size_t at = r.out.find("WARN  FI_* variables: set: ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
  EXPECT_NE(line.find("FI_EFA_USE_DEVICE_RDMA=0"), std::string::npos) << line;
  EXPECT_EQ(line.find("FI_LOG_LEVEL"), std::string::npos) << line;
  EXPECT_NE(line.find(" -> "), std::string::npos) << line;
}

TEST(Check, AProviderThatIsNotHereIsBadUsage) {
  const Result r = RunToEnd({StageBinary("07_full_p5"), "--check", "-p", "nope"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("nope"), std::string::npos) << r.err;
}
