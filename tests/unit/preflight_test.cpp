// The preflight's checks of a host's files (common/preflight.hpp) on fixture trees built here:
// a p5 (32 EFA devices, 8 GPUs, huge pages, memlock unlimited) where every line is OK, and
// hosts where each check fails, each line read back.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "preflight.hpp"

using namespace common;
namespace fs = std::filesystem;

namespace {

// A fixture tree under a fresh temporary folder, removed at the end of the test.
class Tree {
 public:
  Tree() {
    char pattern[] = "/tmp/preflight-XXXXXX";
    root_ = mkdtemp(pattern);
  }
  ~Tree() { fs::remove_all(root_); }
  const std::string& root() const { return root_; }
  void File(const std::string& path, const std::string& text) {
    fs::create_directories((fs::path(root_) / path).parent_path());
    std::ofstream(fs::path(root_) / path) << text;
  }
  void Dir(const std::string& path) { fs::create_directories(fs::path(root_) / path); }
  void Link(const std::string& path, const std::string& target) {
    fs::create_directories((fs::path(root_) / path).parent_path());
    fs::create_directory_symlink(target, fs::path(root_) / path);
  }

 private:
  std::string root_;
};

// The p5 of docs/p5-facts.md: 32 EFA devices rdmap<bus>s0 (4 per GPU switch), 8 GPUs.
void MakeP5(Tree& t) {
  const int first_nic_bus[] = {0x4f, 0x60, 0x71, 0x82, 0x93, 0xa4, 0xb5, 0xc6};
  const char* gpu_bus[] = {"53", "64", "75", "86", "97", "a8", "b9", "ca"};
  int uverbs = 0;
  for (int g = 0; g < 8; ++g) {
    for (int k = 0; k < 4; ++k) {
      const std::string dev = "rdmap" + std::to_string(first_nic_bus[g] + k) + "s0";
      t.Link("sys/class/infiniband/" + dev + "/device/driver", "../../../../bus/pci/drivers/efa");
      t.File("sys/class/infiniband/" + dev + "/ports/1/state", "4: ACTIVE\n");
      t.File("sys/class/infiniband/" + dev + "/device/numa_node", g < 4 ? "0\n" : "1\n");
      t.File("dev/infiniband/uverbs" + std::to_string(uverbs++), "");
    }
    const std::string gpu = std::string("0000:") + gpu_bus[g] + ":00.0";
    t.Dir("proc/driver/nvidia/gpus/" + gpu);
    t.File("sys/bus/pci/devices/" + gpu + "/numa_node", g < 4 ? "0\n" : "1\n");
  }
  // Two sockets of 48 cores, two threads each: the kernel numbers the second threads last.
  t.File("sys/devices/system/node/node0/cpulist", "0-47,96-143\n");
  t.File("sys/devices/system/node/node1/cpulist", "48-95,144-191\n");
  t.File("proc/self/status", "Name:\tp5\nCpus_allowed:\tff\nCpus_allowed_list:\t0-191\n");
  t.File("usr/lib/x86_64-linux-gnu/libefa.so.1.3.56.0", "");
  t.File("usr/lib/x86_64-linux-gnu/libefa.so.1", "");
  t.File("proc/meminfo",
         "MemTotal:       2097152000 kB\nHugePages_Total:    5128\nHugePages_Free:     5128\n"
         "Hugepagesize:       2048 kB\n");
  t.File("proc/sys/kernel/yama/ptrace_scope", "0\n");
  t.File("sys/class/dmi/id/product_name", "p5.48xlarge\n");
  t.File("sys/module/efa/version", "2.13.0g\n");
}

ProcessFacts P5Process() {
  ProcessFacts p;
  p.visible_gpus = 8;
  p.dmabuf = true;
  p.cuda = "runtime 12.4, driver 12.4";
  return p;
}

const CheckLine& Line(const std::vector<CheckLine>& lines, const std::string& name) {
  for (const auto& l : lines)
    if (l.name == name) return l;
  static CheckLine none{Verdict::kFail, "missing", "no such line", ""};
  ADD_FAILURE() << "no line named " << name;
  return none;
}

std::string All(const std::vector<CheckLine>& lines) {
  std::string text;
  for (const auto& l : lines) text += FormatCheck(l) + "\n";
  return text;
}

}  // namespace

