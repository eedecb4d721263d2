// Topology grouping on hwloc XML fixtures (tests/data/, written by make_topology_fixtures.py).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "topology.hpp"

using namespace common;

namespace {

std::string Fixture(const char* name) {
  return std::string(TEST_DATA_DIR) + "/" + name;
}

PciAddress Pci(const char* text) {
  return *PciAddress::Parse(text);
}

}  // namespace

TEST(PciAddress, ParsesAndFormats) {
  EXPECT_EQ(Pci("0000:53:00.0").Short(), "53:00.0");
  EXPECT_EQ(Pci("4f:00.0").Full(), "0000:4f:00.0");
  EXPECT_EQ(Pci("0001:c9:1f.7").Full(), "0001:c9:1f.7");
  EXPECT_FALSE(PciAddress::Parse("53:00").has_value());
  EXPECT_FALSE(PciAddress::Parse("zz:00.0").has_value());
  EXPECT_FALSE(PciAddress::Parse("53:00.0x").has_value());
  EXPECT_FALSE(PciAddress::Parse("53:20.0").has_value());  // device numbers stop at 1f
}

TEST(FormatCpuList, Ranges) {
  EXPECT_EQ(FormatCpuList({0, 1, 2, 3}), "0-3");
  EXPECT_EQ(FormatCpuList({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(FormatCpuList({5}), "5");
  EXPECT_EQ(FormatCpuList({}), "none");
}

// The published p5 table (docs/p5-facts.md): 8 groups, each with its GPU, the 4 EFA
// NICs under its switch, its NUMA node and 12 cores.
TEST(GroupDevices, P5MatchesThePublishedTable) {
  const Topology topology = Topology::FromXml(Fixture("p5.xml"));
  const char* gpu_bus[] = {"53", "64", "75", "86", "97", "a8", "b9", "ca"};
  const int first_nic_bus[] = {0x4f, 0x60, 0x71, 0x82, 0x93, 0xa4, 0xb5, 0xc6};
  std::vector<PciAddress> gpus;
  for (const char* bus : gpu_bus) gpus.push_back(Pci((std::string(bus) + ":00.0").c_str()));
  // NICs in libfabric's order, deliberately not grouped: rdmap<bus in decimal>s0.
  std::vector<NicDevice> nics;
  for (int k = 3; k >= 0; --k) {
    for (int g = 0; g < 8; ++g) {
      const int bus = first_nic_bus[g] + k;
      char pci[16];
      std::snprintf(pci, sizeof(pci), "%02x:00.0", bus);
      nics.push_back({"rdmap" + std::to_string(bus) + "s0", Pci(pci), 100});
    }
  }
  const auto groups = GroupDevices(topology, gpus, nics);
  ASSERT_EQ(groups.size(), 8u);
  EXPECT_EQ(FormatTotals(groups, nics), "GPUs: 8, NICs: 32, Total Bandwidth: 3200 Gbps");
  // A NIC of no known rate (shm, loopback) is said, not added as 0 Gbps.
  auto unknown = nics;
  unknown[0].link_gbps = 0;
  EXPECT_EQ(FormatTotals(groups, unknown),
            "GPUs: 8, NICs: 32, Total Bandwidth: 3100 Gbps and 1 NIC of unknown rate");
  for (auto& n : unknown) n.link_gbps = 0;
  EXPECT_EQ(FormatTotals(groups, unknown), "GPUs: 8, NICs: 32, Total Bandwidth: link rate unknown");
  EXPECT_EQ(FormatGroup(groups[0], nics),
            "cuda:0(53:00.0) NUMA0 CPU 0-11 rdmap82s0 (52:00.0) rdmap81s0 (51:00.0) "
            "rdmap80s0 (50:00.0) rdmap79s0 (4f:00.0)");
  const char* cpus[] = {"0-11", "12-23", "24-35", "36-47", "48-59", "60-71", "72-83", "84-95"};
  for (int g = 0; g < 8; ++g) {
    SCOPED_TRACE(g);
    EXPECT_EQ(groups[g].gpu, g);
    EXPECT_EQ(groups[g].numa, g < 4 ? 0 : 1);
    EXPECT_EQ(FormatCpuList(groups[g].cpus), cpus[g]);
    ASSERT_EQ(groups[g].nics.size(), 4u);
    std::vector<int> buses;
    for (size_t n : groups[g].nics) buses.push_back(nics[n].pci->bus);
    std::sort(buses.begin(), buses.end());
    for (int k = 0; k < 4; ++k) EXPECT_EQ(buses[k], first_nic_bus[g] + k);
  }
}

// One process per GPU (CUDA_VISIBLE_DEVICES=3, a one-GPU pod, --gpus 3): GPU 3 with the 4 NICs
// under its switch and none of the 28 under the other GPUs', which are their processes'. Its
// CUDA index is the one given. The totals count what it uses: 400 Gbps, not 3200.
TEST(GroupDevices, OneGpuOfAP5UsesItsOwnNicsOnly) {
  const Topology topology = Topology::FromXml(Fixture("p5.xml"));
  std::vector<NicDevice> nics;
  for (const PciAddress& pci : NicsOf(topology)) nics.push_back({"efa", pci, 100});
  const std::vector<PciAddress> seen = VisibleOf(GpusOf(topology), "3");
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].Short(), "86:00.0");
  const auto groups = GroupDevices(topology, seen, nics, {0});
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].gpu, 0);
  EXPECT_EQ(FormatTotals(groups, nics), "GPUs: 1, NICs: 4, Total Bandwidth: 400 Gbps");
  std::vector<int> buses;
  for (size_t n : groups[0].nics) buses.push_back(nics[n].pci->bus);
  EXPECT_EQ(buses, (std::vector<int>{0x82, 0x83, 0x84, 0x85}));
  // Two of the eight by --gpus, each with its own four, under the indices given.
  const auto two = GroupDevices(topology, {GpusOf(topology)[1], GpusOf(topology)[6]}, nics, {1, 6});
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].gpu, 1);
  EXPECT_EQ(two[1].gpu, 6);
  EXPECT_EQ(FormatTotals(two, nics), "GPUs: 2, NICs: 8, Total Bandwidth: 800 Gbps");
  // NICs of no switch (shm, veth) are anyone's: dealt to the GPU used, as before.
  const auto veth = GroupDevices(topology, seen, {{"veth0", std::nullopt, 1}, nics[0]});
  ASSERT_EQ(veth.size(), 1u);
  EXPECT_EQ(FormatGroup(veth[0], {{"veth0", std::nullopt, 1}, nics[0]}),
            "cuda:0(86:00.0) NUMA0 CPU 0-47 veth0");
  // A GPU used here with no NIC of its own and nothing else to deal: it borrows the others'
  // rather than run through none.
  const auto bare = GroupDevices(topology, seen, {nics[0], nics[1]});
  ASSERT_EQ(bare.size(), 1u);
  EXPECT_EQ(bare[0].nics.size(), 2u);
}

