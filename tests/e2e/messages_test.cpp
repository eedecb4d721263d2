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

class Messages : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  std::string stage() const { return std::get<0>(GetParam()); }
  std::string provider() const { return std::get<1>(GetParam()); }
  bool reverses() const { return stage() == "02_bidirectional"; }
};

TEST_P(Messages, OneClientIsServed) {
  StageServer server(stage(), provider(), 1);
  ASSERT_FALSE(server.address().empty()) << "the server published no address";
  Result client = RunClient(stage(), provider(), server.address(), {"Hello, RDMA!"});
  EXPECT_EQ(client.exit_code, 0) << client.err;
  if (reverses()) {
    EXPECT_NE(client.out.find("answer: !AMDR ,olleH\n"), std::string::npos) << client.out;
  }
  Result done = server.Wait(20s);
  EXPECT_EQ(done.exit_code, 0) << done.err;
  const std::string want =
      reverses() ? "client 0: Hello, RDMA!\n" : "received 12 bytes: Hello, RDMA!\n";
  EXPECT_NE(done.out.find(want), std::string::npos) << done.out;
  EXPECT_NE(done.out.find("served 1 client"), std::string::npos) << done.out;
}

TEST_P(Messages, ThreeClientsOneAfterAnother) {
  StageServer server(stage(), provider(), 3);
  ASSERT_FALSE(server.address().empty());
  const std::string texts[] = {"first", "second message", "3"};
  for (const auto& text : texts) {
    Result client = RunClient(stage(), provider(), server.address(), {text});
    ASSERT_EQ(client.exit_code, 0) << client.err;
    if (reverses()) {
      EXPECT_NE(client.out.find("answer: " + std::string(text.rbegin(), text.rend()) + "\n"),
                std::string::npos)
          << client.out;
    }
  }
  Result done = server.Wait(20s);
  EXPECT_EQ(done.exit_code, 0) << done.err;
  size_t at = 0;
  for (const auto& text : texts) {  // in the order they were sent
    at = done.out.find(": " + text + "\n", at);
    EXPECT_NE(at, std::string::npos) << "missing '" << text << "' in:\n" << done.out;
  }
  EXPECT_NE(done.out.find("served 3 clients"), std::string::npos);
}

TEST_P(Messages, ServerStopsCleanlyOnSigterm) {
  StageServer server(stage(), provider(), 0);
  ASSERT_FALSE(server.address().empty());
  server.process().Signal(SIGTERM);
  Result done = server.Wait(10s);
  EXPECT_FALSE(done.timed_out);
  EXPECT_EQ(done.exit_code, 0) << done.err;
  EXPECT_NE(done.out.find("served 0 clients"), std::string::npos);
  EXPECT_EQ(done.err, "");  // no handle failed to close
}

TEST_P(Messages, ClientWithoutServerGivesUpInBoundedTime) {
  // A well-formed address of a server that does not exist.
  StageServer server(stage(), provider(), 0);
  ASSERT_FALSE(server.address().empty());
  const std::string address = server.address();
  server.process().Signal(SIGKILL);
  server.Wait(5s);
  const auto start = std::chrono::steady_clock::now();
  Result client = RunClient(stage(), provider(), address, {"--timeout", "2"});
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(client.exit_code, 1) << client.out << client.err;
  EXPECT_NE(client.err.find("server"), std::string::npos) << client.err;
  // Its --timeout of 2 s, plus starting libfabric and closing a tcp endpoint whose peer is
  // gone: about 5 s in all over tcp on this 2-core machine, 9.4 s once with it loaded.
  EXPECT_LT(took, 20.0);
}

INSTANTIATE_TEST_SUITE_P(Stages, Messages,
                         ::testing::Combine(::testing::Values("01_send_recv", "02_bidirectional"),
                                            ::testing::Values("shm", "tcp")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

}  // namespace
