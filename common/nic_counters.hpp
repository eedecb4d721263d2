// What the NICs themselves counted: the bytes on the wire, read from the kernel's counters
// before and after a transfer, so that a summary can put them beside the bytes the program
// moved. A figure the program computes can be wrong; the NIC's count of what it carried is
// the check (README.md of 07, "Wire bytes"). Read under a root folder ("/" or a fixture tree).
//   efa (rdmap79s0-rdm):  /sys/class/infiniband/rdmap79s0/ports/1/hw_counters/
//                         rdma_write_bytes (the writer), rdma_write_recv_bytes (the target),
//                         retrans_bytes (what SRD sent again; devices from Nitro v4 count it)
//   a netdev (mcb2, eth0): /sys/class/net/mcb2/statistics/tx_bytes, rx_bytes
//   shm: no NIC, nothing to read.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace common {

// kRetransmitted: the bytes the sender's NIC sent again (efa only; a netdev has no such count).
enum class WireDirection { kSent, kReceived, kRetransmitted };

// The counter file of a libfabric domain's NIC for WRITEs in one direction (or those sent
// again), or "" where it has none (shm, or nothing under `root` for that name).
std::string WireCounterPath(const std::string& domain, WireDirection direction,
                            const std::string& root = "/");

// Whether that counter counts only the WRITEs the device itself carried (efa's
// rdma_write_recv_bytes), not every byte the NIC received (a netdev's rx_bytes).
bool CountsDeviceWrites(const std::string& domain, const std::string& root = "/");

// Whether a libfabric domain's NIC has its link up, as its kernel says: an efa device's
// ports/1/state ("4: ACTIVE"), a netdev's operstate ("up"); nullopt where nothing says
// (shm, a netdev in state "unknown" such as lo, no such NIC under `root`). A lane whose NIC
// is down is named as such when WRITEs stop (07's client), not guessed from timing.
std::optional<bool> LinkUp(const std::string& domain, const std::string& root = "/");

// A set of NICs' counters, read at Start() and again by Bytes(): bytes since Start, per NIC
// (by domain name, each once however many lanes share it). NICs without a counter are left out.
class WireBytes {
 public:
  WireBytes(const std::vector<std::string>& domains, WireDirection direction,
            const std::string& root = "/");
  void Start();
  std::map<std::string, uint64_t> Bytes() const;
  bool empty() const { return paths_.empty(); }

 private:
  std::map<std::string, std::string> paths_;  // domain -> counter file
  std::map<std::string, uint64_t> start_;
};

}  // namespace common