// CUDA_VISIBLE_DEVICES as CUDA reads it, for a rehearsal: indices in the order given, up to
// the first that is not one; UUIDs (which a topology file cannot resolve) or unset: all.
TEST(Topology, VisibleGpusOfARehearsal) {
  const std::vector<PciAddress> gpus = {Pci("10:00.0"), Pci("20:00.0"), Pci("30:00.0")};
  EXPECT_EQ(VisibleOf(gpus, nullptr).size(), 3u);
  EXPECT_EQ(VisibleOf(gpus, "").size(), 3u);
  const auto two = VisibleOf(gpus, "2,0");
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].Short(), "30:00.0");
  EXPECT_EQ(two[1].Short(), "10:00.0");
  EXPECT_EQ(VisibleOf(gpus, "1,7,0").size(), 1u);  // CUDA stops at an index it has not
  EXPECT_EQ(VisibleOf(gpus, "GPU-8f6e1c2a-0000-0000-0000-000000000000").size(), 3u);
  EXPECT_TRUE(VisibleOf(gpus, "5").empty());
}

// The odd machine: GPU 1's switch has no NIC, and one NIC is on no switch at all. Documented
// answer (topology.hpp): NICs that share no switch with a GPU go to the group with the fewest
// NICs, preferring their NUMA node, then the lowest GPU index; NICs without PCI likewise.
TEST(GroupDevices, OddMachineHasADocumentedAnswer) {
  const Topology topology = Topology::FromXml(Fixture("odd.xml"));
  const std::vector<PciAddress> gpus = {Pci("15:00.0"), Pci("24:00.0")};
  const std::vector<NicDevice> nics = {{"nic13", Pci("13:00.0"), 100},
                                       {"orphan", Pci("30:00.0"), 100},
                                       {"nic14", Pci("14:00.0"), 100},
                                       {"veth0", std::nullopt, 1},
                                       {"veth1", std::nullopt, 1}};
  const auto groups = GroupDevices(topology, gpus, nics);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(FormatGroup(groups[0], nics),
            "cuda:0(15:00.0) NUMA0 CPU 0-3 nic13 (13:00.0) nic14 (14:00.0) veth1");
  EXPECT_EQ(FormatGroup(groups[1], nics), "cuda:1(24:00.0) NUMA0 CPU 4-7 orphan (30:00.0) veth0");
}

