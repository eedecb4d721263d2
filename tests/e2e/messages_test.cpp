// End to end, stages 01 and 02: the real server and client binaries as separate processes
// over shm and tcp (loopback), asserting exit codes and the exact text that arrived.
#include <gtest/gtest.h>

#include <csignal>
#include <optional>
#include <string>
#include <tuple>

#include "process.hpp"

using namespace testing_support;
using namespace std::chrono_literals;

namespace {

// Provider arguments: tcp is pinned to the loopback domain, so nothing leaves this host.
std::vector<std::string> ProviderArgs(const std::string& provider) {
  if (provider == "tcp") return {"-p", "tcp", "--domain", "lo"};
  return {"-p", provider};
}

struct Server {
  Server(const std::string& stage, const std::string& provider, int max_clients)
      : dir(), address_file(dir.path() + "/addr") {
    std::vector<std::string> argv = {StageBinary(stage), "--address-file", address_file,
                                     "--max-clients", std::to_string(max_clients)};
    for (auto& a : ProviderArgs(provider)) argv.push_back(a);
    process.emplace(argv);
    address = WaitForLine(address_file, 10s);
  }
  TempDir dir;
  std::string address_file;
  std::optional<Process> process;
  std::string address;
};

Result Client(const std::string& stage, const std::string& provider,
              std::vector<std::string> args) {
  std::vector<std::string> argv = {StageBinary(stage)};
  for (auto& a : ProviderArgs(provider)) argv.push_back(a);
  for (auto& a : args) argv.push_back(a);
  return RunToEnd(argv, 30s);
}

class Messages : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  std::string stage() const { return std::get<0>(GetParam()); }
  std::string provider() const { return std::get<1>(GetParam()); }
  bool reverses() const { return stage() == "02_bidirectional"; }
};

TEST_P(Messages, OneClientIsServed) {
  Server server(stage(), provider(), 1);
  ASSERT_FALSE(server.address.empty()) << "the server published no address";
  Result client = Client(stage(), provider(), {server.address, "Hello, RDMA!"});
  EXPECT_EQ(client.exit_code, 0) << client.err;
  if (reverses()) {
    EXPECT_NE(client.out.find("answer: !AMDR ,olleH\n"), std::string::npos) << client.out;
  }
  Result done = server.process->Wait(20s);
  EXPECT_EQ(done.exit_code, 0) << done.err;
  const std::string want = reverses() ? "client 0: Hello, RDMA!\n" : "received 12 bytes: Hello, RDMA!\n";
  EXPECT_NE(done.out.find(want), std::string::npos) << done.out;
  EXPECT_NE(done.out.find("served 1 clients"), std::string::npos) << done.out;
}

TEST_P(Messages, ThreeClientsOneAfterAnother) {
  Server server(stage(), provider(), 3);
  ASSERT_FALSE(server.address.empty());
  const std::string texts[] = {"first", "second message", "3"};
  for (const auto& text : texts) {
    Result client = Client(stage(), provider(), {server.address, text});
    ASSERT_EQ(client.exit_code, 0) << client.err;
    if (reverses()) {
      EXPECT_NE(client.out.find("answer: " + std::string(text.rbegin(), text.rend()) + "\n"),
                std::string::npos)
          << client.out;
    }
  }
  Result done = server.process->Wait(20s);
  EXPECT_EQ(done.exit_code, 0) << done.err;
  size_t at = 0;
  for (const auto& text : texts) {  // in the order they were sent
    at = done.out.find(": " + text + "\n", at);
    EXPECT_NE(at, std::string::npos) << "missing '" << text << "' in:\n" << done.out;
  }
  EXPECT_NE(done.out.find("served 3 clients"), std::string::npos);
}

TEST_P(Messages, ServerStopsCleanlyOnSigterm) {
  Server server(stage(), provider(), 0);
  ASSERT_FALSE(server.address.empty());
  server.process->Signal(SIGTERM);
  Result done = server.process->Wait(10s);
  EXPECT_FALSE(done.timed_out);
  EXPECT_EQ(done.exit_code, 0) << done.err;
  EXPECT_NE(done.out.find("served 0 clients"), std::string::npos);
  EXPECT_EQ(done.err, "");  // no handle failed to close
}

TEST_P(Messages, ClientWithoutServerGivesUpInBoundedTime) {
  // A well-formed address of a server that does not exist.
  Server server(stage(), provider(), 0);
  ASSERT_FALSE(server.address.empty());
  const std::string address = server.address;
  server.process->Signal(SIGKILL);
  server.process->Wait(5s);
  const auto start = std::chrono::steady_clock::now();
  Result client = Client(stage(), provider(), {"--timeout", "2", address});
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(client.exit_code, 1) << client.out << client.err;
  EXPECT_NE(client.err.find("server"), std::string::npos) << client.err;
  EXPECT_LT(took, 8.0);
}

INSTANTIATE_TEST_SUITE_P(Stages, Messages,
                         ::testing::Combine(::testing::Values("01_send_recv", "02_bidirectional"),
                                            ::testing::Values("shm", "tcp")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

}  // namespace
