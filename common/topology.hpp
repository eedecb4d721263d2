// Which NICs, NUMA node and cores belong to which GPU (docs/architecture.md, "Topology"), read from
// hwloc. GroupDevices is a pure function of an hwloc topology and the device lists, so it is
// unit-tested on XML fixtures (tests/data/) shaped like real machines.
#pragma once

#include <hwloc.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace common {

struct PciAddress {
  uint16_t domain = 0;
  uint8_t bus = 0, device = 0, function = 0;
  static std::optional<PciAddress> Parse(const std::string& text);  // "0000:53:00.0" or "53:00.0"
  std::string Full() const;                                         // "0000:53:00.0"
  std::string Short() const;  // "53:00.0", as the published programs print
};

struct NicDevice {
  std::string name;               // libfabric domain name: rdmap79s0, eth0, mca0, shm
  std::optional<PciAddress> pci;  // from fi_info->nic->bus_attr; none for veth, lo, shm
  double link_gbps = 0;
};

struct DeviceGroup {
  std::optional<int> gpu;  // CUDA device index; none for a host-memory group
  std::optional<PciAddress> gpu_pci;
  int numa = 0;                // NUMA node os index
  std::vector<unsigned> cpus;  // one PU per core, os indices
  std::vector<size_t> nics;    // indices into the NIC list
};

// Owns an hwloc topology.
class Topology {
 public:
  static Topology Load();  // this machine, with PCI devices
  static Topology FromXml(const std::string& path);
  hwloc_topology_t get() const { return topology_.get(); }

 private:
  struct Destroy {
    void operator()(hwloc_topology* t) const noexcept { hwloc_topology_destroy(t); }
  };
  std::unique_ptr<hwloc_topology, Destroy> topology_;
};

// Groups NICs, a NUMA node and cores around each GPU:
//  - a NIC goes to the GPU it shares a PCIe switch with (their closest common ancestor is a
//    PCI-to-PCI bridge, not a host bridge or anything above);
//  - a NIC under the switch of one of the machine's other GPUs (one this process does not
//    use: CUDA_VISIBLE_DEVICES, a one-GPU pod, --gpus) is that GPU's process's, and in no
//    group; unless a GPU used here would have no NIC at all, then it is dealt as below;
//  - a NIC that shares no switch with any GPU (on no switch, under a host bridge of its
//    own, or without PCI attributes: veth, lo, shm) goes to the group with the fewest NICs,
//    preferring its own NUMA node, then the lowest GPU index: dealt round-robin;
//  - each group's cores are its NUMA node's cores, split evenly among the node's groups in
//    GPU order;
//  - with no GPU, there is one host-memory group per NUMA node that has cores, and every NIC.
// `gpus` are the GPUs used, `indices` their CUDA device indices (default: 0, 1, ...).
std::vector<DeviceGroup> GroupDevices(const Topology& topology, const std::vector<PciAddress>& gpus,
                                      const std::vector<NicDevice>& nics,
                                      const std::vector<int>& indices = {});

// Whether the topology is this machine's (hwloc_topology_is_thissystem): one read from XML
// describes another, and binding threads or memory with it means nothing here.
bool IsThisSystem(const Topology& topology);
// The GPUs (NVIDIA display or 3D controllers) and the NICs (EFA devices where there are any,
// else every Ethernet-class device) of a topology's PCI tree, in PCI address order: what a
// rehearsal of that machine (07 --topology) pairs and groups.
std::vector<PciAddress> GpusOf(const Topology& topology);
std::vector<PciAddress> NicsOf(const Topology& topology);
// The GPUs a process given CUDA_VISIBLE_DEVICES (`visible`, may be null) would see, in its
// order: its indices up to the first entry that is not one (CUDA stops there too); all of
// them when unset or when it names GPUs by UUID, which a topology file cannot resolve.
std::vector<PciAddress> VisibleOf(const std::vector<PciAddress>& gpus, const char* visible);

// Binds the calling thread to one PU (os index). False (and the reason in `why`) where the
// operating system refuses, e.g. a CPU outside the process's allowed set.
bool PinThread(const Topology& topology, unsigned cpu, std::string& why);
// Makes the calling thread's later allocations come from NUMA node `numa` (os index).
bool BindThreadMemory(const Topology& topology, int numa, std::string& why);
// Where the operating system says the calling thread may run and allocates from, read back:
// "cpus 3, memory bound to node 0" or "cpus 0-1, memory anywhere". What --pin and --numa did
// shows here, not in their names.
std::string DescribePlacement(const Topology& topology);

// The cores a program is given, and which threads run where (docs/architecture.md, "Cores"):
// data threads pin to their group's cores among those given; threads that only wait (a
// control loop, a watcher) keep off the pinned ones while another is given.
//
// The CPUs this process may run on, as the calling thread's affinity says (taskset, Slurm's
// --cpu-bind, a container's cpuset): call it before any thread pins itself.
std::vector<unsigned> GivenCpus();
// A group's cores among those given, in the group's order; all given ones when none of the
// group's is (a taskset that left out the GPU's socket runs far from it, not nowhere).
std::vector<unsigned> CpusWithin(const std::vector<unsigned>& group,
                                 const std::vector<unsigned>& given);
// Where a thread that only waits runs: the given CPUs that no pinned data thread holds; all
// given ones when the data threads hold every one (then it shares, and naps).
std::vector<unsigned> ControlCpus(const std::vector<unsigned>& given,
                                  const std::vector<unsigned>& pinned);
// Binds the calling thread to `cpus` (sched_setaffinity);
// false and why where refused.
bool BindThreadTo(const std::vector<unsigned>& cpus, std::string& why);

// The cores this process's pinned threads hold, known to every process of this host: a lock
// (flock) on /dev/shm/rdma-journey.cpu<N> per core, which the kernel lets go when the process
// ends, however it ends. Processes that pin (07's server and its clients) take the cores no
// other holds, so K clients on one host pin like K hosts instead of all on the same core.
class CoreClaims {
 public:
  CoreClaims() = default;
  CoreClaims(const CoreClaims&) = delete;
  CoreClaims& operator=(const CoreClaims&) = delete;
  ~CoreClaims() { Release(); }
  // The first of `cpus`, in their order, that no thread of any process holds, now held;
  // nullopt when every one is held (or the locks cannot be made here: `why` says so).
  std::optional<unsigned> Take(const std::vector<unsigned>& cpus, std::string* why = nullptr);
  void Release();

 private:
  std::vector<int> fds_;
};

// "0-11", "0-3,8,10-11"
std::string FormatCpuList(const std::vector<unsigned>& cpus);

// "cuda:0(53:00.0) NUMA0 CPU 0-11 rdmap79s0 (4f:00.0) ...", as the published programs did.
std::string FormatGroup(const DeviceGroup& group, const std::vector<NicDevice>& nics);
// "GPUs: 8, NICs: 32, Total Bandwidth: 3200 Gbps": the groups' GPUs and NICs.
std::string FormatTotals(const std::vector<DeviceGroup>& groups,
                         const std::vector<NicDevice>& nics);

}  // namespace common
