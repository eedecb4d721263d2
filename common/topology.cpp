#include "topology.hpp"

#include <fcntl.h>
#include <hwloc/helper.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "error.hpp"

namespace common {

std::optional<PciAddress> PciAddress::Parse(const std::string& text) {
  if (text.find_first_not_of("0123456789abcdefABCDEF:.") != std::string::npos) return std::nullopt;
  unsigned d = 0, b = 0, dev = 0, f = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%x:%x:%x.%x%c", &d, &b, &dev, &f, &tail) == 4 ||
      (d = 0, std::sscanf(text.c_str(), "%x:%x.%x%c", &b, &dev, &f, &tail) == 3)) {
    if (d > 0xffff || b > 0xff || dev > 0x1f || f > 7) return std::nullopt;
    return PciAddress{static_cast<uint16_t>(d), static_cast<uint8_t>(b), static_cast<uint8_t>(dev),
                      static_cast<uint8_t>(f)};
  }
  return std::nullopt;
}

std::string PciAddress::Full() const {
  char s[32];
  std::snprintf(s, sizeof(s), "%04x:%02x:%02x.%x", domain, bus, device, function);
  return s;
}

std::string PciAddress::Short() const {
  return Full().substr(5);
}

Topology Topology::Load() {
  hwloc_topology_t t = nullptr;
  HWLOC_CHECK(hwloc_topology_init(&t));
  Topology topology;
  topology.topology_.reset(t);
  HWLOC_CHECK(hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_ALL));
  HWLOC_CHECK(hwloc_topology_load(t));
  return topology;
}

Topology Topology::FromXml(const std::string& path) {
  hwloc_topology_t t = nullptr;
  HWLOC_CHECK(hwloc_topology_init(&t));
  Topology topology;
  topology.topology_.reset(t);
  if (hwloc_topology_set_xml(t, path.c_str()) < 0)
    throw Error("cannot read hwloc XML '" + path + "'");
  HWLOC_CHECK(hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_ALL));
  HWLOC_CHECK(hwloc_topology_load(t));
  return topology;
}

namespace {

hwloc_obj_t FindPci(hwloc_topology_t t, const PciAddress& a) {
  return hwloc_get_pcidev_by_busid(t, a.domain, a.bus, a.device, a.function);
}

// The NUMA node (os index) nearest a PCI device, or of the whole machine.
int NumaOf(hwloc_topology_t t, hwloc_obj_t obj) {
  hwloc_obj_t cpu_side = obj ? hwloc_get_non_io_ancestor_obj(t, obj) : hwloc_get_root_obj(t);
  hwloc_obj_t node =
      hwloc_get_next_obj_covering_cpuset_by_type(t, cpu_side->cpuset, HWLOC_OBJ_NUMANODE, nullptr);
  if (node == nullptr) {  // the cpuset covers several nodes: take the first of its nodeset
    int first = hwloc_bitmap_first(cpu_side->nodeset);
    return first < 0 ? 0 : first;
  }
  return static_cast<int>(node->os_index);
}

// True when the closest common ancestor of the two devices is a PCIe switch (a bridge whose
// upstream side is PCI), not a host bridge or a CPU-side object.
// (hwloc_get_common_ancestor_obj compares depths, which I/O objects do not have: walk.)
bool ShareSwitch(hwloc_obj_t a, hwloc_obj_t b) {
  hwloc_obj_t common = nullptr;
  for (hwloc_obj_t x = a; x != nullptr && common == nullptr; x = x->parent)
    for (hwloc_obj_t y = b; y != nullptr; y = y->parent)
      if (x == y) {
        common = x;
        break;
      }
  return common != nullptr && common->type == HWLOC_OBJ_BRIDGE &&
         common->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_PCI;
}

// One PU per core of a NUMA node, by os index.
std::vector<unsigned> CoresOf(hwloc_topology_t t, int numa) {
  hwloc_obj_t node = hwloc_get_numanode_obj_by_os_index(t, static_cast<unsigned>(numa));
  std::vector<unsigned> cpus;
  if (node == nullptr) return cpus;
  hwloc_obj_t core = nullptr;
  while ((core = hwloc_get_next_obj_inside_cpuset_by_type(t, node->cpuset, HWLOC_OBJ_CORE, core)))
    cpus.push_back(static_cast<unsigned>(hwloc_bitmap_first(core->cpuset)));
  if (cpus.empty()) {  // no core objects: one entry per PU
    hwloc_obj_t pu = nullptr;
    while ((pu = hwloc_get_next_obj_inside_cpuset_by_type(t, node->cpuset, HWLOC_OBJ_PU, pu)))
      cpus.push_back(pu->os_index);
  }
  return cpus;
}

}  // namespace

