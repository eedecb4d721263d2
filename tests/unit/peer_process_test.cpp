// What a server can see of a peer's process (common/peer_process.hpp), on real processes and
// real sockets: an shm address's pid, a running, stopped, dead-unreaped and reaped process,
// and a loopback TCP connection open, then closed by its peer.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "peer_process.hpp"

namespace {

using common::PeerProcess;

std::vector<uint8_t> Bytes(const std::string& s) {
  std::vector<uint8_t> b(s.begin(), s.end());
  b.push_back(0);
  return b;
}

TEST(PeerProcess, ShmAddressesNameTheirPid) {
  EXPECT_EQ(common::ShmPidOf(Bytes("fi_shm://27296:0:2")), 27296);  // libfabric 1.17 and 2.6
  EXPECT_EQ(common::ShmPidOf(Bytes("27296:0:2")), 27296);           // without the scheme
  EXPECT_EQ(common::ShmPidOf(Bytes("fi_shm://server")), 0);         // a name of one's own
  EXPECT_EQ(common::ShmPidOf(Bytes("12345")), 0);                   // no ':' after the digits
  EXPECT_EQ(common::ShmPidOf({}), 0);
}

// Polls until `want` or 5 s: a signal's effect is seen by /proc a moment later.
PeerProcess Await(int pid, PeerProcess want) {
  PeerProcess seen = common::ProcessState(pid);
  for (int i = 0; i < 500 && seen != want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    seen = common::ProcessState(pid);
  }
  return seen;
}

TEST(PeerProcess, RunningStoppedAndGoneAreToldApart) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (;;) pause();
  }
  EXPECT_EQ(Await(child, PeerProcess::kRunning), PeerProcess::kRunning);  // sleeping is running
  kill(child, SIGSTOP);
  EXPECT_EQ(Await(child, PeerProcess::kStopped), PeerProcess::kStopped);
  kill(child, SIGCONT);
  EXPECT_EQ(Await(child, PeerProcess::kRunning), PeerProcess::kRunning);
  kill(child, SIGKILL);
  EXPECT_EQ(Await(child, PeerProcess::kGone), PeerProcess::kGone);  // a zombie is gone
  waitpid(child, nullptr, 0);
  EXPECT_EQ(common::ProcessState(child), PeerProcess::kGone);  // reaped
  EXPECT_EQ(common::ProcessState(0), PeerProcess::kUnknown);
}

TEST(PeerProcess, ATcpPeerIsThereWhileItsConnectionIsOpen) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&at), sizeof(at)), 0);
  socklen_t len = sizeof(at);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&at), &len), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  const std::vector<uint8_t> address(reinterpret_cast<uint8_t*>(&at),
                                     reinterpret_cast<uint8_t*>(&at) + sizeof(at));
  EXPECT_EQ(common::TcpConnectionTo(address), common::TcpPeer::kNone);  // listening: none
  const int ours = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(ours, reinterpret_cast<sockaddr*>(&at), sizeof(at)), 0);
  const int theirs = accept(listener, nullptr, nullptr);
  ASSERT_GE(theirs, 0);
  EXPECT_EQ(common::TcpConnectionTo(address), common::TcpPeer::kAnswering);
  close(theirs);  // the peer's process ends: the kernel closes its end
  bool open = true;
  for (int i = 0; i < 500 && open; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    open = common::TcpConnectionTo(address) != common::TcpPeer::kNone;
  }
  EXPECT_FALSE(open);
  close(ours);
  close(listener);
}

}  // namespace