TEST(Preflight, P5IsReady) {
  Tree t;
  MakeP5(t);
  const HostFacts host = ReadHostFacts(t.root());
  EXPECT_EQ(host.efa_devices.size(), 32u);
  EXPECT_EQ(host.efa_devices.front(), "rdmap79s0");  // the kernel's order, not the text's
  EXPECT_EQ(host.efa_devices.back(), "rdmap201s0");
  EXPECT_EQ(host.uverbs, 32u);
  EXPECT_EQ(host.host_gpus.size(), 8u);
  EXPECT_EQ(host.hugepages, 5128);
  const auto lines = CheckHost(host, P5Process());
  for (const auto& l : lines) EXPECT_EQ(l.verdict, Verdict::kOk) << FormatCheck(l);
  EXPECT_EQ(PreflightExitCode(lines), 0);
  EXPECT_EQ(FormatCheck(Line(lines, "EFA devices")),
            "OK    EFA devices: 32 (rdmap79s0, rdmap80s0, rdmap81s0, rdmap82s0 ... rdmap201s0)");
  EXPECT_EQ(Line(lines, "GPUs").detail, "8 visible");
  EXPECT_EQ(Line(lines, "huge pages").detail, "5128 x 2048 kB reserved");
  EXPECT_EQ(Line(lines, "instance").detail, "p5.48xlarge: 32 EFA devices and 8 GPUs, as it comes");
  EXPECT_EQ(Line(lines, "EFA ports").detail, "32 ACTIVE");
  EXPECT_EQ(Line(lines, "efa driver").detail, "version 2.13.0g");
  EXPECT_EQ(Line(lines, "CUDA").detail, "runtime 12.4, driver 12.4");
  EXPECT_EQ(Line(lines, "CPUs").detail, "may run on 192 of 192 CPUs; node 0: 96, node 1: 96");
  EXPECT_EQ(Line(lines, "rdma-core").detail, "56.0 (libefa.so.1.3.56.0)");
  std::printf("%s", All(lines).c_str());
}

// A job given the first socket's cores only (a Slurm --cpu-bind, a Kubernetes CPU request that
// fits one socket): node 1's 16 EFA devices and 4 GPUs get no CPU of their own.
TEST(Preflight, CpusOfOneSocketOnly) {
  Tree t;
  MakeP5(t);
  t.File("proc/self/status", "Cpus_allowed_list:\t0-47\n");
  const HostFacts host = ReadHostFacts(t.root());
  EXPECT_EQ(host.allowed_cpus.size(), 48u);
  EXPECT_EQ(host.node_efa.at(1), 16u);
  EXPECT_EQ(host.node_gpus.at(1), 4u);
  const CheckLine cpus = CheckCpus(host);
  EXPECT_EQ(cpus.verdict, Verdict::kWarn);
  EXPECT_EQ(cpus.detail,
            "may run on 48 of 192 CPUs, none of node 1 (16 EFA devices, 4 GPUs): those groups' "
            "threads would poll across the socket link");
  EXPECT_NE(cpus.fix.find("--cpu-bind=none"), std::string::npos);
  EXPECT_EQ(PreflightExitCode(CheckHost(host, P5Process())), 0);  // slower, not broken
}

// No libefa: the efa provider cannot load; the line says where rdma-core comes from.
TEST(Preflight, NoRdmaCore) {
  Tree t;
  MakeP5(t);
  fs::remove_all(fs::path(t.root()) / "usr/lib");
  const CheckLine line = Line(CheckHost(ReadHostFacts(t.root()), P5Process()), "rdma-core");
  EXPECT_EQ(line.verdict, Verdict::kWarn);
  EXPECT_EQ(line.detail, "no libefa.so.1 found in the library folders");
  EXPECT_NE(line.fix.find("EFA installer"), std::string::npos);
}