bool IsThisSystem(const Topology& topology) {
  return hwloc_topology_is_thissystem(topology.get()) != 0;
}

namespace {
std::vector<PciAddress> PciDevices(const Topology& topology, bool (*want)(const hwloc_obj_t&)) {
  std::vector<PciAddress> found;
  for (hwloc_obj_t o = hwloc_get_next_pcidev(topology.get(), nullptr); o != nullptr;
       o = hwloc_get_next_pcidev(topology.get(), o))
    if (want(o)) {
      const auto& p = o->attr->pcidev;
      found.push_back({p.domain, p.bus, p.dev, p.func});
    }
  std::sort(found.begin(), found.end(),
            [](const PciAddress& a, const PciAddress& b) { return a.Full() < b.Full(); });
  return found;
}
}  // namespace

std::vector<PciAddress> GpusOf(const Topology& topology) {
  return PciDevices(topology, [](const hwloc_obj_t& o) {
    const auto& p = o->attr->pcidev;
    return p.vendor_id == 0x10de && (p.class_id == 0x0300 || p.class_id == 0x0302);
  });
}

std::vector<PciAddress> NicsOf(const Topology& topology) {
  auto efa = PciDevices(topology, [](const hwloc_obj_t& o) {
    const auto& p = o->attr->pcidev;  // Amazon's EFA devices: 1d0f:efa0, efa1, efa2, ...
    return p.vendor_id == 0x1d0f && (p.device_id & 0xfff0) == 0xefa0;
  });
  if (!efa.empty()) return efa;
  return PciDevices(topology, [](const hwloc_obj_t& o) {
    return (o->attr->pcidev.class_id >> 8) == 0x02;  // network controllers
  });
}

std::vector<PciAddress> VisibleOf(const std::vector<PciAddress>& gpus, const char* visible) {
  if (visible == nullptr || *visible == '\0') return gpus;
  std::vector<PciAddress> seen;
  std::stringstream items(visible);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty() || item.size() > 6 ||
        item.find_first_not_of("0123456789") != std::string::npos)
      break;
    const unsigned long g = std::stoul(item);
    if (g >= gpus.size()) break;
    seen.push_back(gpus[g]);
  }
  return seen.empty() && !std::isdigit(static_cast<unsigned char>(visible[0])) ? gpus : seen;
}

bool PinThread(const Topology& topology, unsigned cpu, std::string& why) {
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  hwloc_bitmap_only(set, cpu);
  const int rc = hwloc_set_cpubind(topology.get(), set, HWLOC_CPUBIND_THREAD);
  hwloc_bitmap_free(set);
  if (rc != 0) why = "hwloc_set_cpubind(CPU " + std::to_string(cpu) + "): " + std::strerror(errno);
  return rc == 0;
}

std::optional<unsigned> CoreClaims::Take(const std::vector<unsigned>& cpus, std::string* why) {
  for (unsigned cpu : cpus) {
    const std::string path = "/dev/shm/rdma-journey.cpu" + std::to_string(cpu);
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
      if (why) *why = "cannot claim cores across processes: " + path + ": " + std::strerror(errno);
      return std::nullopt;
    }
    fchmod(fd, 0666);  // whatever the umask: another user's process claims through it too
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {  // a lock per open file: our own threads too
      fds_.push_back(fd);
      return cpu;
    }
    close(fd);
  }
  return std::nullopt;
}
void CoreClaims::Release() {
  for (int fd : fds_) close(fd);  // closing lets the lock go; the empty file stays for others
  fds_.clear();
}

bool BindThreadMemory(const Topology& topology, int numa, std::string& why) {
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  hwloc_bitmap_only(set, static_cast<unsigned>(numa));
  const int rc = hwloc_set_membind(topology.get(), set, HWLOC_MEMBIND_BIND,
                                   HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET);
  hwloc_bitmap_free(set);
  if (rc != 0) why = "hwloc_set_membind(NUMA" + std::to_string(numa) + "): " + std::strerror(errno);
  return rc == 0;
}

