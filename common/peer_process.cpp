#include "peer_process.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace common {

const char* Describe(PeerProcess state) {
  switch (state) {
    case PeerProcess::kRunning:
      return "its process runs";
    case PeerProcess::kStopped:
      return "its process is stopped by a signal";
    case PeerProcess::kConnected:
      return "its connection is open";
    case PeerProcess::kUnanswered:
      return "its host does not answer: our TCP retransmissions to it go unanswered";
    case PeerProcess::kGone:
      return "it is gone";
    case PeerProcess::kUnknown:
      break;
  }
  return "unknown to this host";
}

int ShmPidOf(std::span<const uint8_t> address) {
  std::string name(address.begin(), address.end());
  name = name.c_str();  // up to its NUL
  if (name.rfind("fi_shm://", 0) == 0) name.erase(0, 9);
  int pid = 0;
  size_t digits = 0;
  for (; digits < name.size() && name[digits] >= '0' && name[digits] <= '9' && digits < 9; ++digits)
    pid = pid * 10 + (name[digits] - '0');
  return digits > 0 && digits < name.size() && name[digits] == ':' ? pid : 0;
}

// proc(5): the state follows the command name, which may hold spaces and parentheses.
PeerProcess ProcessState(int pid) {
  if (pid <= 0) return PeerProcess::kUnknown;
  std::string stat;
  std::getline(std::ifstream("/proc/" + std::to_string(pid) + "/stat"), stat);
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return PeerProcess::kGone;
  switch (stat[paren + 2]) {
    case 'Z':
    case 'X':
      return PeerProcess::kGone;  // dead, not yet reaped
    case 'T':
    case 't':
      return PeerProcess::kStopped;
    default:
      return PeerProcess::kRunning;
  }
}

namespace {

// /proc/net/tcp{,6} print each address as the 32-bit words of its network-order bytes, each
// word in host order, then ':' and the port; state 01 is ESTABLISHED.
std::string ProcHex(const uint8_t* bytes, size_t n, uint16_t port_network) {
  std::string text;
  char word[9];
  for (size_t i = 0; i < n; i += 4) {
    uint32_t w;
    std::memcpy(&w, bytes + i, 4);
    std::snprintf(word, sizeof(word), "%08X", w);
    text += word;
  }
  char port[6];
  std::snprintf(port, sizeof(port), ":%04X", ntohs(port_network));
  return text + port;
}
// A connection's `tr` field is the timer running (proc(5) /proc/net/tcp): 1 is the
// retransmission timer, and `retrnsmt` (hex) counts its expiries without an answer; 4 is the
// zero-window probe of a peer that reads nothing, and the `timeout` column (decimal, the
// kernel's icsk_probes_out) counts the probes left unanswered: a stopped reader's kernel
// answers each, so it stays 0. Past kUnanswered of either (backoff doubling from 200 ms: over
// a second) the peer's host or link no longer answers, whatever its window was when it went.
constexpr unsigned long kUnanswered = 3;
TcpPeer Established(const char* table, const std::string& remote) {
  std::ifstream file(table);
  std::string line, slot, local, peer, state, queues, timer, expiries, uid, probes;
  std::getline(file, line);  // the header
  TcpPeer found = TcpPeer::kNone;
  while (std::getline(file, line)) {
    std::istringstream fields(line);
    if (!(fields >> slot >> local >> peer >> state >> queues >> timer >> expiries >> uid >>
          probes) ||
        peer != remote || state != "01")
      continue;
    unsigned long unanswered = 0;
    if (timer.rfind("01:", 0) == 0) unanswered = std::stoul(expiries, nullptr, 16);
    if (timer.rfind("04:", 0) == 0) unanswered = std::stoul(probes, nullptr, 10);
    if (unanswered < kUnanswered) return TcpPeer::kAnswering;
    found = TcpPeer::kUnanswered;
  }
  return found;
}

}  // namespace

TcpPeer TcpConnectionTo(std::span<const uint8_t> address) {
  if (address.size() >= sizeof(sockaddr_in6) &&
      reinterpret_cast<const sockaddr*>(address.data())->sa_family == AF_INET6) {
    sockaddr_in6 a{};
    std::memcpy(&a, address.data(), sizeof(a));
    return Established("/proc/self/net/tcp6", ProcHex(a.sin6_addr.s6_addr, 16, a.sin6_port));
  }
  if (address.size() < sizeof(sockaddr_in)) return TcpPeer::kNone;
  sockaddr_in a{};
  std::memcpy(&a, address.data(), sizeof(a));
  if (a.sin_family != AF_INET) return TcpPeer::kNone;
  return Established("/proc/self/net/tcp",
                     ProcHex(reinterpret_cast<const uint8_t*>(&a.sin_addr), 4, a.sin_port));
}

PeerProcess SeePeerProcess(const fi_info& info, std::span<const uint8_t> address) {
  const std::string provider = info.fabric_attr->prov_name;
  if (provider == "shm") return ProcessState(ShmPidOf(address));
  if (provider.rfind("tcp", 0) == 0) {  // "tcp" (2.x) and "tcp;ofi_rxm"
    switch (TcpConnectionTo(address)) {
      case TcpPeer::kAnswering:
        return PeerProcess::kConnected;
      case TcpPeer::kUnanswered:
        return PeerProcess::kUnanswered;
      case TcpPeer::kNone:
        return PeerProcess::kGone;
    }
  }
  return PeerProcess::kUnknown;
}

}  // namespace common