// Unsolicited write recv, as efa's fabrics for 07's hints and with FI_RX_CQ_DATA show it.
TEST(Preflight, UnsolicitedWriteRecv) {
  EXPECT_EQ(UnsolicitedWriteLine(true, true).verdict, Verdict::kOk);
  EXPECT_EQ(UnsolicitedWriteLine(true, true).detail, "supported: efa-direct takes 07's hints");
  const CheckLine old_libfabric = UnsolicitedWriteLine(false, false);
  EXPECT_EQ(old_libfabric.verdict, Verdict::kOk);
  EXPECT_NE(old_libfabric.detail.find("not known"), std::string::npos);
  const CheckLine lacking = UnsolicitedWriteLine(false, true);
  EXPECT_EQ(lacking.verdict, Verdict::kWarn);
  EXPECT_NE(lacking.detail.find("07 runs on the efa fabric"), std::string::npos);
  EXPECT_NE(lacking.fix.find("emulated WRITEs"), std::string::npos);
}

// A p5 launched with 16 of its 32 EFA interfaces, one port down: it must not pass.
TEST(Preflight, P5WithHalfItsEfaAndAPortDown) {
  Tree t;
  MakeP5(t);
  for (int first : {0x4f, 0x60, 0x71, 0x82})  // the NICs of the first 4 GPUs are not there
    for (int k = 0; k < 4; ++k)
      fs::remove_all(fs::path(t.root()) /
                     ("sys/class/infiniband/rdmap" + std::to_string(first + k) + "s0"));
  t.File("sys/class/infiniband/rdmap201s0/ports/1/state", "1: DOWN\n");
  const auto lines = CheckHost(ReadHostFacts(t.root()), P5Process());
  const CheckLine& instance = Line(lines, "instance");
  EXPECT_EQ(instance.verdict, Verdict::kFail);
  EXPECT_EQ(instance.detail,
            "p5.48xlarge comes with 32 EFA devices and 8 GPUs; this host has 16 "
            "and 8: 07 would use only those");
  EXPECT_NE(instance.fix.find("network card indices 0 to 31"), std::string::npos);
  EXPECT_EQ(Line(lines, "EFA ports").verdict, Verdict::kFail);
  EXPECT_EQ(Line(lines, "EFA ports").detail, "1 not ACTIVE: rdmap201s0 1: DOWN");
  EXPECT_EQ(PreflightExitCode(lines), 1);
}

// A GPU host whose build has no CUDA, or whose CUDA runtime the driver refuses: the GPUs line
// names that, not Slurm or Kubernetes.
TEST(Preflight, GpusUnseenForWantOfCuda) {
  Tree t;
  MakeP5(t);
  ProcessFacts p = P5Process();
  p.visible_gpus = 0;
  p.dmabuf.reset();
  p.cuda_built = false;
  p.cuda = "";
  auto lines = CheckHost(ReadHostFacts(t.root()), p);
  EXPECT_EQ(Line(lines, "GPUs").detail,
            "the driver lists 8, and this build has no CUDA: it moves host memory only");
  EXPECT_NE(Line(lines, "GPUs").fix.find("-Dcuda=enabled"), std::string::npos);
  EXPECT_EQ(Line(lines, "CUDA").verdict, Verdict::kWarn);
  p.cuda_built = true;
  p.cuda =
      "runtime 13.0, driver 12.2: CUDA driver version is insufficient for CUDA runtime version";
  lines = CheckHost(ReadHostFacts(t.root()), p);
  EXPECT_EQ(Line(lines, "GPUs").verdict, Verdict::kFail);
  EXPECT_NE(Line(lines, "GPUs").detail.find("CUDA says runtime 13.0, driver 12.2: CUDA driver "),
            std::string::npos);
  EXPECT_EQ(Line(lines, "CUDA").verdict, Verdict::kFail);
  std::printf("%s", All(lines).c_str());
}

TEST(Preflight, ContainerWithoutDevInfiniband) {
  Tree t;
  MakeP5(t);
  fs::remove_all(fs::path(t.root()) / "dev/infiniband");
  const auto lines = CheckHost(ReadHostFacts(t.root()), P5Process());
  const CheckLine& l = Line(lines, "/dev/infiniband");
  EXPECT_EQ(l.verdict, Verdict::kFail);
  EXPECT_EQ(l.detail,
            "32 EFA devices in /sys, 0 in /dev/infiniband: this container was not given them");
  EXPECT_NE(l.fix.find("vpc.amazonaws.com/efa"), std::string::npos);
  EXPECT_EQ(PreflightExitCode(lines), 1);
}