std::string DescribePlacement(const Topology& topology) {
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  std::string out = "cpus ?";
  if (hwloc_get_cpubind(topology.get(), set, HWLOC_CPUBIND_THREAD) == 0) {
    std::vector<unsigned> cpus;
    for (int i = hwloc_bitmap_first(set); i >= 0; i = hwloc_bitmap_next(set, i))
      cpus.push_back(static_cast<unsigned>(i));
    out = "cpus " + FormatCpuList(cpus);
  }
  hwloc_membind_policy_t policy = HWLOC_MEMBIND_DEFAULT;
  if (hwloc_get_membind(topology.get(), set, &policy,
                        HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET) == 0 &&
      policy == HWLOC_MEMBIND_BIND) {
    std::vector<unsigned> nodes;
    for (int i = hwloc_bitmap_first(set); i >= 0; i = hwloc_bitmap_next(set, i))
      nodes.push_back(static_cast<unsigned>(i));
    out += ", memory bound to node " + FormatCpuList(nodes);
  } else {
    out += ", memory anywhere";
  }
  hwloc_bitmap_free(set);
  return out;
}

std::vector<DeviceGroup> GroupDevices(const Topology& topology, const std::vector<PciAddress>& gpus,
                                      const std::vector<NicDevice>& nics,
                                      const std::vector<int>& indices) {
  hwloc_topology_t t = topology.get();
  std::vector<DeviceGroup> groups;
  std::vector<hwloc_obj_t> gpu_objs;
  for (size_t g = 0; g < gpus.size(); ++g) {
    hwloc_obj_t obj = FindPci(t, gpus[g]);
    DeviceGroup group;
    group.gpu = g < indices.size() ? indices[g] : static_cast<int>(g);
    group.gpu_pci = gpus[g];
    group.numa = NumaOf(t, obj);
    groups.push_back(group);
    gpu_objs.push_back(obj);
  }
  if (gpus.empty()) {
    hwloc_obj_t node = nullptr;
    while ((node = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, node))) {
      if (hwloc_bitmap_iszero(node->cpuset)) continue;  // memory-only node
      DeviceGroup group;
      group.numa = static_cast<int>(node->os_index);
      groups.push_back(group);
    }
    if (groups.empty()) groups.push_back(DeviceGroup{});
  }

  // The machine's GPUs that this process does not use: their NICs are their processes'.
  std::vector<hwloc_obj_t> others;
  for (const PciAddress& pci : gpus.empty() ? std::vector<PciAddress>{} : GpusOf(topology))
    if (hwloc_obj_t obj = FindPci(t, pci);
        obj && std::find(gpu_objs.begin(), gpu_objs.end(), obj) == gpu_objs.end())
      others.push_back(obj);
  // NICs under a GPU's switch first; the rest are dealt afterwards.
  std::vector<size_t> leftover, theirs;
  std::vector<int> leftover_numa, theirs_numa;
  for (size_t n = 0; n < nics.size(); ++n) {
    hwloc_obj_t nic = nics[n].pci ? FindPci(t, *nics[n].pci) : nullptr;
    bool placed = false;
    for (size_t g = 0; nic && !placed && g < gpu_objs.size(); ++g) {
      if (gpu_objs[g] && ShareSwitch(nic, gpu_objs[g])) {
        groups[g].nics.push_back(n);
        placed = true;
      }
    }
    const bool other_gpus = nic && std::any_of(others.begin(), others.end(), [&](hwloc_obj_t gpu) {
                              return ShareSwitch(nic, gpu);
                            });
    if (!placed) {
      (other_gpus ? theirs : leftover).push_back(n);
      (other_gpus ? theirs_numa : leftover_numa).push_back(nic ? NumaOf(t, nic) : -1);
    }
  }
  // A GPU of ours that no NIC shares a switch with, and nothing else to deal it: the other
  // GPUs' NICs are dealt too (it runs through them, not nowhere).
  const auto bare = std::count_if(groups.begin(), groups.end(),
                                  [](const DeviceGroup& g) { return g.nics.empty(); });
  if (leftover.size() < static_cast<size_t>(bare)) {
    leftover.insert(leftover.end(), theirs.begin(), theirs.end());
    leftover_numa.insert(leftover_numa.end(), theirs_numa.begin(), theirs_numa.end());
  }
  for (size_t i = 0; i < leftover.size(); ++i) {
    size_t best = 0;
    for (size_t g = 1; g < groups.size(); ++g) {
      auto key = [&](size_t k) {
        return std::make_pair(groups[k].nics.size(), groups[k].numa == leftover_numa[i] ? 0 : 1);
      };
      if (key(g) < key(best)) best = g;
    }
    groups[best].nics.push_back(leftover[i]);
  }

  // Cores: each NUMA node's cores split evenly among its groups, in GPU order.
  std::map<int, std::vector<size_t>> by_node;
  for (size_t g = 0; g < groups.size(); ++g) by_node[groups[g].numa].push_back(g);
  for (auto& [numa, members] : by_node) {
    const std::vector<unsigned> cores = CoresOf(t, numa);
    const size_t n = members.size();
    for (size_t k = 0; k < n; ++k) {
      const size_t begin = cores.size() * k / n, end = cores.size() * (k + 1) / n;
      groups[members[k]].cpus.assign(cores.begin() + begin, cores.begin() + end);
    }
  }
  return groups;
}

