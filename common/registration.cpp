#include "registration.hpp"

#include <rdma/fi_endpoint.h>
#include <rdma/fi_ext.h>

#include <cctype>
#include <fstream>
#include <random>

#include "error.hpp"
#include "provider_quirks.hpp"

namespace common {

uint64_t RandomKey(size_t key_size) {
  static thread_local std::mt19937_64 rng{(static_cast<uint64_t>(std::random_device{}()) << 32) ^
                                          std::random_device{}()};
  const uint64_t key = rng();
  return key_size >= 8 ? key : key & ((1ull << (8 * key_size)) - 1);
}

MrPtr RegisterMemory(fid_domain* domain, const fi_info& info, void* data, size_t size,
                     uint64_t access, const CudaBuffer* gpu, bool try_dmabuf, bool* dmabuf) {
  fi_mr_attr attr{};
  iovec iov{data, size};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = access;
  // Ignored where the provider picks keys (FI_MR_PROV_KEY); fi_mr_key() tells the key either way.
  attr.requested_key = RandomKey(info.domain_attr->mr_key_size);
  uint64_t flags = 0;
#ifdef FI_MR_DMABUF
  fi_mr_dmabuf buf{};  // must outlive fi_mr_regattr: attr.dmabuf shares storage with mr_iov
#endif
  UniqueFd dmabuf_fd;
  if (gpu != nullptr) {
    gpu->MakeCurrent();  // a data thread may register before any CUDA call of its own
    attr.iface = FI_HMEM_CUDA;
    attr.device.cuda = gpu->device();
    // Device memory, not managed: with it shm moves pages by CUDA IPC. CUDA IPC opens
    // cudaMalloc's allocations only (VMM memory is shared by cuMemExportToShareableHandle),
    // so VMM memory goes without it, and shm copies through host memory instead.
    if (gpu->allocation() == GpuAllocation::kMalloc) flags |= FI_HMEM_DEVICE_ONLY;
#ifdef FI_MR_DMABUF
    if (try_dmabuf) dmabuf_fd = gpu->ExportDmabuf(data, size);
    if (dmabuf_fd.get() >= 0) {
      buf.fd = dmabuf_fd.get();
      buf.len = size;
      buf.base_addr = data;
      attr.dmabuf = &buf;
      flags |= FI_MR_DMABUF;
    }
#else
    (void)try_dmabuf;
#endif
  }
  if (dmabuf != nullptr) *dmabuf = dmabuf_fd.get() >= 0;
  fid_mr* mr = nullptr;
  FI_CHECK(fi_mr_regattr(domain, &attr, flags, &mr));
  return MrPtr(mr);
}

MrPtr RegisterPages(fid_domain* domain, const fi_info& info, const PageBuffer& pages,
                    uint64_t access, const MemoryPath& path) {
  const bool direct = pages.path() == PageBuffer::Path::kGpuDirect;
  return RegisterMemory(domain, info, pages.nic_data(), pages.size(), access,
                        direct ? &pages.gpu() : nullptr, path.dmabuf);
}

// A provider that registers GPU memory moves it either with the NIC alone (GPUDirect RDMA) or
// with the CUDA API (shm: CUDA IPC; efa without GPUDirect RDMA: copies through host memory).
// FI_OPT_CUDA_API_PERMITTED (API 1.18 on) tells which: an endpoint that needs the CUDA API
// refuses to do without it (-FI_EOPNOTSUPP).
// (An enum, not a macro: the headers' version says whether they have it.)
#define HAVE_CUDA_API_PERMITTED \
  FI_VERSION_GE(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), FI_VERSION(1, 18))
