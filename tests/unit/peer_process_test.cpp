// What a server can see of a peer's process (common/peer_process.hpp), on real processes and
// real sockets: an shm address's pid, a running, stopped, dead-unreaped and reaped process,
// a loopback TCP connection open, then closed by its peer, and (as root, in a network
// namespace of its own) one whose peer's link goes, with data in flight or a zero window.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
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

// The peer's link goes (loopback down, in a namespace of the child's own) while our side has
// bytes for it: with its window open they are retransmitted, with its window at zero (a
// reader that had stopped reading) the kernel probes it; neither is answered, and either way
// the peer is seen as unanswered within seconds (not as a stopped reader's open connection).
// The child's exit code: 0 seen, 1 never seen, 2 set-up failed, 3 seen before the link went,
// 4 no network namespace of its own here (a container without CAP_SYS_ADMIN, no iproute2).
int LinkGoesWith(bool zero_window) {
  if (unshare(CLONE_NEWNET) != 0 || std::system("ip link set lo up >/dev/null 2>&1") != 0) return 4;
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  const int small = 4096;
  setsockopt(listener, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));  // inherited
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(at);
  if (bind(listener, reinterpret_cast<sockaddr*>(&at), sizeof(at)) != 0 || listen(listener, 1) ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&at), &len) != 0)
    return 2;
  const std::vector<uint8_t> address(reinterpret_cast<uint8_t*>(&at),
                                     reinterpret_cast<uint8_t*>(&at) + sizeof(at));
  const int ours = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(ours, reinterpret_cast<sockaddr*>(&at), sizeof(at)) != 0) return 2;
  const int theirs = accept(listener, nullptr, nullptr);  // never read: its window fills
  if (theirs < 0) return 2;
  fcntl(ours, F_SETFL, O_NONBLOCK);
  static char bytes[1 << 16];
  if (zero_window) {
    while (send(ours, bytes, sizeof(bytes), 0) > 0) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // probing, answered
    if (common::TcpConnectionTo(address) != common::TcpPeer::kAnswering) return 3;
  }
  if (std::system("ip link set lo down") != 0) return 2;
  if (!zero_window && send(ours, bytes, 1000, 0) != 1000) return 2;
  for (int i = 0; i < 150; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (common::TcpConnectionTo(address) == common::TcpPeer::kUnanswered) return 0;
  }
  return 1;
}
void ExpectUnansweredOnceTheLinkGoes(bool zero_window) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (a network namespace of its own)";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(LinkGoesWith(zero_window));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 4)
    GTEST_SKIP() << "no network namespace of its own here (unshare(CLONE_NEWNET), ip link)";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: still answering 15 s after the link went; 2: set-up "
                                       "failed; 3: not answering before it went";
}
TEST(PeerProcess, ATcpPeerWhoseLinkWentIsUnanswered) {
  ExpectUnansweredOnceTheLinkGoes(false);
}
TEST(PeerProcess, ATcpPeerWhoseLinkWentAtAZeroWindowIsUnanswered) {
  ExpectUnansweredOnceTheLinkGoes(true);
}

}  // namespace
