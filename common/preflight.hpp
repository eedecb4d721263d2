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
  long hugepages = -1;                 // /proc/meminfo HugePages_Total (-1: not read)
  long hugepage_kib = 0;               // Hugepagesize
  int ptrace_scope = 0;                // /proc/sys/kernel/yama/ptrace_scope (0 without Yama)
  std::string instance_type;           // /sys/class/dmi/id/product_name (EC2: "p5.48xlarge")
  std::map<std::string, std::string> efa_port_state;  // device -> ports/1/state ("4: ACTIVE")
  std::string efa_driver;                             // /sys/module/efa/version
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
};
ProcessFacts ReadProcessFacts(char** environ_list);

// The checks of files and process: EFA devices, /dev/infiniband, GPUs and what confines them,
// peer memory (dmabuf or nvidia_peermem), huge pages, memlock, ptrace scope, FI_* variables.
std::vector<CheckLine> CheckHost(const HostFacts& host, const ProcessFacts& process);
// The instance against what its type is sold with (EFA devices and GPUs), each EFA port's
// state and the efa driver's version, and this build's CUDA. CheckHost adds them.
std::vector<CheckLine> CheckInstance(const HostFacts& host, const ProcessFacts& process);

}  // namespace common
