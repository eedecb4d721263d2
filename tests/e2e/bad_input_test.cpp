// Every stage answers bad input with exit 2 and one line that names the bad value.
#include <gtest/gtest.h>
#include <rdma/fabric.h>

#include <algorithm>
#include <string>

#include "process.hpp"
#include "provider.hpp"

using namespace testing_support;
using namespace std::chrono_literals;

namespace {

class BadInput : public ::testing::TestWithParam<std::string> {
 protected:
  // Runs the stage and checks: exit 2, exactly one line on stderr, naming `named`.
  void ExpectUsageError(std::vector<std::string> args, const std::string& named) {
    args.insert(args.begin(), StageBinary(GetParam()));
    Result r = RunToEnd(args, 20s);
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find(named), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
};

TEST_P(BadInput, AddressNotHex) {
  ExpectUsageError({"-p", "shm", "xyz123"}, "'xyz123' is not hex");
}

TEST_P(BadInput, AddressOddLength) {
  ExpectUsageError({"-p", "shm", "abc"}, "'abc' has an odd number of hex digits");
}

TEST_P(BadInput, AddressWrongLengthForTcp) {
  ExpectUsageError({"-p", "tcp", "--domain", "lo", "00112233"},
                   "address has 4 bytes, but tcp;ofi_rxm addresses (FI_SOCKADDR_IN) have 16");
}

TEST_P(BadInput, AddressNotAShmName) {
  ExpectUsageError({"-p", "shm", "00112233"}, "is not a shm address");
}

TEST_P(BadInput, UnknownProviderListsThisMachines) {
  ExpectUsageError({"-p", "nosuchfabric", "00"},
                   "unknown provider 'nosuchfabric' (this machine has: ");
  Result r = RunToEnd({StageBinary(GetParam()), "-p", "nosuchfabric"}, 20s);
  EXPECT_NE(r.err.find("shm"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tcp"), std::string::npos) << r.err;
}

// A NIC's provider that this host lacks is absent hardware (exit 77, README's contract), named
// with what the host offers; a name libfabric does not know is a usage error (above).
TEST_P(BadInput, AbsentNicProviderExits77) {
  for (const std::string nic : {"efa", "verbs"}) {  // verbs: rxm's core ("verbs;ofi_rxm")
    bool here = false;
    for (const auto& name : common::AvailableProviders())
      here = here || name.substr(0, name.find(';')) == nic;
    if (here) continue;  // this host has it
    Result r = RunToEnd({StageBinary(GetParam()), "-p", nic, "00"}, 20s);
    EXPECT_EQ(r.exit_code, 77) << r.out << r.err;
    EXPECT_NE(r.err.find("provider '" + nic + "' is not on this machine"), std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("tcp"), std::string::npos) << r.err;
  }
}

TEST_P(BadInput, UnknownDomain) {
  ExpectUsageError({"-p", "tcp", "--domain", "nosuchnic"}, "no domain 'nosuchnic'");
}

TEST_P(BadInput, UnknownOption) {
  ExpectUsageError({"--bogus"}, "--bogus");
}

TEST_P(BadInput, SizeWithUnknownSuffix) {
  ExpectUsageError({"--exit-after", "12q"}, "invalid size '12q' for --exit-after");
}

TEST_P(BadInput, TimeoutNotANumber) {
  ExpectUsageError({"--timeout", "soon", "00"}, "invalid value 'soon' for --timeout");
}

TEST_P(BadInput, HelpExplainsAndExitsZero) {
  Result r = RunToEnd({StageBinary(GetParam()), "--help"}, 20s);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--provider"), std::string::npos);
  EXPECT_NE(r.out.find("Lesson"), std::string::npos);
  // In groups, the connection's first; what no group names under "Other", last.
  const size_t connection = r.out.find("\nConnection:"), other = r.out.find("\nOther:");
  EXPECT_NE(connection, std::string::npos) << r.out;
  EXPECT_NE(other, std::string::npos) << r.out;
  EXPECT_LT(connection, other) << r.out;
  EXPECT_EQ(r.out.find("--test-"), std::string::npos) << r.out;  // hidden
  if (std::string(GetParam()) != "07_full_p5") return;
  for (const char* group : {"Memory:", "Request:", "Engine (the client asks):", "Ladder:",
                            "Host checks:", "Output:", "Server:"})
    EXPECT_NE(r.out.find(std::string("\n") + group), std::string::npos) << group << r.out;
}

// --version: the project's, the libfabric of the headers and the one loaded, on one line.
TEST_P(BadInput, VersionNamesBothLibfabrics) {
  Result r = RunToEnd({StageBinary(GetParam()), "--version"}, 20s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::string built = std::to_string(FI_MAJOR_VERSION) + "." +
                            std::to_string(FI_MINOR_VERSION) + "." +
                            std::to_string(FI_REVISION_VERSION) + " at build, ";
  const std::string running = std::to_string(FI_MAJOR(fi_version())) + "." +
                              std::to_string(FI_MINOR(fi_version())) + " at run time\n";
  EXPECT_EQ(r.out,
            std::string(GetParam()) + " " + PROJECT_VERSION + "; libfabric " + built + running);
}

INSTANTIATE_TEST_SUITE_P(Stages, BadInput,
                         ::testing::Values("01_send_recv", "02_bidirectional", "03_gpudirect_write",
                                           "04_concurrent", "05_queuing", "06_multi_nic",
                                           "07_full_p5"));

// Options of the transfer stages.
class BadTransferInput : public BadInput {};

TEST_P(BadTransferInput, PageSizeWithUnknownSuffix) {
  ExpectUsageError({"-S", "12q"}, "invalid size '12q' for --page-size");
}

TEST_P(BadTransferInput, PageSizeZeroOrTooLarge) {
  ExpectUsageError({"-p", "shm", "-S", "0", "66695f73686d3a2f2f310000"}, "invalid --page-size 0");
  ExpectUsageError({"-p", "shm", "-S", "1g", "66695f73686d3a2f2f3100"},
                   "invalid --page-size 1073741824");
}

TEST_P(BadTransferInput, TooManyPagesPerRequest) {
  ExpectUsageError({"-p", "shm", "--pages", "100000", "66695f73686d3a2f2f3100"},
                   "invalid --pages 100000");
}

TEST_P(BadTransferInput, UnknownMemoryKind) {
  ExpectUsageError({"--memory", "gpu"}, "invalid --memory 'gpu'");
}

// A server started with a limit it cannot serve by (every request refused, every client
// refused, a size past any host) says so and exits 2, instead of starting.
TEST_P(BadTransferInput, ServerLimitsOutOfRange) {
  ExpectUsageError({"-p", "shm", "--server-memory", "0"}, "invalid --server-memory 0 (1 to 1t)");
  ExpectUsageError({"-p", "shm", "--client-memory", "2t"}, "invalid --client-memory 2t (1 to 1t)");
  ExpectUsageError({"-p", "shm", "--max-clients", "4294967297"},
                   "invalid --max-clients 4294967297 (0 to 65536)");
}

INSTANTIATE_TEST_SUITE_P(Stages, BadTransferInput,
                         ::testing::Values("03_gpudirect_write", "04_concurrent", "05_queuing",
                                           "06_multi_nic", "07_full_p5"));

class BadWindowInput : public BadInput {};

// --max-requests 0 would refuse every request; a window of 0 would post nothing.
TEST_P(BadWindowInput, ZeroRequestsOrWindow) {
  ExpectUsageError({"-p", "shm", "--max-requests", "0"}, "invalid --max-requests 0 (1 to 65536)");
  ExpectUsageError({"-p", "shm", "-W", "0"}, "invalid --window 0 (1 to 65536)");
}

INSTANTIATE_TEST_SUITE_P(Stages, BadWindowInput,
                         ::testing::Values("04_concurrent", "05_queuing", "06_multi_nic",
                                           "07_full_p5"));

class BadLaneInput : public BadInput {};

TEST_P(BadLaneInput, UnknownWaitMode) {
  ExpectUsageError({"--wait", "maybe"}, "invalid --wait 'maybe'");
}

TEST_P(BadLaneInput, TooManyLanes) {
  ExpectUsageError({"-p", "shm", "--memory", "host", "--nics", "65"}, "invalid --nics 65");
}

TEST_P(BadLaneInput, BlockingWithoutAWaitObject) {
  ExpectUsageError({"-p", "shm", "--memory", "host", "--wait", "block"},
                   "--wait block: provider shm");
}

INSTANTIATE_TEST_SUITE_P(Stages, BadLaneInput, ::testing::Values("06_multi_nic", "07_full_p5"));

// 07's posting switches are the client's to give; the engine's shape is the server's too.
class BadEngineInput : public BadInput {};

TEST_P(BadEngineInput, PostingSwitchesBelongToTheClient) {
  ExpectUsageError({"-p", "shm", "--batch", "2"}, "--batch is a client option");
  ExpectUsageError({"-p", "shm", "--eager-post"}, "--eager-post is a client option");
}

TEST_P(BadEngineInput, BatchAndThreadsOutOfRange) {
  ExpectUsageError({"-p", "shm", "--batch", "0", "66695f73686d3a2f2f3100"}, "invalid --batch 0");
  ExpectUsageError({"-p", "shm", "--batch", "2000", "66695f73686d3a2f2f3100"},
                   "invalid --batch 2000 (1 to 1024)");
  ExpectUsageError({"-p", "shm", "--threads", "65", "66695f73686d3a2f2f3100"},
                   "invalid --threads 65");
  ExpectUsageError({"--peer-timeout", "-1"}, "invalid value '-1' for --peer-timeout");
}

// Which GPUs and how their memory is registered: a bad value is named, exit 2; --gpus with
// no GPU in use (host memory) is refused, not ignored.
TEST_P(BadEngineInput, GpusAndDmabuf) {
  ExpectUsageError({"-p", "shm", "--dmabuf", "maybe"},
                   "invalid --dmabuf 'maybe' (use auto, on or off)");
  for (const char* bad : {"1-0", "x", "3,", "2k", ""})
    ExpectUsageError({"-p", "shm", "--gpus", bad}, std::string("invalid --gpus '") + bad +
                                                       "' (CUDA device indices: 3, 0,2 or 4-7)");
  ExpectUsageError({"-p", "shm", "--memory", "host", "--gpus", "0"},
                   "invalid --gpus: this process uses no GPU (host memory, or none seen)");
}

TEST_P(BadEngineInput, StartAtNotATimeOrTooFarOff) {
  ExpectUsageError({"-p", "shm", "--start-at", "soon", "66695f73686d3a2f2f3100"},
                   "invalid --start-at 'soon'");
  // Further off than --timeout: the server would take the wait for silence.
  ExpectUsageError({"-p", "shm", "--start-at", "99999999999", "66695f73686d3a2f2f3100"},
                   "at most --timeout, 10 s");
  ExpectUsageError({"-p", "shm", "--start-at", "1"}, "--start-at is a client option");  // a server
}

INSTANTIATE_TEST_SUITE_P(Stages, BadEngineInput, ::testing::Values("07_full_p5"));

}  // namespace
