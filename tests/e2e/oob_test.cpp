// The address out of band (common/oob.hpp): a server with --oob-port PORT gives its address on
// that TCP port, a client with --oob-port PORT HOST takes it from there, waiting for a server
// that is still starting. All on loopback.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "process.hpp"

using namespace testing_support;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

// A TCP socket of the test's own on 127.0.0.1, listening on a port the kernel chose.
struct Listener {
  int fd = -1;
  uint16_t port = 0;
  Listener() {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof a;
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), size) != 0 || listen(fd, 4) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &size) != 0)
      ADD_FAILURE() << "no listening socket for the test";
    port = ntohs(a.sin_port);
  }
  ~Listener() { close(fd); }
};

// A port nothing listens on (the kernel's choice, given back).
std::string FreePort() {
  Listener l;
  return std::to_string(l.port);
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::vector<std::string> Client(const std::string& port) {
  std::vector<std::string> argv = {StageBinary("07_full_p5"), "-p", "shm", "--memory", "host"};
  for (const char* a : {"--pages", "16", "--requests", "1", "-S", "4k", "--timeout", "30"})
    argv.push_back(a);
  for (const std::string& a : {std::string("--oob-port"), port, std::string("127.0.0.1")})
    argv.push_back(a);
  return argv;
}

}  // namespace

// The client starts first and waits; the server comes up a second later on that port; the
// client takes its address from there and verifies every page. No file, no sleep in a recipe.
TEST(OutOfBand, ClientWaitsForTheServerAndTakesItsAddress) {
  const std::string port = FreePort();
  Process client(Client(port));
  std::this_thread::sleep_for(1s);
  Process server({StageBinary("07_full_p5"), "-p", "shm", "--memory", "host", "--oob-port", port,
                  "--exit-after", "1"});
  Result r = client.Wait(60s);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err << server.Output();
  EXPECT_EQ(NumberAfter(r.out, "verified "), 16 * 4096) << r.out;
  Result s = server.Wait(30s);
  EXPECT_EQ(s.exit_code, 0) << s.out << s.err;
  EXPECT_NE(s.out.find("oob: the address is given on TCP port " + port), std::string::npos)
      << s.out;
}

// Whatever goes wrong is said in one line: nothing answering within --timeout (exit 1), an
// answer that is no address (exit 1), a port the server cannot have or that is no port (2).
TEST(OutOfBand, EachFailureIsSaidInOneLine) {
  auto start = Clock::now();
  Result none = RunToEnd({StageBinary("07_full_p5"), "-p", "shm", "--oob-port", FreePort(),
                          "127.0.0.1", "--timeout", "1"},
                         30s);
  EXPECT_EQ(none.exit_code, 1) << none.out << none.err;
  EXPECT_NE(none.err.find("no address from 127.0.0.1 port "), std::string::npos) << none.err;
  EXPECT_LT(SecondsSince(start), 10.0);

  Listener liar;  // answers "hello" to whoever connects
  std::thread answer([&] {
    const int peer = accept(liar.fd, nullptr, nullptr);
    if (peer < 0) return;
    [[maybe_unused]] ssize_t n = write(peer, "hello\n", 6);
    close(peer);
  });
  const std::string port = std::to_string(liar.port);
  Result lie = RunToEnd(Client(port), 30s);
  answer.join();
  EXPECT_EQ(lie.exit_code, 1) << lie.out << lie.err;
  EXPECT_NE(lie.err.find("answered something that is not an address: 'hello'"), std::string::npos)
      << lie.err;

  Result taken = RunToEnd(
      {StageBinary("05_queuing"), "-p", "shm", "--memory", "host", "--oob-port", port}, 30s);
  EXPECT_EQ(taken.exit_code, 2) << taken.out << taken.err;
  EXPECT_NE(taken.err.find("--oob-port " + port + ": Address already in use"), std::string::npos)
      << taken.err;
  EXPECT_EQ(taken.out.find("addr: "), std::string::npos) << taken.out;

  for (const char* bad : {"0", "65536", "x"}) {
    Result r = RunToEnd({StageBinary("03_gpudirect_write"), "--oob-port", bad}, 10s);
    EXPECT_EQ(r.exit_code, 2) << bad << r.err;
    EXPECT_NE(r.err.find("invalid --oob-port '" + std::string(bad) + "'"), std::string::npos)
        << r.err;
  }
}
