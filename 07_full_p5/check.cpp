// 07_full_p5 --check (scripts/doctor): is this host ready to run the engine, and will it
// measure what it says? The checks of the host's files (common/preflight.hpp), then what only a
// program that loads libfabric and the GPU can ask: the libfabric it loaded against the headers
// it was built with, the providers and fabrics it offers, whether the provider takes GPU memory
// and how (GPUDirect RDMA: the NIC alone), whether efa's WRITE is the device's, and the NICs
// this program would pair with each GPU. One line each, OK, WARN or FAIL with the fix.

#include <rdma/fabric.h>

#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engine.hpp"
#include "error.hpp"
#include "preflight.hpp"
#include "provider.hpp"

extern char** environ;

namespace p5 {

namespace {

// The libfabric this process loaded, against its headers.
CheckLine LibfabricLine() {
  const uint32_t loaded = fi_version();
  const std::string problem = LibraryProblem(loaded, ApiVersion());
  const std::string detail =
      VersionText(loaded) + " loaded, built with its " + VersionText(ApiVersion()) + " headers";
  if (!problem.empty())
    return {Verdict::kFail, "libfabric", detail + ": " + problem,
            "run with the libfabric it was built against (LIBFABRIC=PREFIX scripts/build)"};
  return {Verdict::kOk, "libfabric", detail, ""};
}

// The fabrics efa offers for 07's own hints; with_cq_data adds FI_RX_CQ_DATA, which 07 does
// not ask, to see whether efa-direct is held back only by unsolicited write recv.
std::set<std::string> EfaFabrics(const FiInfoPtr& engine_hints, bool with_cq_data) {
  FiInfoPtr hints(fi_dupinfo(engine_hints.get()));
  free(hints->fabric_attr->prov_name);
  hints->fabric_attr->prov_name = strdup("efa");
  if (with_cq_data) {
    hints->mode |= FI_RX_CQ_DATA;
    hints->rx_attr->mode |= FI_RX_CQ_DATA;
  }
  fi_info* found = nullptr;
  std::set<std::string> fabrics;
  if (fi_getinfo(ApiVersion(), nullptr, nullptr, 0, hints.get(), &found) == 0) {
    FiInfoPtr owner(found);
    for (const fi_info* i = found; i != nullptr; i = i->next)
      if (i->fabric_attr->name) fabrics.insert(i->fabric_attr->name);
  }
  return fabrics;
}

// The providers offered; on a host with EFA devices, efa and the fabrics it offers for what 07
// asks (its own hints: efa-direct, for instance, only where the device takes unsolicited
// RDMA WRITEs, since 07 asks no FI_RX_CQ_DATA).
std::vector<CheckLine> ProviderLines(bool efa_devices, const FiInfoPtr& engine_hints) {
  std::vector<CheckLine> lines;
  const std::vector<std::string> providers = AvailableProviders();
  std::string list;
  bool efa = false;
  for (const auto& p : providers) {
    list += (list.empty() ? "" : ", ") + p;
    efa = efa || p == "efa";
  }
  if (providers.empty())
    lines.push_back({Verdict::kFail, "providers", "libfabric offers none", "check FI_PROVIDER"});
  else if (efa_devices && !efa)
    lines.push_back({Verdict::kFail, "providers",
                     list + ": EFA devices, but this libfabric has no efa provider (Debian's and "
                            "Ubuntu's are built without it)",
                     "build against the EFA installer's: LIBFABRIC=/opt/amazon/efa scripts/build"});
  else
    lines.push_back({Verdict::kOk, "providers", list, ""});
  if (!efa) return lines;
  FiInfoPtr hints(fi_dupinfo(engine_hints.get()));
  std::set<std::string> fabrics = EfaFabrics(hints, false);
  std::string without_hmem;  // efa offers fabrics, but none for GPU memory: why
  if (fabrics.empty() && (hints->caps & FI_HMEM)) {
    hints->caps &= ~FI_HMEM;
    fabrics = EfaFabrics(hints, false);
    if (!fabrics.empty()) {
      const std::string cudart = CudaRuntimeProblem();
      without_hmem = cudart.empty() ? "this libfabric was built without CUDA" : cudart;
    }
  }
  std::string names;
  for (const auto& f : fabrics) names += (names.empty() ? "" : ", ") + f;
  if (!without_hmem.empty())
    lines.push_back(
        {Verdict::kFail, "efa fabrics",
         names + ", none for GPU memory (FI_HMEM): " +
             without_hmem.substr(0, without_hmem.find("): ") + 1),
         without_hmem.find("libcudart") != std::string::npos
             ? "add the CUDA toolkit's lib64 to LD_LIBRARY_PATH (/usr/local/cuda/lib64)"
             : "the EFA installer's libfabric: LIBFABRIC=/opt/amazon/efa scripts/build"});
  else
    lines.push_back(
        {fabrics.count("efa") ? Verdict::kOk : Verdict::kFail, "efa fabrics",
         names.empty()
             ? "none"
             : names + (fabrics.count("efa-direct") ? "" : " (efa-direct came with libfabric 2.1)"),
         "the EFA installer's libfabric"});
  lines.push_back(UnsolicitedWriteLine(fabrics.count("efa-direct") > 0,
                                       EfaFabrics(hints, true).count("efa-direct") > 0));
  return lines;
}

// The NICs each group gets, as this program pairs them: a GPU's NICs under its PCIe switch.
CheckLine PairingLine(const Plan& plan) {
  std::string detail;
  std::set<size_t> counts;
  bool gpu_without_nic = false;
  for (const auto& g : plan.groups) {
    std::string nics;
    for (size_t lane = 0; lane < plan.lanes.size(); ++lane)
      if (&plan.groups[plan.group_of[lane]] == &g)
        nics += std::string(nics.empty() ? "" : " ") + plan.lanes[lane]->domain_attr->name;
    const std::string who =
        g.gpu ? "cuda:" + std::to_string(*g.gpu) : "host NUMA" + std::to_string(g.numa);
    detail += (detail.empty() ? "" : "; ") + who + ": " + (nics.empty() ? "no NIC" : nics);
    counts.insert(g.nics.size());
    gpu_without_nic = gpu_without_nic || (g.gpu && g.nics.empty());
  }
  if (gpu_without_nic || counts.size() > 1)
    return {Verdict::kWarn, "NICs per GPU", detail,
            "a GPU with fewer NICs than the others caps the whole run: check the PCIe tree "
            "(nvidia-smi topo -m) and that every NIC is visible here"};
  return {Verdict::kOk, "NICs per GPU", detail, ""};
}

// Whether the provider of lane 0 takes GPU memory, and how; and efa's WRITE.
std::vector<CheckLine> GpuPathLines(const Plan& plan, bool gpus, bool efa_devices,
                                    const Options& options, const std::string& no_hmem) {
  std::vector<CheckLine> lines;
  const std::string provider = plan.lanes[0]->fabric_attr->prov_name;
  Network probe;
  try {
    probe = Network::Open(FiInfoPtr(fi_dupinfo(plan.lanes[0].get())), WaitMode::kSpin);
  } catch (const std::exception& e) {
    return {{Verdict::kFail, "GPU memory in libfabric",
             provider + ": lane 0's endpoint did not open: " + e.what(),
             "-p PROVIDER and --domain name what there is (fi_info)"}};
  }
  if (!gpus) {
    lines.push_back({Verdict::kOk, "GPU memory in libfabric", "not checked: no GPU here", ""});
  } else
    try {
      // As 07 would choose (--gpu-path auto: direct on a p5, where anything less is refused).
      const MemoryPath path = ChooseMemoryPath(probe.domain.get(), *probe.info, MemoryKind::kCuda,
                                               GpuPathMode::kAuto, no_hmem, options.dmabuf);
      const bool on_efa = provider == "efa";
      const std::string detail = provider + ": " + DescribeMemoryPath(path);
      if (!path.provider_copies &&
          (path.nic_only || (path.path == PageBuffer::Path::kGpuDirect && !on_efa)))
        lines.push_back({Verdict::kOk, "GPU memory in libfabric", detail, ""});
      else
        lines.push_back({efa_devices ? Verdict::kFail : Verdict::kWarn, "GPU memory in libfabric",
                         detail,
                         path.path == PageBuffer::Path::kGpuStaged
                             ? "a libfabric built with CUDA (the EFA installer's: "
                               "LIBFABRIC=/opt/amazon/efa)"
                         : Has(Quirk::kCopiesGpuThroughSockets, *probe.info)
                             ? "an RDMA NIC's provider (-p efa, verbs) where the host has one: "
                               "tcp always copies"
                             : "GPUDirect RDMA: dmabuf or nvidia_peermem (the line above)"});
    } catch (const std::exception& e) {  // direct where the instance is made for it, and not here
      lines.push_back({Verdict::kFail, "GPU memory in libfabric", provider + ": " + e.what(),
                       no_hmem.find("libcudart") != std::string::npos
                           ? "the CUDA runtime line above"
                           : "GPUDirect RDMA: dmabuf, nvidia_peermem or efa_nv_peermem (the peer "
                             "memory line above), and the EFA installer's libfabric"});
    }
  if (const auto emulated = EmulatedWrite(probe.ep.get()))
    lines.push_back({*emulated ? Verdict::kFail : Verdict::kOk, "efa RDMA WRITE",
                     *emulated ? "emulated with messages (FI_OPT_EFA_EMULATED_WRITE true)"
                               : "by the device (FI_OPT_EFA_EMULATED_WRITE false)",
                     "a NIC and rdma-core with RDMA write (p5's do), and FI_EFA_USE_DEVICE_RDMA "
                     "unset"});
  else
    lines.push_back({Verdict::kOk, "efa RDMA WRITE",
                     "not asked: " + provider + " is not efa (or headers before 1.18)", ""});
  return lines;
}

}  // namespace

int RunCheck(const Options& options) {
  const HostFacts host = ReadHostFacts("/");
  const ProcessFacts process = ReadProcessFacts(environ);
  std::vector<CheckLine> lines = CheckHost(host, process);
  lines.push_back(LibfabricLine());
  const MemoryKind memory = process.visible_gpus > 0 ? MemoryKind::kCuda : MemoryKind::kHost;
  for (auto& l : ProviderLines(!host.efa_devices.empty(), EngineHints(options, memory)))
    lines.push_back(l);
  std::optional<Plan> plan;
  std::string no_hmem;
  try {
    plan = FindNics(options, {}, memory, &no_hmem, false);
    lines.push_back(PairingLine(*plan));
  } catch (const UsageError&) {
    throw;  // -p or --domain naming nothing here: exit 2, as for any program
  } catch (const std::exception& e) {
    lines.push_back({Verdict::kFail, "NICs per GPU", std::string("no NIC to pair: ") + e.what(),
                     "-p PROVIDER and --domain name what there is (fi_info)"});
  }
  // Each its own line: a GPU path that fails does not hide the pairing or efa's WRITE.
  if (plan)
    for (auto& l :
         GpuPathLines(*plan, process.visible_gpus > 0, !host.efa_devices.empty(), options, no_hmem))
      lines.push_back(l);
  size_t counts[3] = {0, 0, 0};
  for (const auto& l : lines) {
    std::printf("%s\n", FormatCheck(l).c_str());
    ++counts[static_cast<int>(l.verdict)];
  }
  const int rc = PreflightExitCode(lines);
  std::printf("%zu OK, %zu WARN, %zu FAIL: %s\n", counts[0], counts[1], counts[2],
              rc == 0 ? "ready (each WARN says what is slower or untested)" : "not ready");
  return rc;
}

}  // namespace p5
