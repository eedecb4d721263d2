#include "preflight.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cuda_memory.hpp"
#include "provider.hpp"

namespace common {

namespace fs = std::filesystem;

std::string FormatCheck(const CheckLine& line) {
  const char* word = line.verdict == Verdict::kOk     ? "OK  "
                     : line.verdict == Verdict::kWarn ? "WARN"
                                                      : "FAIL";
  std::string text = std::string(word) + "  " + line.name + ": " + line.detail;
  if (line.verdict != Verdict::kOk && !line.fix.empty()) text += " -> " + line.fix;
  return text;
}

int PreflightExitCode(const std::vector<CheckLine>& lines) {
  return std::any_of(lines.begin(), lines.end(),
                     [](const CheckLine& l) { return l.verdict == Verdict::kFail; })
             ? 1
             : 0;
}

namespace {

std::vector<std::string> Names(const fs::path& dir, const std::string& prefix = "") {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) names.push_back(name);
  }
  // In the kernel's numbering: rdmap79s0 before rdmap113s0, uverbs2 before uverbs10.
  std::sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;
  });
  return names;
}

std::optional<std::string> FirstLine(const fs::path& file) {
  std::ifstream in(file);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

std::string Join(const std::vector<std::string>& items, size_t most = 4) {
  std::string text;
  for (size_t i = 0; i < items.size() && i < most; ++i) text += (i ? ", " : "") + items[i];
  if (items.size() > most) text += " ... " + items.back();
  return text;
}

std::string Get(const std::map<std::string, std::string>& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() ? "" : it->second;
}

// A kernel CPU list ("0-47,96-143") as its CPUs; what does not parse is left out.
std::vector<int> CpuList(const std::string& text) {
  std::vector<int> cpus;
  std::istringstream parts(text);
  for (std::string part; std::getline(parts, part, ',');) {
    int first = 0, last = 0;
    const int n = std::sscanf(part.c_str(), "%d-%d", &first, &last);
    if (n < 1 || first < 0) continue;
    if (n == 1) last = first;
    for (int cpu = first; cpu <= last && cpu < (1 << 16); ++cpu) cpus.push_back(cpu);
  }
  return cpus;
}

// A device's NUMA node from its numa_node file (-1: none, as on one-socket hosts).
int NumaNode(const fs::path& file) {
  auto line = FirstLine(file);
  return line ? std::atoi(line->c_str()) : -1;
}

std::string Bytes(uint64_t bytes) {
  if (bytes >= (1ull << 30)) return std::to_string(bytes >> 30) + " GiB";
  if (bytes >= (1ull << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

}  // namespace

HostFacts ReadHostFacts(const std::string& root) {
  const fs::path r = root;
  HostFacts h;
  std::error_code ec;
  for (const auto& dev : Names(r / "sys/class/infiniband")) {
    // The device's driver, as the kernel links it: .../drivers/efa.
    const fs::path driver =
        fs::read_symlink(r / "sys/class/infiniband" / dev / "device/driver", ec);
    if (!ec && driver.filename() == "efa") h.efa_devices.push_back(dev);
  }
  h.uverbs = Names(r / "dev/infiniband", "uverbs").size();
  h.host_gpus = Names(r / "proc/driver/nvidia/gpus");
  h.nvidia_peermem = fs::exists(r / "sys/module/nvidia_peermem", ec);
  if (fs::exists(r / "sys/module/efa_nv_peermem", ec))
    h.efa_gpudirect = "efa_nv_peermem loaded";
  else if (fs::exists(r / "sys/module/nvidia/holders/efa", ec))
    h.efa_gpudirect = "efa built with GPUDirect (it holds the nvidia module)";
  std::ifstream meminfo(r / "proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    std::istringstream words(line);
    std::string key;
    long value = 0;
    words >> key >> value;
    if (key == "HugePages_Total:") h.hugepages = value;
    if (key == "Hugepagesize:") h.hugepage_kib = value;
  }
  if (auto scope = FirstLine(r / "proc/sys/kernel/yama/ptrace_scope"))
    h.ptrace_scope = std::atoi(scope->c_str());
  h.instance_type = FirstLine(r / "sys/class/dmi/id/product_name").value_or("");
  for (const auto& dev : h.efa_devices)
    h.efa_port_state[dev] =
        FirstLine(r / "sys/class/infiniband" / dev / "ports/1/state").value_or("unknown");
  h.efa_driver = FirstLine(r / "sys/module/efa/version").value_or("");
  std::ifstream status(r / "proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("Cpus_allowed_list:", 0) == 0) h.allowed_cpus = CpuList(line.substr(18));
  for (const auto& node : Names(r / "sys/devices/system/node", "node"))
    if (node.size() > 4 && std::isdigit(static_cast<unsigned char>(node[4])))
      h.node_cpus[std::atoi(node.c_str() + 4)] =
          CpuList(FirstLine(r / "sys/devices/system/node" / node / "cpulist").value_or(""));
  for (const auto& dev : h.efa_devices)
    if (int node = NumaNode(r / "sys/class/infiniband" / dev / "device/numa_node"); node >= 0)
      ++h.node_efa[node];
  for (const auto& gpu : h.host_gpus)  // the driver names each GPU by its PCI address
    if (int node = NumaNode(r / "sys/bus/pci/devices" / gpu / "numa_node"); node >= 0)
      ++h.node_gpus[node];
  for (const char* dir : {"usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64",
                          "lib64", "opt/amazon/efa/lib", "opt/amazon/efa/lib64"})
    for (const auto& name : Names(r / dir, "libefa.so.1."))
      if (name.size() > h.libefa.size()) h.libefa = name;  // the full version, not a link
  return h;
}

ProcessFacts ReadProcessFacts(char** environ_list) {
  ProcessFacts p;
  for (char** e = environ_list; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) p.env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) == 0)
    p.memlock = limit.rlim_cur == RLIM_INFINITY ? UINT64_MAX : limit.rlim_cur;
  // CAP_IPC_LOCK (bit 14 of CapEff): ib_umem_get checks RLIMIT_MEMLOCK only without it.
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("CapEff:", 0) == 0)
      p.ipc_lock = (std::strtoull(line.c_str() + 7, nullptr, 16) >> 14) & 1;
  p.visible_gpus = CudaDeviceCount();
  p.cuda_built = CudaBuilt();
  p.cuda = CudaStatus();
  if (p.visible_gpus > 0) {
    p.cudart = CudaRuntimeProblem();
    try {
      CudaBuffer probe(2 << 20, 0);
      p.dmabuf = probe.ExportDmabuf(probe.data(), probe.size()).get() >= 0;
    } catch (const std::exception&) {
      p.dmabuf = false;
    }
  }
  return p;
}

// CUDA is built in and says an error: a runtime the driver does not support, no driver.
bool CudaFailed(const ProcessFacts& process) {
  return process.cuda_built && (process.cuda.find(": ") != std::string::npos ||
                                process.cuda.find("no NVIDIA driver") != std::string::npos);
}

// How a NIC reaches GPU memory: peer memory (dmabuf, nvidia_peermem, or the efa driver's own
// GPUDirect path), and a CUDA runtime that libfabric can load.
static std::vector<CheckLine> GpuMemoryLines(const HostFacts& host, const ProcessFacts& process) {
  std::vector<CheckLine> lines;
  const bool efa = !host.efa_devices.empty();
  const int gpus = process.visible_gpus;
  // Peer memory: the NIC can pin GPU pages by dmabuf or through nvidia_peermem.
  if (gpus == 0)
    lines.push_back({Verdict::kOk, "GPU peer memory", "not needed without a GPU", ""});
  else if (process.dmabuf.value_or(false) || host.nvidia_peermem ||
           (efa && !host.efa_gpudirect.empty()))
    lines.push_back(
        {Verdict::kOk, "GPU peer memory",
         std::string(process.dmabuf.value_or(false) ? "dmabuf export works on a test allocation"
                                                    : "no dmabuf export") +
             (host.nvidia_peermem ? "; nvidia_peermem loaded" : "") +
             (efa && !host.efa_gpudirect.empty() ? "; " + host.efa_gpudirect : ""),
         ""});
  else
    lines.push_back({efa ? Verdict::kFail : Verdict::kWarn, "GPU peer memory",
                     "no dmabuf export of a test allocation, no nvidia_peermem and no efa "
                     "GPUDirect module: a NIC cannot reach GPU memory (efa would copy it through "
                     "host memory)",
                     "modprobe nvidia_peermem (or efa_nv_peermem), or a driver and kernel with "
                     "dmabuf (NVIDIA open kernel modules, Linux 5.12 or later)"});
  // libfabric's CUDA: a libfabric that loads the runtime at run time and cannot.
  if (gpus > 0 && !process.cudart.empty())
    lines.push_back({Verdict::kFail, "CUDA runtime for libfabric",
                     process.cudart.substr(0, process.cudart.find("): ") + 1) +
                         ": no provider offers GPU memory (FI_HMEM)",
                     "add the CUDA toolkit's lib64 to LD_LIBRARY_PATH "
                     "(/usr/local/cuda/lib64), where libcudart.so is"});
  return lines;
}

std::vector<CheckLine> CheckHost(const HostFacts& host, const ProcessFacts& process) {
  std::vector<CheckLine> lines;
  const bool efa = !host.efa_devices.empty();
  const size_t host_gpus = host.host_gpus.size();
  const int gpus = process.visible_gpus;

  // EFA devices, and whether this process (a container's) can open them.
  if (efa)
    lines.push_back({Verdict::kOk, "EFA devices",
                     std::to_string(host.efa_devices.size()) + " (" + Join(host.efa_devices) + ")",
                     ""});
  else
    lines.push_back(
        {Verdict::kWarn, "EFA devices",
         "none in /sys/class/infiniband: not an EFA host, 07 runs over tcp or shm here",
         "on AWS, an EFA-enabled instance (p5) with the EFA driver (the EFA installer)"});
  if (!efa)
    lines.push_back({Verdict::kOk, "/dev/infiniband", "not needed without EFA devices", ""});
  else if (host.uverbs >= host.efa_devices.size())
    lines.push_back({Verdict::kOk, "/dev/infiniband",
                     std::to_string(host.uverbs) + " uverbs devices this process can open", ""});
  else
    lines.push_back({Verdict::kFail, "/dev/infiniband",
                     std::to_string(host.efa_devices.size()) + " EFA devices in /sys, " +
                         std::to_string(host.uverbs) +
                         " in /dev/infiniband: this container was not given them",
                     "Kubernetes: request vpc.amazonaws.com/efa (the EFA device plugin); docker: "
                     "--device /dev/infiniband/uverbsN for each"});

  // GPUs: the host's (the driver's list) against this process's (what cgroups, Slurm or
  // Kubernetes left it), naming what confines them.
  std::string confined;
  for (const char* var : {"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "SLURM_STEP_GPUS",
                          "SLURM_JOB_GPUS", "GPU_DEVICE_ORDINAL"})
    if (const std::string v = Get(process.env, var); !v.empty())
      confined += std::string(confined.empty() ? "" : ", ") + var + "=" + v;
  const std::string by = confined.empty() ? "" : " (" + confined + ")";
  const std::string ask_for_gpus =
      "Slurm: --gpus-per-node=" + std::to_string(std::max<size_t>(host_gpus, 1)) +
      " (or --gres=gpu:N); Kubernetes: nvidia.com/gpu in the pod's limits; or unset "
      "CUDA_VISIBLE_DEVICES";
  if (gpus == 0 && host_gpus == 0)
    lines.push_back({Verdict::kWarn, "GPUs", "none: 07 moves host memory here",
                     "a GPU host with the NVIDIA driver (/proc/driver/nvidia/gpus)"});
  else if (gpus == 0 && !process.cuda_built)
    lines.push_back({Verdict::kFail, "GPUs",
                     "the driver lists " + std::to_string(host_gpus) +
                         ", and this build has no CUDA: it moves host memory only",
                     "rebuild with the CUDA toolkit installed (meson setup -Dcuda=enabled)"});
  else if (gpus == 0 && CudaFailed(process))
    lines.push_back(
        {Verdict::kFail, "GPUs",
         "the driver lists " + std::to_string(host_gpus) + ", CUDA says " + process.cuda,
         "a CUDA runtime this driver supports, the driver loaded (nvidia-smi)"});
  else if (gpus == 0)
    lines.push_back({Verdict::kFail, "GPUs",
                     "the driver lists " + std::to_string(host_gpus) + ", this process sees none" +
                         by + ": --memory auto would move host memory",
                     ask_for_gpus});
  else if (static_cast<size_t>(gpus) < host_gpus)
    lines.push_back({Verdict::kWarn, "GPUs",
                     "this process sees " + std::to_string(gpus) + " of the host's " +
                         std::to_string(host_gpus) + by +
                         ": 07 uses those and only the NICs under their switches",
                     ask_for_gpus});
  else
    lines.push_back({Verdict::kOk, "GPUs",
                     std::to_string(gpus) + " visible" +
                         (host_gpus == 0 ? " (the driver's list is not visible here)" : "") + by,
                     ""});

  for (auto& line : GpuMemoryLines(host, process)) lines.push_back(line);

  // Huge pages: efa's buffer pools map them (MAP_HUGETLB) and fall back to small pages.
  const std::string pages = std::to_string(std::max(host.hugepages, 0L)) + " x " +
                            std::to_string(host.hugepage_kib) + " kB reserved";
  if (host.hugepages > 0)
    lines.push_back({Verdict::kOk, "huge pages", pages, ""});
  else if (efa)
    lines.push_back({Verdict::kWarn, "huge pages",
                     pages + ": efa's buffer pools ask for huge pages and fall back to small ones",
                     "sysctl -w vm.nr_hugepages=N; Kubernetes: hugepages-2Mi in the pod's "
                     "resources, beside a memory request"});
  else
    lines.push_back({Verdict::kOk, "huge pages", pages + " (only efa asks for them)", ""});

  // memlock: registration pins pages.
  if (process.memlock == UINT64_MAX)
    lines.push_back({Verdict::kOk, "memlock", "unlimited", ""});
  else if (process.ipc_lock)
    lines.push_back({Verdict::kOk, "memlock",
                     Bytes(process.memlock) +
                         ", but CAP_IPC_LOCK: the kernel pins registrations past the limit",
                     ""});
  else
    lines.push_back({efa || gpus > 0 ? Verdict::kFail : Verdict::kWarn, "memlock",
                     Bytes(process.memlock) +
                         " at most: registering memory with a NIC pins it, and fails beyond",
                     "ulimit -l unlimited (/etc/security/limits.conf; docker --ulimit "
                     "memlock=-1; Kubernetes: IPC_LOCK and the runtime's limit)"});

  // ptrace scope: shm reads and writes the other process's memory (process_vm_readv).
  if (host.ptrace_scope == 0)
    lines.push_back(
        {Verdict::kOk, "ptrace scope", "0: shm copies between processes directly (CMA)", ""});
  else
    lines.push_back({Verdict::kWarn, "ptrace scope",
                     std::to_string(host.ptrace_scope) +
                         ": shm cannot read another process's memory and copies through "
                         "its bounce buffers (slower; only shm is affected)",
                     "sysctl -w kernel.yama.ptrace_scope=0"});

  // FI_* variables change what libfabric does: each is named.
  std::vector<std::string> set;
  for (const auto& [name, value] : process.env)
    if (name.rfind("FI_", 0) == 0 && name.rfind("FI_LOG_", 0) != 0)
      set.push_back(name + "=" + value);
  if (set.empty())
    lines.push_back({Verdict::kOk, "FI_* variables", "none set (FI_LOG_* aside)", ""});
  else
    lines.push_back({Verdict::kWarn, "FI_* variables", "set: " + Join(set, set.size()),
                     "unset what you did not mean: each changes what libfabric does "
                     "(FI_EFA_USE_DEVICE_RDMA=0 turns the device's RDMA off; "
                     "FI_EFA_USE_UNSOLICITED_WRITE_RECV=0 "
                     "leaves efa-direct without RMA, as 07 asks no FI_RX_CQ_DATA)"});
  for (auto& line : CheckInstance(host, process)) lines.push_back(std::move(line));
  lines.push_back(CheckCpus(host));
  return lines;
}

// What each instance type is sold with: EFA devices (its network cards with an EFA interface)
// and GPUs. AWS, "Amazon EC2 instance type specifications", accelerated computing, network
// specifications.
struct InstanceShape {
  const char* type;
  size_t efa, gpus;
};
constexpr InstanceShape kInstances[] = {{"p4d.24xlarge", 4, 8},   {"p4de.24xlarge", 4, 8},
                                        {"p5.48xlarge", 32, 8},   {"p5e.48xlarge", 32, 8},
                                        {"p5en.48xlarge", 16, 8}, {"p6-b200.48xlarge", 8, 8}};

std::vector<CheckLine> CheckInstance(const HostFacts& host, const ProcessFacts& process) {
  std::vector<CheckLine> lines;
  const bool gpu_host = !host.host_gpus.empty();
  if (!process.cuda_built)
    lines.push_back({gpu_host ? Verdict::kWarn : Verdict::kOk, "CUDA",
                     "this build has none: pages in host memory only",
                     "rebuild with the CUDA toolkit installed (meson setup -Dcuda=enabled)"});
  else if (CudaFailed(process) && gpu_host)
    lines.push_back({Verdict::kFail, "CUDA", process.cuda,
                     "a CUDA runtime this driver supports, the driver loaded (nvidia-smi)"});
  else
    lines.push_back({Verdict::kOk, "CUDA", process.cuda + (gpu_host ? "" : " (no GPU here)"), ""});

  const InstanceShape* shape = nullptr;
  for (const auto& s : kInstances)
    if (host.instance_type == s.type) shape = &s;
  if (shape == nullptr) {
    lines.push_back({Verdict::kOk, "instance",
                     host.instance_type.empty() ? "type unknown (no DMI product name)"
                                                : host.instance_type + ": no EFA or GPU count "
                                                                       "known for it",
                     ""});
  } else if (host.efa_devices.size() < shape->efa || host.host_gpus.size() < shape->gpus) {
    lines.push_back({Verdict::kFail, "instance",
                     host.instance_type + " comes with " + std::to_string(shape->efa) +
                         " EFA devices and " + std::to_string(shape->gpus) + " GPUs; this host " +
                         "has " + std::to_string(host.efa_devices.size()) + " and " +
                         std::to_string(host.host_gpus.size()) + ": 07 would use only those",
                     "launch it with an EFA interface on every network card (network card "
                     "indices 0 to " +
                         std::to_string(shape->efa - 1) + ", interface type efa)"});
  } else {
    lines.push_back({Verdict::kOk, "instance",
                     host.instance_type + ": " + std::to_string(shape->efa) + " EFA devices and " +
                         std::to_string(shape->gpus) + " GPUs, as it comes",
                     ""});
  }

  if (host.efa_devices.empty()) return lines;
  std::vector<std::string> down;
  for (const auto& [dev, state] : host.efa_port_state)
    if (state.find("ACTIVE") == std::string::npos) down.push_back(dev + " " + state);
  if (down.empty())
    lines.push_back(
        {Verdict::kOk, "EFA ports", std::to_string(host.efa_port_state.size()) + " ACTIVE", ""});
  else
    lines.push_back({Verdict::kFail, "EFA ports",
                     std::to_string(down.size()) + " not ACTIVE: " + Join(down),
                     "dmesg | grep -i efa; the instance's network interfaces (efa attached?)"});
  lines.push_back(
      {host.efa_driver.empty() ? Verdict::kWarn : Verdict::kOk, "efa driver",
       host.efa_driver.empty() ? "no version in /sys/module/efa" : "version " + host.efa_driver,
       "the EFA installer's driver (efa_installer.sh), or the kernel's efa module"});
  lines.push_back(CheckRdmaCore(host));
  return lines;
}

CheckLine CheckCpus(const HostFacts& host) {
  if (host.allowed_cpus.empty() || host.node_cpus.empty())
    return {Verdict::kOk, "CPUs", "affinity or NUMA nodes not readable here", ""};
  size_t all = 0;
  std::vector<std::string> per_node, starved;
  for (const auto& [node, cpus] : host.node_cpus) {
    all += cpus.size();
    size_t mine = 0;
    for (int cpu : cpus)
      mine += std::count(host.allowed_cpus.begin(), host.allowed_cpus.end(), cpu);
    per_node.push_back("node " + std::to_string(node) + ": " + std::to_string(mine));
    const size_t efa = host.node_efa.count(node) ? host.node_efa.at(node) : 0;
    const size_t gpus = host.node_gpus.count(node) ? host.node_gpus.at(node) : 0;
    if (mine == 0 && efa + gpus > 0)
      starved.push_back("node " + std::to_string(node) + " (" + std::to_string(efa) +
                        " EFA devices, " + std::to_string(gpus) + " GPUs)");
  }
  const std::string mine = "may run on " + std::to_string(host.allowed_cpus.size()) + " of " +
                           std::to_string(all) + " CPUs";
  if (starved.empty()) return {Verdict::kOk, "CPUs", mine + "; " + Join(per_node), ""};
  return {Verdict::kWarn, "CPUs",
          mine + ", none of " + Join(starved) +
              ": those groups' threads would poll across the socket link",
          "let it run on every node: Slurm --exclusive or --cpu-bind=none, Kubernetes CPU "
          "requests spanning both sockets, or taskset/numactl naming each node's cores"};
}

CheckLine CheckRdmaCore(const HostFacts& host) {
  // libefa.so.1.<ABI minor>.<rdma-core version>: 1.3.56.0 is rdma-core 56.0.
  const std::string name = host.libefa;
  size_t at = name.find("so.1.");
  at = at == std::string::npos ? at : name.find('.', at + 5);
  if (at == std::string::npos || at + 1 >= name.size())
    return {Verdict::kWarn, "rdma-core", "no libefa.so.1 found in the library folders",
            "the EFA installer (or the distribution's rdma-core, libefa1 on Debian and Ubuntu): "
            "efa needs libefa; libfabric 2.6 builds on rdma-core 31 or later"};
  return {Verdict::kOk, "rdma-core", name.substr(at + 1) + " (" + name + ")", ""};
}

CheckLine UnsolicitedWriteLine(bool direct_for_07, bool direct_with_cq_data) {
  if (direct_for_07)
    return {Verdict::kOk, "unsolicited write recv", "supported: efa-direct takes 07's hints", ""};
  if (!direct_with_cq_data)
    return {Verdict::kOk, "unsolicited write recv",
            "not known: this libfabric offers no efa-direct (2.1 and later do)", ""};
  return {Verdict::kWarn, "unsolicited write recv",
          "not supported by the device or by the rdma-core libfabric was built with: "
          "efa-direct then needs FI_RX_CQ_DATA, which 07 does not ask, so 07 runs on the efa "
          "fabric",
          "a peer that differs in this gets emulated WRITEs (2.6 efa_rdm_rma.c): run both "
          "hosts with the same instance type and EFA installer"};
}

}  // namespace common