TEST(GroupDevices, WithoutGpuOneHostGroupPerNumaNode) {
  const Topology topology = Topology::FromXml(Fixture("p5.xml"));
  std::vector<NicDevice> nics = {{"mca0", std::nullopt, 1},
                                 {"mca1", std::nullopt, 1},
                                 {"mca2", std::nullopt, 1},
                                 {"rdmap79s0", Pci("4f:00.0"), 100}};
  const auto groups = GroupDevices(topology, {}, nics);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_FALSE(groups[0].gpu.has_value());
  EXPECT_EQ(FormatCpuList(groups[0].cpus), "0-47");
  EXPECT_EQ(FormatCpuList(groups[1].cpus), "48-95");
  // Round-robin: mca0 -> 0, mca1 -> 1, mca2 -> 0; the EFA NIC prefers its NUMA node 0 but
  // node 0 has more NICs, so it goes to 1.
  EXPECT_EQ(FormatGroup(groups[0], nics), "host NUMA0 CPU 0-47 mca0 mca2");
  EXPECT_EQ(FormatGroup(groups[1], nics), "host NUMA1 CPU 48-95 mca1 rdmap79s0 (4f:00.0)");
}

TEST(GroupDevices, ThisMachineLoads) {
  const Topology topology = Topology::Load();
  const auto groups = GroupDevices(topology, {}, {{"lo", std::nullopt, 0}});
  ASSERT_GE(groups.size(), 1u);
  EXPECT_FALSE(groups[0].cpus.empty());
  EXPECT_EQ(groups[0].nics.size() + (groups.size() > 1 ? groups[1].nics.size() : 0), 1u);
}

TEST(Topology, BadXmlIsAnError) {
  EXPECT_THROW(Topology::FromXml("/nonexistent.xml"), std::exception);
}

// A rehearsal of the p5 (07 --topology tests/data/p5.xml) finds its 8 GPUs and 32 EFA NICs
// in PCI order, and knows the file is not this machine (binding with it means nothing here).
TEST(Topology, DevicesOfAnotherMachine) {
  const Topology p5 = Topology::FromXml(Fixture("p5.xml"));
  EXPECT_FALSE(IsThisSystem(p5));
  EXPECT_TRUE(IsThisSystem(Topology::Load()));
  const auto gpus = GpusOf(p5);
  ASSERT_EQ(gpus.size(), 8u);
  EXPECT_EQ(gpus.front().Short(), "53:00.0");
  EXPECT_EQ(gpus.back().Short(), "ca:00.0");
  const auto nics = NicsOf(p5);
  ASSERT_EQ(nics.size(), 32u);
  EXPECT_EQ(nics.front().Short(), "4f:00.0");
  EXPECT_EQ(nics[4].Short(), "60:00.0");  // cuda:1's first
  EXPECT_EQ(nics.back().Short(), "c9:00.0");
}

