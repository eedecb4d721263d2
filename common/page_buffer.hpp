// Memory for pages (docs/architecture.md, "Memory"): host memory, or GPU memory. Where the provider
// can register GPU memory (FI_HMEM_CUDA) the NIC reads and writes the GPU buffer itself. Where it
// cannot, a pinned host mirror is what the NIC touches, and explicit copies keep the GPU
// buffer current, so the data still start and end in GPU memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "cuda_memory.hpp"
#include "host_buffer.hpp"
#include "options.hpp"

namespace common {

struct MemoryPath;

class PageBuffer {
 public:
  enum class Path { kHost, kGpuDirect, kGpuStaged };

  PageBuffer() = default;
  // Where `memory` says (ChooseMemoryPath, common/registration.hpp), allocated as it says.
  PageBuffer(size_t size, const MemoryPath& memory, int device = 0, Pages pages = Pages::kHuge);

  Path path() const { return path_; }
  size_t size() const { return size_; }
  int device() const { return device_; }
  const CudaBuffer& gpu() const { return gpu_; }
  // What the NIC reads and writes: the host buffer, the GPU buffer, or the pinned mirror.
  void* nic_data() const;

  // Copies `bytes` from host memory to `offset` (the GPU, and the mirror when staged).
  void Write(size_t offset, std::span<const uint8_t> bytes);
  // Staged path: GPU -> mirror before the NIC reads (`bytes` at `offset`, or all of it);
  // mirror -> GPU after the NIC wrote.
  void SyncToNic(size_t offset = 0, size_t bytes = SIZE_MAX);
  void SyncFromNic();
  // A host view of the contents (read back from the GPU when they live there).
  std::span<uint8_t> HostView();

 private:
  Path path_ = Path::kHost;
  size_t size_ = 0;
  int device_ = 0;
  HostBuffer host_;  // host path; for GPU paths, the read-back copy
  CudaBuffer gpu_;
  PinnedBuffer mirror_;  // staged path only
};

// Where this side's pages live and how they reach the NIC, and why: the header line and the
// JSON say both, so a slow path is never silent.
struct MemoryPath {
  PageBuffer::Path path = PageBuffer::Path::kHost;
  std::string why;  // direct: how the provider moves GPU memory; staged: why it does not
  GpuAllocation allocation = GpuAllocation::kMalloc;  // GPU paths: cudaMalloc or the VMM API
  // Direct, by GPUDirect RDMA: the provider said it moves this memory with the NIC alone, so
  // the endpoints that move it refuse the CUDA API (RefuseCudaApi, common/registration.hpp).
  bool nic_only = false;
  // Direct in name only: a NIC provider that takes GPU memory but copies it through host memory
  // with the CUDA API (it refused to do without it). --gpu-path direct refuses this path.
  bool provider_copies = false;
  bool direct_required = false;  // --gpu-path direct (or a p5's default): nothing less runs
  bool dmabuf = false;           // direct: registered as a dmabuf (else by address: peer memory)
};

// Fills `buffer` from `offset` with the pages `ids` of data set `seed` (page_data.hpp), one
// after another, `page_size` bytes each, and makes them the NIC's to read. Host memory is
// filled in place; GPU memory in `staging` (host memory, grown as needed) and then copied up
// in one go, not a copy per page.
void FillPages(PageBuffer& buffer, size_t offset, uint64_t seed, std::span<const uint32_t> ids,
               size_t page_size, HostBuffer& staging);

// --memory auto means cuda when a GPU is present; throws HardwareAbsent for cuda or cuda-vmm
// without one.
MemoryKind ResolveMemory(MemoryKind requested);

}  // namespace common
