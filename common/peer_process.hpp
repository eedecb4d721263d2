// What this host can see of a peer's process, to tell a slow peer from a dead one: silence
// alone cannot (a peer stopped by Ctrl-Z, a debugger or an overloaded host is silent too).
//   shm: the peer's pid is in its address ("fi_shm://PID:..."), and /proc says whether that
//        process runs, is stopped, or is gone (or a zombie).
//   tcp: the kernel closes a dead process's sockets, so a peer with no established connection
//        from us to its address is gone; one with a connection is there, if silent (a process
//        that stops reading still has its kernel answer, with a zero window), unless our
//        kernel's retransmissions to it go unanswered: its host or link is gone.
//   elsewhere (efa): nothing to see; a dead peer's WRITEs fail, and silence is all there is.
#pragma once

#include <rdma/fabric.h>

#include <cstdint>
#include <span>

namespace common {

enum class PeerProcess { kUnknown, kRunning, kStopped, kConnected, kUnanswered, kGone };
// "its process runs", "its process is stopped by a signal", "its connection is open", ...
const char* Describe(PeerProcess state);
// The process behind `address`, an address of `info`'s provider.
PeerProcess SeePeerProcess(const fi_info& info, std::span<const uint8_t> address);
// The pieces, for the tests: a pid named by an shm address (0 if none), a pid's state, and
// whether this network namespace has an established TCP connection to a sockaddr.
int ShmPidOf(std::span<const uint8_t> address);
PeerProcess ProcessState(int pid);
enum class TcpPeer { kNone, kAnswering, kUnanswered };
TcpPeer TcpConnectionTo(std::span<const uint8_t> sockaddr);

}  // namespace common