// The cores rule (docs/architecture.md, "Cores"): data threads on their group's cores among
// those given, threads that only wait off the pinned ones while another core is given.
TEST(Cores, TwoCoresOneLane) {
  const std::vector<unsigned> given = {0, 1}, group = {0, 1};
  // The server's data thread takes the group's first core, its control loop the other; the
  // client's receiver takes the last, its watching thread the other.
  EXPECT_EQ(CpusWithin(group, given), group);
  EXPECT_EQ(ControlCpus(given, {0}), (std::vector<unsigned>{1}));
  EXPECT_EQ(ControlCpus(given, {1}), (std::vector<unsigned>{0}));
  // Both cores held by data threads: the waiting thread shares them (and naps).
  EXPECT_EQ(ControlCpus(given, {0, 1}), given);
  // Given one core (taskset -c 0): everything there.
  EXPECT_EQ(CpusWithin(group, {0}), (std::vector<unsigned>{0}));
  EXPECT_EQ(ControlCpus({0}, {0}), (std::vector<unsigned>{0}));
}

TEST(Cores, SixteenCoresEightThreads) {
  std::vector<unsigned> all(16);
  for (unsigned c = 0; c < 16; ++c) all[c] = c;
  const std::vector<unsigned> node1 = {8, 9, 10, 11, 12, 13, 14, 15};
  // Eight data threads on cores 0-7: the control thread gets 8-15.
  EXPECT_EQ(ControlCpus(all, {0, 1, 2, 3, 4, 5, 6, 7}), node1);
  // A group on node 1 given only cores 2-3 (taskset -c 2,3): far from its GPU, not nowhere.
  EXPECT_EQ(CpusWithin(node1, {2, 3}), (std::vector<unsigned>{2, 3}));
  // Given 8-11 of its group: those, in the group's order.
  EXPECT_EQ(CpusWithin(node1, {11, 10, 9, 8}), (std::vector<unsigned>{8, 9, 10, 11}));
  EXPECT_EQ(ControlCpus({8, 9, 10, 11}, {8, 9}), (std::vector<unsigned>{10, 11}));
}

TEST(Cores, ThisProcessIsGivenTheCoresItRunsOn) {
  const std::vector<unsigned> given = GivenCpus();
  ASSERT_FALSE(given.empty());
  std::string why;
  ASSERT_TRUE(BindThreadTo({given.back()}, why)) << why;
  EXPECT_EQ(GivenCpus(), (std::vector<unsigned>{given.back()}));
  ASSERT_TRUE(BindThreadTo(given, why)) << why;  // back where it was
  EXPECT_EQ(GivenCpus(), given);
  EXPECT_FALSE(BindThreadTo({}, why));
  EXPECT_EQ(why, "no CPU to bind to");
}

// A core held by one pinned thread is not taken by another, in this process or any other of
// this host, and comes back when its holder lets go or dies. Cores far above any real one
// are used, so that the project's own programs running beside the test are not disturbed.
TEST(CoreClaims, OneHolderAtATimeAcrossProcesses) {
  const std::vector<unsigned> cpus = {100001, 100002};
  CoreClaims first, second;
  EXPECT_EQ(first.Take(cpus), std::optional<unsigned>(100001));
  EXPECT_EQ(second.Take(cpus), std::optional<unsigned>(100002));  // the first is held
  EXPECT_EQ(second.Take(cpus), std::nullopt);                     // both are
  first.Release();
  EXPECT_EQ(second.Take(cpus), std::optional<unsigned>(100001));
  second.Release();

  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // another process holds the first core, then is killed holding it
    CoreClaims held;
    const bool took = held.Take(cpus) == std::optional<unsigned>(100001);
    (void)!write(ready[1], took ? "y" : "n", 1);
    pause();
    _exit(0);
  }
  char took = 0;
  ASSERT_EQ(read(ready[0], &took, 1), 1);
  EXPECT_EQ(took, 'y');
  CoreClaims mine;
  EXPECT_EQ(mine.Take(cpus), std::optional<unsigned>(100002));  // the child holds the first
  mine.Release();
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_EQ(mine.Take(cpus), std::optional<unsigned>(100001));  // its death let it go
  close(ready[0]);
  close(ready[1]);
  for (unsigned c : cpus) unlink(("/dev/shm/rdma-journey.cpu" + std::to_string(c)).c_str());
}
