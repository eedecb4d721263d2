// The NICs' own counters (common/nic_counters.hpp) on fixture trees: an efa device named as
// libfabric names its domain (rdmap79s0-rdm), a netdev, shm without any; bytes since Start.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "nic_counters.hpp"

using namespace common;
namespace fs = std::filesystem;

namespace {

struct Tree {
  Tree() {
    char pattern[] = "/tmp/nic-counters-XXXXXX";
    root = mkdtemp(pattern);
  }
  ~Tree() { fs::remove_all(root); }
  void Set(const std::string& path, uint64_t value) {
    fs::create_directories((fs::path(root) / path).parent_path());
    std::ofstream(fs::path(root) / path) << value << "\n";
  }
  std::string root;
};

}  // namespace

TEST(WireBytes, EfaAndNetdevCountersSinceStart) {
  Tree t;
  const std::string efa = "sys/class/infiniband/rdmap79s0/ports/1/hw_counters/";
  t.Set(efa + "rdma_write_recv_bytes", 1000);
  t.Set(efa + "rdma_write_bytes", 7);
  t.Set("sys/class/net/mcb2/statistics/rx_bytes", 50);
  EXPECT_EQ(WireCounterPath("rdmap79s0-rdm", WireDirection::kReceived, t.root),
            t.root + "/" + efa + "rdma_write_recv_bytes");
  EXPECT_EQ(WireCounterPath("rdmap79s0-rdm", WireDirection::kSent, t.root),
            t.root + "/" + efa + "rdma_write_bytes");
  EXPECT_EQ(WireCounterPath("mcb2", WireDirection::kReceived, t.root),
            t.root + "/sys/class/net/mcb2/statistics/rx_bytes");
  EXPECT_EQ(WireCounterPath("shm", WireDirection::kReceived, t.root), "");

  WireBytes wire({"rdmap79s0-rdm", "mcb2", "mcb2", "shm"}, WireDirection::kReceived, t.root);
  EXPECT_FALSE(wire.empty());
  wire.Start();
  t.Set(efa + "rdma_write_recv_bytes", 1000 + 65536);
  t.Set("sys/class/net/mcb2/statistics/rx_bytes", 50 + 4096);
  const auto bytes = wire.Bytes();
  ASSERT_EQ(bytes.size(), 2u);  // shm has no counter; mcb2 once for its two lanes
  EXPECT_EQ(bytes.at("rdmap79s0-rdm"), 65536u);
  EXPECT_EQ(bytes.at("mcb2"), 4096u);
  EXPECT_TRUE(WireBytes({"shm"}, WireDirection::kSent, t.root).empty());
}

// Only efa's hw_counters count the device's RDMA WRITEs alone; a netdev counts every byte.
TEST(NicCounters, DeviceWritesOnlyWhereTheDeviceCountsThem) {
  const auto root = std::filesystem::temp_directory_path() / "nic_counters_device_writes";
  std::filesystem::create_directories(root / "sys/class/infiniband/rdmap79s0/ports/1/hw_counters");
  std::ofstream(root / "sys/class/infiniband/rdmap79s0/ports/1/hw_counters/rdma_write_recv_bytes")
      << "0\n";
  std::filesystem::create_directories(root / "sys/class/net/mcb0/statistics");
  std::ofstream(root / "sys/class/net/mcb0/statistics/rx_bytes") << "0\n";
  EXPECT_TRUE(CountsDeviceWrites("rdmap79s0-rdm", root.string()));
  EXPECT_FALSE(CountsDeviceWrites("mcb0", root.string()));
  EXPECT_FALSE(CountsDeviceWrites("shm", root.string()));
  std::filesystem::remove_all(root);
}

// Retransmitted bytes: efa devices that count them (retrans_bytes), nothing from a netdev or
// from an efa device of a type without that counter.
TEST(WireBytes, RetransmittedOnlyWhereTheDeviceCountsThem) {
  Tree t;
  const std::string efa = "sys/class/infiniband/rdmap79s0/ports/1/hw_counters/";
  t.Set(efa + "retrans_bytes", 10);
  t.Set("sys/class/infiniband/rdmap80s0/ports/1/hw_counters/rdma_write_bytes", 0);
  t.Set("sys/class/net/mcb2/statistics/tx_bytes", 50);
  EXPECT_EQ(WireCounterPath("rdmap79s0-rdm", WireDirection::kRetransmitted, t.root),
            t.root + "/" + efa + "retrans_bytes");
  EXPECT_EQ(WireCounterPath("rdmap80s0-rdm", WireDirection::kRetransmitted, t.root), "");
  EXPECT_EQ(WireCounterPath("mcb2", WireDirection::kRetransmitted, t.root), "");
  WireBytes resent({"rdmap79s0-rdm", "rdmap80s0-rdm", "mcb2"}, WireDirection::kRetransmitted,
                   t.root);
  resent.Start();
  t.Set(efa + "retrans_bytes", 10 + 8192);
  const auto bytes = resent.Bytes();
  ASSERT_EQ(bytes.size(), 1u);
  EXPECT_EQ(bytes.at("rdmap79s0-rdm"), 8192u);
}

// A NIC's link as its kernel states it: efa's port state, a netdev's operstate; nothing for
// shm, a netdev that does not say (lo: "unknown") or a name that is not there.
TEST(NicLink, EfaPortStateAndNetdevOperstate) {
  Tree t;
  const auto state = [&](const std::string& path, const std::string& text) {
    fs::create_directories((fs::path(t.root) / path).parent_path());
    std::ofstream(fs::path(t.root) / path) << text << "\n";
  };
  state("sys/class/infiniband/rdmap79s0/ports/1/state", "4: ACTIVE");
  state("sys/class/infiniband/rdmap80s0/ports/1/state", "1: DOWN");
  state("sys/class/net/mcb1/operstate", "up");
  state("sys/class/net/mcb2/operstate", "down");
  state("sys/class/net/mcb3/operstate", "lowerlayerdown");
  state("sys/class/net/lo/operstate", "unknown");
  EXPECT_EQ(LinkUp("rdmap79s0-rdm", t.root), std::optional<bool>(true));
  EXPECT_EQ(LinkUp("rdmap80s0-rdm", t.root), std::optional<bool>(false));
  EXPECT_EQ(LinkUp("mcb1", t.root), std::optional<bool>(true));
  EXPECT_EQ(LinkUp("mcb2", t.root), std::optional<bool>(false));
  EXPECT_EQ(LinkUp("mcb3", t.root), std::optional<bool>(false));
  EXPECT_EQ(LinkUp("lo", t.root), std::nullopt);
  EXPECT_EQ(LinkUp("shm", t.root), std::nullopt);
  EXPECT_EQ(LinkUp("mcb9", t.root), std::nullopt);
}