TEST(Preflight, GpusConfinedOrHidden) {
  Tree t;
  MakeP5(t);
  ProcessFacts p = P5Process();
  p.visible_gpus = 1;
  p.env["CUDA_VISIBLE_DEVICES"] = "0";
  auto lines = CheckHost(ReadHostFacts(t.root()), p);
  EXPECT_EQ(Line(lines, "GPUs").verdict, Verdict::kWarn);
  EXPECT_EQ(Line(lines, "GPUs").detail,
            "this process sees 1 of the host's 8 (CUDA_VISIBLE_DEVICES=0): 07 uses those and only "
            "the NICs under their switches");
  EXPECT_EQ(PreflightExitCode(lines), 0);

  p.visible_gpus = 0;  // a Slurm step that asked for no GPU, where Slurm confines devices
  p.env.erase("CUDA_VISIBLE_DEVICES");
  p.env["SLURM_JOB_GPUS"] = "";
  p.dmabuf.reset();
  lines = CheckHost(ReadHostFacts(t.root()), p);
  EXPECT_EQ(Line(lines, "GPUs").verdict, Verdict::kFail);
  EXPECT_NE(Line(lines, "GPUs").detail.find("the driver lists 8, this process sees none"),
            std::string::npos);
  EXPECT_NE(Line(lines, "GPUs").fix.find("--gpus-per-node=8"), std::string::npos);
  EXPECT_EQ(PreflightExitCode(lines), 1);
}

TEST(Preflight, NoPeerMemory) {
  Tree t;
  MakeP5(t);
  ProcessFacts p = P5Process();
  p.dmabuf = false;
  auto lines = CheckHost(ReadHostFacts(t.root()), p);
  EXPECT_EQ(Line(lines, "GPU peer memory").verdict, Verdict::kFail);
  EXPECT_NE(Line(lines, "GPU peer memory").fix.find("modprobe nvidia_peermem"), std::string::npos);
  t.Dir("sys/module/nvidia_peermem");  // the module makes up for it
  lines = CheckHost(ReadHostFacts(t.root()), p);
  EXPECT_EQ(Line(lines, "GPU peer memory").verdict, Verdict::kOk);
  EXPECT_EQ(Line(lines, "GPU peer memory").detail, "no dmabuf export; nvidia_peermem loaded");
}

// The efa driver pins GPU pages itself where it has its own peer-memory module
// (amzn-drivers' efa_nv_peermem) or was built with GPUDirect (it then holds the nvidia module):
// neither dmabuf nor nvidia_peermem is needed for efa then.
TEST(Preflight, EfasOwnGpuDirectIsPeerMemory) {
  for (const char* dir : {"sys/module/efa_nv_peermem", "sys/module/nvidia/holders/efa"}) {
    Tree t;
    MakeP5(t);
    t.Dir(dir);
    ProcessFacts p = P5Process();
    p.dmabuf = false;
    const auto lines = CheckHost(ReadHostFacts(t.root()), p);
    EXPECT_EQ(Line(lines, "GPU peer memory").verdict, Verdict::kOk) << dir;
    EXPECT_EQ(Line(lines, "GPU peer memory").detail,
              std::string("no dmabuf export; ") +
                  (std::string(dir).find("holders") != std::string::npos
                       ? "efa built with GPUDirect (it holds the nvidia module)"
                       : "efa_nv_peermem loaded"));
  }
}