std::vector<unsigned> GivenCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<unsigned> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (unsigned c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

std::vector<unsigned> CpusWithin(const std::vector<unsigned>& group,
                                 const std::vector<unsigned>& given) {
  std::vector<unsigned> within;
  for (unsigned c : group)
    if (std::find(given.begin(), given.end(), c) != given.end()) within.push_back(c);
  return within.empty() ? given : within;
}

std::vector<unsigned> ControlCpus(const std::vector<unsigned>& given,
                                  const std::vector<unsigned>& pinned) {
  std::vector<unsigned> free;
  for (unsigned c : given)
    if (std::find(pinned.begin(), pinned.end(), c) == pinned.end()) free.push_back(c);
  return free.empty() ? given : free;
}

bool BindThreadTo(const std::vector<unsigned>& cpus, std::string& why) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (unsigned c : cpus)
    if (c < CPU_SETSIZE) CPU_SET(c, &set);
  if (CPU_COUNT(&set) == 0) {
    why = "no CPU to bind to";
    return false;
  }
  if (sched_setaffinity(0, sizeof(set), &set) == 0) return true;
  why = "sched_setaffinity(CPU " + FormatCpuList(cpus) + "): " + std::strerror(errno);
  return false;
}

std::string FormatCpuList(const std::vector<unsigned>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out.empty() ? "none" : out;
}

std::string FormatGroup(const DeviceGroup& group, const std::vector<NicDevice>& nics) {
  std::string out = group.gpu ? "cuda:" + std::to_string(*group.gpu) + "(" +
                                    (group.gpu_pci ? group.gpu_pci->Short() : "?") + ")"
                              : std::string("host");
  out += " NUMA" + std::to_string(group.numa) + " CPU " + FormatCpuList(group.cpus);
  for (size_t n : group.nics) {
    out += " " + nics[n].name;
    if (nics[n].pci) out += " (" + nics[n].pci->Short() + ")";
  }
  return out;
}

std::string FormatTotals(const std::vector<DeviceGroup>& groups,
                         const std::vector<NicDevice>& nics) {
  size_t gpus = 0, unknown = 0, used = 0;
  double gbps = 0;
  for (const auto& g : groups) {
    gpus += g.gpu ? 1 : 0;
    for (size_t n : g.nics) {
      gbps += nics[n].link_gbps;
      unknown += nics[n].link_gbps > 0 ? 0 : 1;
      ++used;
    }
  }
  // shm and loopback have no link rate: said so, not added up as 0 Gbps.
  char total[96];
  if (unknown == used)
    std::snprintf(total, sizeof(total), "link rate unknown");
  else if (unknown > 0)
    std::snprintf(total, sizeof(total), "%g Gbps and %zu NIC%s of unknown rate", gbps, unknown,
                  unknown == 1 ? "" : "s");
  else
    std::snprintf(total, sizeof(total), "%g Gbps", gbps);
  char line[160];
  std::snprintf(line, sizeof(line), "GPUs: %zu, NICs: %zu, Total Bandwidth: %s", gpus, used, total);
  return line;
}

}  // namespace common