static std::string HowDirect(fid_domain* domain, const fi_info& info, bool dmabuf,
                             GpuAllocation allocation, bool* nic_only, bool* copies) {
  const std::string provider = info.fabric_attr->prov_name;
  std::string how = "the provider reads and writes GPU memory (FI_HMEM_CUDA" +
                    std::string(dmabuf ? ", dmabuf)" : ", by address)");
#if HAVE_CUDA_API_PERMITTED
  fid_ep* ep = nullptr;
  if (fi_endpoint(domain, const_cast<fi_info*>(&info), &ep, nullptr) != 0) return how;
  bool permitted = false;
  const int rc = fi_setopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_CUDA_API_PERMITTED, &permitted,
                           sizeof(permitted));
  fi_close(&ep->fid);
  // How the memory was registered, where the path's words do not say it already.
  const std::string registered = dmabuf ? "; registered as a dmabuf" : "; registered by address";
  if (rc == 0 && Has(Quirk::kCopiesGpuThroughSockets, info)) {  // a socket provider
    *nic_only = true;
    *copies = true;
    return provider +
           " copies GPU memory to and from its sockets itself (no NIC reads GPU memory: no "
           "GPUDirect RDMA)" +
           registered;
  }
  if (rc == 0) {
    *nic_only = true;
    return std::string("GPUDirect RDMA: the NIC reads and writes GPU memory itself") +
           (dmabuf ? " (dmabuf)" : " (by address: peer memory)");
  }
  if (rc == -FI_EOPNOTSUPP) {
    if (provider == "shm")
      return allocation == GpuAllocation::kVmm
                 ? "shm copies VMM memory through its host bounce buffers with the CUDA API, "
                   "one transfer at a time per peer (CUDA IPC opens cudaMalloc's memory only): "
                   "a slow path, about 20 Gbps on an H200 whatever the page size or threads" +
                       registered
                 : "CUDA IPC: shm copies GPU to GPU with the CUDA API" + registered;
    *copies = true;
    return provider +
           " copies GPU memory through host memory with the CUDA API: no GPUDirect RDMA here, "
           "a slow path" +
           registered;
  }
#else
  (void)domain;
  (void)allocation;
  (void)nic_only;
  (void)copies;
#endif
  return how;
}

void RequireDeviceWrites(const MemoryPath& path, std::optional<bool> emulated_write) {
  if (path.direct_required && emulated_write.value_or(false))
    throw HardwareAbsent(
        "--gpu-path direct: efa emulates RDMA WRITE with messages on this device "
        "(FI_OPT_EFA_EMULATED_WRITE): the NIC would not write GPU memory itself");
}

void RefuseCudaApi(fid_ep* ep, const MemoryPath& path) {
  if (!path.nic_only) return;
#if HAVE_CUDA_API_PERMITTED
  bool permitted = false;
  const int rc = fi_setopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_CUDA_API_PERMITTED, &permitted,
                           sizeof(permitted));
  if (rc != 0)
    throw Error(std::string("this endpoint will not move GPU memory without the CUDA API "
                            "(FI_OPT_CUDA_API_PERMITTED false: ") +
                fi_strerror(-rc) + "), though the probe's did: no GPUDirect RDMA here");
#else
  (void)ep;
#endif
}

std::optional<bool> EmulatedWrite(fid_ep* ep) {
#if HAVE_CUDA_API_PERMITTED  // FI_OPT_EFA_EMULATED_WRITE came with the same headers (1.18)
  bool emulated = false;
  size_t length = sizeof(emulated);
  if (fi_getopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_EFA_EMULATED_WRITE, &emulated, &length) == 0 &&
      length == sizeof(emulated))
    return emulated;
#else
  (void)ep;
#endif
  return std::nullopt;
}