// A libfabric that loads the CUDA runtime at run time and cannot: its own line, with its fix,
// and the run is not ready (no provider would offer GPU memory).
TEST(Preflight, CudaRuntimeLibfabricCannotLoad) {
  Tree t;
  MakeP5(t);
  ProcessFacts p = P5Process();
  p.cudart =
      "libfabric cannot load libcudart.so (libcudart.so: cannot open shared object file: "
      "No such file or directory): add the CUDA toolkit's lib64 to LD_LIBRARY_PATH "
      "(/usr/local/cuda/lib64)";
  const auto lines = CheckHost(ReadHostFacts(t.root()), p);
  const CheckLine& line = Line(lines, "CUDA runtime for libfabric");
  EXPECT_EQ(line.verdict, Verdict::kFail);
  EXPECT_EQ(line.detail,
            "libfabric cannot load libcudart.so (libcudart.so: cannot open shared object file: No "
            "such file or directory): no provider offers GPU memory (FI_HMEM)");
  EXPECT_NE(line.fix.find("LD_LIBRARY_PATH"), std::string::npos);
  EXPECT_EQ(PreflightExitCode(lines), 1);
  p.cudart.clear();  // one that loads it has no such line
  for (const auto& l : CheckHost(ReadHostFacts(t.root()), p))
    EXPECT_NE(l.name, "CUDA runtime for libfabric");
}

// RLIMIT_MEMLOCK does not hold a process with CAP_IPC_LOCK (ib_umem_get checks it only
// without): a finite limit there is fine, as in the pods, which add IPC_LOCK for this.
TEST(Preflight, IpcLockLiftsTheMemlockLimit) {
  Tree t;
  MakeP5(t);
  ProcessFacts p = P5Process();
  p.memlock = 64 << 10;
  p.ipc_lock = true;
  const auto lines = CheckHost(ReadHostFacts(t.root()), p);
  EXPECT_EQ(Line(lines, "memlock").verdict, Verdict::kOk);
  EXPECT_EQ(Line(lines, "memlock").detail,
            "64 KiB, but CAP_IPC_LOCK: the kernel pins registrations past the limit");
}

TEST(Preflight, NoHugePagesMemlockPtraceAndVariables) {
  Tree t;
  MakeP5(t);
  t.File("proc/meminfo", "HugePages_Total:       0\nHugepagesize:       2048 kB\n");
  t.File("proc/sys/kernel/yama/ptrace_scope", "1\n");
  ProcessFacts p = P5Process();
  p.memlock = 64 << 10;
  p.env["FI_EFA_USE_DEVICE_RDMA"] = "0";
  p.env["FI_LOG_LEVEL"] = "warn";  // logging changes nothing
  const auto lines = CheckHost(ReadHostFacts(t.root()), p);
  EXPECT_EQ(Line(lines, "huge pages").verdict, Verdict::kWarn);
  EXPECT_NE(Line(lines, "huge pages").fix.find("vm.nr_hugepages"), std::string::npos);
  EXPECT_EQ(FormatCheck(Line(lines, "memlock")).rfind("FAIL  memlock: 64 KiB at most", 0), 0u);
  EXPECT_EQ(Line(lines, "ptrace scope").verdict, Verdict::kWarn);
  EXPECT_EQ(Line(lines, "FI_* variables").detail, "set: FI_EFA_USE_DEVICE_RDMA=0");
  EXPECT_EQ(PreflightExitCode(lines), 1);
  std::printf("%s", All(lines).c_str());
}

TEST(Preflight, HostWithoutEfaOrGpu) {
  Tree t;  // an empty machine: no /sys/class/infiniband, no NVIDIA driver, no Yama
  t.File("proc/meminfo", "HugePages_Total:       0\nHugepagesize:       2048 kB\n");
  ProcessFacts p;
  p.memlock = 8 << 20;
  const auto lines = CheckHost(ReadHostFacts(t.root()), p);
  EXPECT_EQ(Line(lines, "EFA devices").verdict, Verdict::kWarn);
  EXPECT_NE(Line(lines, "EFA devices").detail.find("not an EFA host"), std::string::npos);
  EXPECT_EQ(Line(lines, "/dev/infiniband").verdict, Verdict::kOk);
  EXPECT_EQ(Line(lines, "GPUs").verdict, Verdict::kWarn);
  EXPECT_EQ(Line(lines, "GPU peer memory").verdict, Verdict::kOk);
  EXPECT_EQ(Line(lines, "huge pages").verdict, Verdict::kOk);  // only efa asks for them
  EXPECT_EQ(Line(lines, "memlock").verdict, Verdict::kWarn);   // tcp and shm pin nothing
  EXPECT_EQ(Line(lines, "ptrace scope").verdict, Verdict::kOk);
  EXPECT_EQ(PreflightExitCode(lines), 0);
}
