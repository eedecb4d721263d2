// Memory registration: host memory, or GPU memory handed to the provider with its interface
// and device (FI_HMEM_CUDA), as a dmabuf where it can take one: 07's RegisterPages. 03-06
// write the same code out in their own `Network::Register` (03's lesson, carried with the rest
// of their network code). And the choice, said out loud, between handing GPU memory to the
// provider (direct) and staging it through pinned host memory, which every stage from 03 on
// makes here.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "cuda_memory.hpp"
#include "fabric_handles.hpp"
#include "options.hpp"
#include "page_buffer.hpp"

namespace common {

// A key nobody can guess, of `key_size` bytes (the domain's mr_key_size). Where the provider
// lets the program choose keys (no FI_MR_PROV_KEY: tcp, shm), keys 1, 2, 3... would let any
// process that knows an endpoint's address write into its regions.
uint64_t RandomKey(size_t key_size);

// Registers `size` bytes at `data` for `access` (FI_REMOTE_WRITE, FI_WRITE, FI_SEND, ...).
// GPU memory (`gpu` set): FI_HMEM_CUDA with its device and FI_HMEM_DEVICE_ONLY (cudaMalloc'd
// device memory; with it shm moves pages by CUDA IPC instead of host bounce buffers), as a
// dmabuf where `try_dmabuf`, the headers (libfabric >= 1.20), the API version and the driver
// offer one, else by address (the NIC's driver pins it: peer memory). `dmabuf`, when given,
// says whether it was one. Throws Error with libfabric's reason.
MrPtr RegisterMemory(fid_domain* domain, const fi_info& info, void* data, size_t size,
                     uint64_t access, const CudaBuffer* gpu = nullptr, bool try_dmabuf = true,
                     bool* dmabuf = nullptr);

// A PageBuffer's memory as the NIC sees it (its GPU memory on the direct path, else host or
// pinned memory), registered as above, as a dmabuf where `path` found one works.
MrPtr RegisterPages(fid_domain* domain, const fi_info& info, const PageBuffer& pages,
                    uint64_t access, const MemoryPath& path);

// --memory and --gpu-path decide. With GPU memory and --gpu-path auto or direct, the provider
// is asked (a 1 MiB GPU buffer registered on `domain`) whether it takes GPU memory; `no_hmem`
// is why FI_HMEM was left out of the hints, if it was. --gpu-path direct where the provider
// cannot: HardwareAbsent (exit 77) with the provider's own reason.
// On an instance made for GPUDirect RDMA (ExpectsGpuDirect), auto means direct. A NIC provider
// that registers GPU memory but copies it through host memory with the CUDA API (it refuses
// FI_OPT_CUDA_API_PERMITTED false: efa without peer-to-peer) is no direct path either: exit 77
// under direct, "cuda-copied" in the records otherwise.
// `registration` (07 --dmabuf): the probe registers as a dmabuf (on), by address (off), or as
// a dmabuf and, where the provider refuses that, by address (auto); the path says which
// worked (MemoryPath::dmabuf, and in its `why`).
MemoryPath ChooseMemoryPath(fid_domain* domain, const fi_info& info, MemoryKind memory,
                            GpuPathMode mode, const std::string& no_hmem,
                            DmabufMode registration = DmabufMode::kAuto);
// The instance type where the machine says it (EC2: DMI's product name, "p5.48xlarge"); "".
std::string InstanceType(const std::string& dmi = "/sys/class/dmi/id");
// Whether GPUDirect RDMA over EFA is what the instance type is for (p4d, p4de, p5, p5e, p5en,
// p6: AWS's EFA documentation, "Supported instance types", GPUDirect RDMA column).
bool ExpectsGpuDirect(const std::string& type);

// GPUDirect RDMA (`path.nic_only`): endpoint `ep`, not yet enabled, is told never to call the
// CUDA API (FI_OPT_CUDA_API_PERMITTED false, API 1.18 on). A provider that would otherwise copy
// GPU memory through host memory with the CUDA API then refuses, and this throws Error saying
// so, instead of the run measuring a slow path it did not ask for. Nothing otherwise.
void RefuseCudaApi(fid_ep* ep, const MemoryPath& path);
// Under --gpu-path direct (`path.direct_required`), an RDMA WRITE that efa emulates with
// messages is no direct path either: HardwareAbsent (exit 77) naming it.
void RequireDeviceWrites(const MemoryPath& path, std::optional<bool> emulated_write);
// efa: whether its RDMA WRITE is emulated with messages (FI_OPT_EFA_EMULATED_WRITE true) rather
// than done by the device; nullopt where the provider does not say (not efa, headers < 1.18).
std::optional<bool> EmulatedWrite(fid_ep* ep);

// "host memory", "GPU memory, direct (...)", "GPU memory, staged through pinned host memory
// (...)": the header line's words.
std::string DescribeMemoryPath(const MemoryPath& path);
// One word for the JSON summary: host, cuda-direct, cuda-staged, cuda-vmm-direct or
// cuda-vmm-staged.
const char* MemoryWord(const MemoryPath& path);

}  // namespace common
