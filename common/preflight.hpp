// The preflight of a host (07_full_p5 --check, scripts/doctor; docs/p5.md, "Check the
// machine"): one line per check, OK, WARN or FAIL, each WARN and FAIL with its fix, and an exit
// code. What the host's files say (/sys, /proc, /dev) is read under a root folder, and the
// checks are a pure function of it, the environment and the process's limits: unit-tested on
// fixture trees shaped like a p5 and like hosts where each check fails (tests/unit/). What
// needs libfabric or the GPU (providers, registration, the NICs 07 would pair) is 07's part.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace common {

enum class Verdict { kOk, kWarn, kFail };

struct CheckLine {
  Verdict verdict = Verdict::kOk;
  std::string name;    // "huge pages"
  std::string detail;  // what was found
  std::string fix;     // what to do (WARN and FAIL)
};

// "FAIL  memlock: 64 KiB at most -> ulimit -l unlimited ..."
std::string FormatCheck(const CheckLine& line);
// 1 when any check failed, else 0 (warnings say what is slower or untested, not broken).
int PreflightExitCode(const std::vector<CheckLine>& lines);

// What the host's files say, read under `root` ("/" or a fixture tree).
struct HostFacts {
  std::vector<std::string> efa_devices;  // /sys/class/infiniband/* whose driver is efa
  size_t uverbs = 0;                   // /dev/infiniband/uverbs*: the devices this process can open
  std::vector<std::string> host_gpus;  // /proc/driver/nvidia/gpus/*: every GPU of the host
  bool nvidia_peermem = false;         // /sys/module/nvidia_peermem: the peer-memory module
  // The efa driver's own way to pin GPU pages (amzn-drivers): its peer-memory module
  // (/sys/module/efa_nv_peermem), or an efa built with GPUDirect (HAVE_EFA_GDR), which then
  // uses the nvidia module's P2P calls and is among its holders (/sys/module/nvidia/holders/efa).
  std::string efa_gpudirect;
  long hugepages = -1;        // /proc/meminfo HugePages_Total (-1: not read)
  long hugepage_kib = 0;      // Hugepagesize
  int ptrace_scope = 0;       // /proc/sys/kernel/yama/ptrace_scope (0 without Yama)
  std::string instance_type;  // /sys/class/dmi/id/product_name (EC2: "p5.48xlarge")
  std::map<std::string, std::string> efa_port_state;  // device -> ports/1/state ("4: ACTIVE")
  std::string efa_driver;                             // /sys/module/efa/version
  std::vector<int> allowed_cpus;  // /proc/self/status Cpus_allowed_list: where this may run
  std::map<int, std::vector<int>> node_cpus;  // /sys/devices/system/node/nodeN/cpulist
  std::map<int, size_t> node_efa, node_gpus;  // each NUMA node's EFA devices and GPUs
  std::string libefa;  // rdma-core's libefa.so.1.A.B.C in the library folders ("" if none)
};
HostFacts ReadHostFacts(const std::string& root);

// What the process itself sees.
struct ProcessFacts {
  std::map<std::string, std::string> env;  // the environment
  uint64_t memlock = UINT64_MAX;           // RLIMIT_MEMLOCK, soft; UINT64_MAX: unlimited
  int visible_gpus = 0;                    // CUDA's device count here
  std::optional<bool> dmabuf;              // a test allocation exported as a dmabuf (no GPU: none)
  bool cuda_built = true;                  // this build has CUDA (meson -Dcuda)
  std::string cuda;                        // CudaStatus(): versions, or the runtime's error
  std::string cudart;     // with GPUs: why libfabric cannot load the CUDA runtime ("" if it can)
  bool ipc_lock = false;  // CAP_IPC_LOCK in effect: the kernel pins past RLIMIT_MEMLOCK
};
ProcessFacts ReadProcessFacts(char** environ_list);

// The checks of files and process: EFA devices, /dev/infiniband, GPUs and what confines them,
// peer memory (dmabuf or nvidia_peermem), huge pages, memlock, ptrace scope, FI_* variables.
std::vector<CheckLine> CheckHost(const HostFacts& host, const ProcessFacts& process);
// The instance against what its type is sold with (EFA devices and GPUs), each EFA port's
// state and the efa driver's version, and this build's CUDA. CheckHost adds them.
std::vector<CheckLine> CheckInstance(const HostFacts& host, const ProcessFacts& process);
// The CPUs this process may run on against the NUMA nodes of its NICs and GPUs: a node with
// devices and none of its cores leaves those groups' threads across the socket link.
CheckLine CheckCpus(const HostFacts& host);
// rdma-core's version, from libefa's file name (its ABI, then rdma-core's version: 1.3.56.0).
CheckLine CheckRdmaCore(const HostFacts& host);
// efa's unsolicited-write-recv support, as libfabric 2.1 and later show it: efa-direct is
// offered for 07's hints (FI_RMA, no FI_RX_CQ_DATA) only where the device and the rdma-core
// libfabric was built with support it; with FI_RX_CQ_DATA it is offered either way (2.6
// prov/efa/src/efa_user_info.c). 07 asks both ways (07_full_p5/check.cpp).
CheckLine UnsolicitedWriteLine(bool direct_for_07, bool direct_with_cq_data);

}  // namespace common