MemoryPath ChooseMemoryPath(fid_domain* domain, const fi_info& info, MemoryKind memory,
                            GpuPathMode mode, const std::string& no_hmem, DmabufMode registration) {
  if (!IsGpu(memory)) return {PageBuffer::Path::kHost, ""};
  const GpuAllocation allocation =
      memory == MemoryKind::kCudaVmm ? GpuAllocation::kVmm : GpuAllocation::kMalloc;
  if (mode == GpuPathMode::kStaged)
    return {PageBuffer::Path::kGpuStaged, "--gpu-path staged", allocation};
  std::string why = no_hmem;
  bool dmabuf = false;
  std::string refused;  // --dmabuf auto: why the dmabuf registration failed, if it did
  if (why.empty()) {
    // Two of what a buffer of this kind is made of (VMM: two chunks, so that the probe spans
    // more than one allocation, as a region does).
    const size_t probe_size = allocation == GpuAllocation::kVmm ? 2 * kVmmChunk : 1 << 20;
    CudaBuffer probe(probe_size, 0, allocation);
    const auto try_register = [&](bool try_dmabuf) {
      RegisterMemory(domain, info, probe.data(), probe.size(), FI_REMOTE_WRITE | FI_WRITE, &probe,
                     try_dmabuf, &dmabuf);
    };
    const std::string cannot = std::string(info.fabric_attr->prov_name) + " does not register " +
                               (allocation == GpuAllocation::kVmm ? "VMM-mapped " : "") +
                               "GPU memory";
    try {
      // dmabuf first, then by address: a dmabuf the provider refuses (an efa driver without
      // it; AWS's NCCL plugin turned dmabuf off by default in v1.13.2-aws for this) need not
      // stop a host whose peer-memory path works.
      try {
        try_register(registration != DmabufMode::kOff);
      } catch (const Error& e) {
        if (!dmabuf || registration != DmabufMode::kAuto) throw;
        refused = e.what();
        try_register(false);
      }
      if (registration == DmabufMode::kOn && !dmabuf)
        why = cannot + " as a dmabuf (--dmabuf on): this driver, kernel or libfabric exports none";
    } catch (const Error& e) {
      why = cannot +
            (dmabuf ? " as a dmabuf (--dmabuf " +
                          std::string(registration == DmabufMode::kOn ? "on" : "auto") + ")"
                    : "") +
            ": " + e.what() + (refused.empty() ? "" : "; as a dmabuf: " + refused);
    }
  }
  if (mode == GpuPathMode::kAuto && ExpectsGpuDirect(InstanceType())) {
    mode = GpuPathMode::kDirect;  // where GPUDirect RDMA is the point, nothing less is measured
    if (!why.empty()) why += " (" + InstanceType() + ": --gpu-path direct is its default)";
  }
  if (why.empty()) {
    MemoryPath path{PageBuffer::Path::kGpuDirect, "", allocation};
    path.direct_required = mode == GpuPathMode::kDirect;
    path.dmabuf = dmabuf;
    path.why = HowDirect(domain, info, dmabuf, allocation, &path.nic_only, &path.provider_copies);
    if (!refused.empty()) path.why += "; its dmabuf was refused (" + refused + ")";
    if (path.provider_copies && mode == GpuPathMode::kDirect)
      throw HardwareAbsent("--gpu-path direct: " + path.why);
    return path;
  }
  if (mode == GpuPathMode::kDirect) throw HardwareAbsent("--gpu-path direct: " + why);
  return {PageBuffer::Path::kGpuStaged, why, allocation};
}

std::string InstanceType(const std::string& dmi) {
  std::ifstream file(dmi + "/product_name");
  std::string type;
  std::getline(file, type);
  while (!type.empty() && std::isspace(static_cast<unsigned char>(type.back()))) type.pop_back();
  return type;
}
bool ExpectsGpuDirect(const std::string& type) {
  for (const char* family : {"p4d.", "p4de.", "p5.", "p5e.", "p5en.", "p6-"})
    if (type.rfind(family, 0) == 0) return true;
  return false;
}

static std::string GpuWords(const MemoryPath& p) {
  return p.allocation == GpuAllocation::kVmm
             ? "GPU memory mapped in " + std::to_string(kVmmChunk >> 20) +
                   " MiB chunks by the CUDA VMM API"
             : "GPU memory";
}

std::string DescribeMemoryPath(const MemoryPath& p) {
  switch (p.path) {
    case PageBuffer::Path::kHost:
      return "host memory";
    case PageBuffer::Path::kGpuDirect:
      if (p.provider_copies) return GpuWords(p) + ", copied by the provider (" + p.why + ")";
      return GpuWords(p) + ", direct (" + p.why + ")";
    default:
      return GpuWords(p) + ", staged through pinned host memory (" + p.why + ")";
  }
}

const char* MemoryWord(const MemoryPath& p) {
  switch (p.path) {
    case PageBuffer::Path::kHost:
      return "host";
    case PageBuffer::Path::kGpuDirect:
      if (p.provider_copies)
        return p.allocation == GpuAllocation::kVmm ? "cuda-vmm-copied" : "cuda-copied";
      return p.allocation == GpuAllocation::kVmm ? "cuda-vmm-direct" : "cuda-direct";
    default:
      return p.allocation == GpuAllocation::kVmm ? "cuda-vmm-staged" : "cuda-staged";
  }
}

}  // namespace common
