// GPU memory through the CUDA runtime. Builds with or without CUDA: without it (or without
// a driver or GPU) CudaDeviceCount() is 0 and allocating throws HardwareAbsent (exit 77).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace common {

bool CudaBuilt();
// What this process's CUDA is: "runtime 13.0, driver 13.0" (built with CUDA, the driver
// answering), the runtime's error text where it does not, or "" in a build without CUDA.
std::string CudaStatus();
int CudaDeviceCount();
// "NVIDIA H200" and "0000:53:00.0" (lower case) for a device.
std::string CudaDeviceName(int device);
std::string CudaPciBusId(int device);
// The device's free and total memory in bytes (cudaMemGetInfo), as this process sees them.
struct CudaMemory {
  size_t free = 0, total = 0;
};
CudaMemory CudaMemoryOf(int device);

// A file descriptor with one owner (the dmabuf of a GPU buffer).
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

// How GPU memory is allocated. kMalloc: cudaMalloc, one allocation the runtime owns. kVmm:
// the CUDA virtual memory API, as PyTorch's caching allocator maps memory with
// expandable_segments: an address range reserved first (cuMemAddressReserve), physical chunks
// created apart (cuMemCreate) and mapped into it one after another (cuMemMap), then made
// accessible (cuMemSetAccess). The range is one pointer to the program, but several
// allocations to the driver, and CUDA IPC does not open it (docs/architecture.md, "Memory").
enum class GpuAllocation { kMalloc, kVmm };

// PyTorch's large segments are 20 MiB; a chunk is that, rounded up to the granularity.
constexpr size_t kVmmChunk = 20u << 20;
// The chunks that hold `size` bytes, each a whole number of `granularity` (which the driver
// gives: 2 MiB on current GPUs), and the bytes reserved and mapped for them.
struct VmmLayout {
  size_t chunk = 0, chunks = 0, mapped = 0;
};
VmmLayout LayOutVmm(size_t size, size_t granularity, size_t chunk = kVmmChunk);

// Device memory, from cudaMalloc or mapped by the virtual memory API.
class CudaBuffer {
 public:
  CudaBuffer() = default;
  CudaBuffer(size_t size, int device, GpuAllocation allocation = GpuAllocation::kMalloc);
  CudaBuffer(CudaBuffer&& other) noexcept;
  CudaBuffer& operator=(CudaBuffer&& other) noexcept;
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;
  ~CudaBuffer();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  int device() const { return device_; }
  GpuAllocation allocation() const { return allocation_; }
  // VMM: whether the chunks were created GPUDirect-RDMA capable (the device says whether it
  // can be; without it a NIC cannot pin them), and how they are laid out.
  bool rdma_capable() const { return rdma_capable_; }
  const VmmLayout& layout() const { return layout_; }
  // Makes this buffer's GPU current on the calling thread. A thread starts with no CUDA
  // context, and the driver API (dmabuf export; the provider's CUDA calls when it registers
  // the memory) then fails on it: every member below, and RegisterMemory, call it first.
  void MakeCurrent() const;
  void CopyFromHost(size_t offset, const void* src, size_t bytes);
  void CopyToHost(void* dst, size_t offset, size_t bytes) const;
  // Device to device, within this buffer's GPU; returns once the copy is done.
  void CopyFrom(size_t offset, const CudaBuffer& src, size_t src_offset, size_t bytes);
  // A dmabuf for `size` bytes at `at` inside the buffer (cuMemGetHandleForAddressRange, looked
  // up through the runtime so that nothing links libcuda); fd -1 where the driver does not
  // offer it, or the range is not aligned to host pages as the driver requires.
  UniqueFd ExportDmabuf(const void* at, size_t size) const;

 private:
  void MapVmm();
  void Release();

  void* data_ = nullptr;
  size_t size_ = 0;
  int device_ = 0;
  GpuAllocation allocation_ = GpuAllocation::kMalloc;
  bool rdma_capable_ = false;
  VmmLayout layout_;
  std::vector<unsigned long long> chunks_;  // CUmemGenericAllocationHandle, one per chunk
};

// Page-locked host memory (cudaMallocHost): the bounce buffer when the provider cannot
// register GPU memory, so copies to and from the GPU run at full speed.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t size);
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace common
