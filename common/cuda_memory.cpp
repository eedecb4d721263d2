#include "cuda_memory.hpp"

#include "error.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#ifdef HAVE_CUDA
#include <cuda.h>  // types of the driver entry point only; nothing links libcuda
#include <cuda_runtime_api.h>
#endif

namespace common {

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  std::swap(fd_, other.fd_);
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) close(fd_);
}

VmmLayout LayOutVmm(size_t size, size_t granularity, size_t chunk) {
  VmmLayout l;
  if (granularity == 0) return l;
  l.chunk = (std::max(chunk, granularity) + granularity - 1) / granularity * granularity;
  l.chunks = (size + l.chunk - 1) / l.chunk;
  l.mapped = l.chunks * l.chunk;
  return l;
}

CudaBuffer::CudaBuffer(CudaBuffer&& other) noexcept {
  *this = std::move(other);
}

CudaBuffer& CudaBuffer::operator=(CudaBuffer&& other) noexcept {
  std::swap(data_, other.data_);
  std::swap(size_, other.size_);
  std::swap(device_, other.device_);
  std::swap(allocation_, other.allocation_);
  std::swap(rdma_capable_, other.rdma_capable_);
  std::swap(layout_, other.layout_);
  std::swap(chunks_, other.chunks_);
  return *this;
}

CudaBuffer::~CudaBuffer() {
  Release();
}

#ifdef HAVE_CUDA

void ThrowCudaError(const char* call, int rc, const char* file, int line) {
  std::string where = file;
  where = where.substr(where.rfind('/') + 1) + ":" + std::to_string(line);
  throw Error(where + ": " + call + " failed: " + cudaGetErrorString(static_cast<cudaError_t>(rc)));
}

bool CudaBuilt() {
  return true;
}

std::string CudaStatus() {
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  const cudaError_t rc = cudaDriverGetVersion(&driver);
  auto version = [](int v) {
    return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
  };
  std::string text = "runtime " + version(runtime);
  if (rc != cudaSuccess) return text + ", no driver: " + cudaGetErrorString(rc);
  if (driver == 0) return text + ", no NVIDIA driver";
  text += ", driver " + version(driver);
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    text += std::string(": ") + cudaGetErrorString(e);
    cudaGetLastError();
  }
  return text;
}

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: clear the sticky error
    return 0;
  }
  return count;
}

std::string CudaDeviceName(int device) {
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

std::string CudaPciBusId(int device) {
  char id[32] = {};
  CUDA_CHECK(cudaDeviceGetPCIBusId(id, sizeof(id), device));
  std::string s = id;
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // The runtime gives 8 hex digits of PCI domain; hwloc and lspci use 4.
  if (s.size() > 12 && s.compare(0, 4, "0000") == 0) s = s.substr(4);
  return s;
}

CudaMemory CudaMemoryOf(int device) {
  CUDA_CHECK(cudaSetDevice(device));
  CudaMemory m;
  CUDA_CHECK(cudaMemGetInfo(&m.free, &m.total));
  return m;
}

// A driver API function, looked up through the runtime so that nothing links libcuda;
// nullptr where this driver lacks it.
template <typename Fn>
static Fn Driver(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050  // cudaGetDriverEntryPoint is deprecated from 12.5 on
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) != cudaSuccess)
#else
  if (cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &found) != cudaSuccess)
#endif
    return nullptr;
  return found == cudaDriverEntryPointSuccess ? reinterpret_cast<Fn>(fn) : nullptr;
}

// A driver call that must succeed: throws Error naming it and the driver's reason.
static void DriverCheck(CUresult rc, const char* call) {
  if (rc == CUDA_SUCCESS) return;
  const char* text = nullptr;
  if (auto name = Driver<CUresult (*)(CUresult, const char**)>("cuGetErrorString")) name(rc, &text);
  throw Error(std::string(call) + " failed: " + (text ? text : std::to_string(rc)));
}

CudaBuffer::CudaBuffer(size_t size, int device, GpuAllocation allocation)
    : size_(size), device_(device), allocation_(allocation) {
  if (CudaDeviceCount() <= device)
    throw HardwareAbsent("no CUDA device " + std::to_string(device) + " on this machine");
  CUDA_CHECK(cudaSetDevice(device));
  if (allocation == GpuAllocation::kVmm)
    MapVmm();
  else
    CUDA_CHECK(cudaMalloc(&data_, size));
  CUDA_CHECK(cudaMemset(data_, 0, size));
}

void CudaBuffer::MapVmm() {
  using GetAttribute = CUresult (*)(int*, CUdevice_attribute, CUdevice);
  using DeviceGet = CUresult (*)(CUdevice*, int);
  using Granularity =
      CUresult (*)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags);
  using Reserve = CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  using Create = CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                              unsigned long long);
  using Map =
      CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  using SetAccess = CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
  auto device_get = Driver<DeviceGet>("cuDeviceGet");
  auto get_attribute = Driver<GetAttribute>("cuDeviceGetAttribute");
  auto granularity_of = Driver<Granularity>("cuMemGetAllocationGranularity");
  auto reserve = Driver<Reserve>("cuMemAddressReserve");
  auto create = Driver<Create>("cuMemCreate");
  auto map = Driver<Map>("cuMemMap");
  auto set_access = Driver<SetAccess>("cuMemSetAccess");
  if (!device_get || !get_attribute || !granularity_of || !reserve || !create || !map ||
      !set_access)
    throw HardwareAbsent("--memory cuda-vmm: this driver lacks the CUDA virtual memory API");
  CUdevice dev = 0;
  DriverCheck(device_get(&dev, device_), "cuDeviceGet");
  int vmm = 0, rdma = 0;
  DriverCheck(get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev),
              "cuDeviceGetAttribute");
  if (!vmm) throw HardwareAbsent("--memory cuda-vmm: this GPU has no virtual memory management");
  // Without this flag a chunk cannot be pinned by a NIC (GPUDirect RDMA); PyTorch sets it
  // only where the device says it can be.
  DriverCheck(
      get_attribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev),
      "cuDeviceGetAttribute");
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.allocFlags.gpuDirectRDMACapable = rdma ? 1 : 0;
  rdma_capable_ = rdma != 0;
  size_t granularity = 0;
  DriverCheck(granularity_of(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
              "cuMemGetAllocationGranularity");
  layout_ = LayOutVmm(size_, granularity);
  CUdeviceptr base = 0;
  DriverCheck(reserve(&base, layout_.mapped, granularity, 0, 0), "cuMemAddressReserve");
  data_ = reinterpret_cast<void*>(base);  // Release() undoes whatever was done, on any throw
  try {
    for (size_t c = 0; c < layout_.chunks; ++c) {
      CUmemGenericAllocationHandle chunk = 0;
      DriverCheck(create(&chunk, layout_.chunk, &prop, 0), "cuMemCreate");
      chunks_.push_back(chunk);
      DriverCheck(map(base + c * layout_.chunk, layout_.chunk, 0, chunk, 0), "cuMemMap");
    }
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    DriverCheck(set_access(base, layout_.mapped, &access, 1), "cuMemSetAccess");
  } catch (...) {
    Release();
    throw;
  }
}

void CudaBuffer::Release() {
  if (data_ == nullptr) return;
  cudaSetDevice(device_);
  if (allocation_ == GpuAllocation::kMalloc) {
    cudaError_t rc = cudaFree(data_);
    if (rc != cudaSuccess) std::fprintf(stderr, "warning: cudaFree: %s\n", cudaGetErrorString(rc));
  } else {
    // Mapped chunks first (cuMemUnmap: the whole range; chunks not yet mapped are skipped),
    // then their handles, then the range.
    const auto base = reinterpret_cast<CUdeviceptr>(data_);
    cudaDeviceSynchronize();
    if (auto unmap = Driver<CUresult (*)(CUdeviceptr, size_t)>("cuMemUnmap"))
      for (size_t c = 0; c < chunks_.size(); ++c) unmap(base + c * layout_.chunk, layout_.chunk);
    if (auto release = Driver<CUresult (*)(CUmemGenericAllocationHandle)>("cuMemRelease"))
      for (auto chunk : chunks_) release(chunk);
    if (auto free_range = Driver<CUresult (*)(CUdeviceptr, size_t)>("cuMemAddressFree"))
      free_range(base, layout_.mapped);
    chunks_.clear();
  }
  data_ = nullptr;
}

void CudaBuffer::MakeCurrent() const {
  CUDA_CHECK(cudaSetDevice(device_));  // with CUDA 12 on, also binds its primary context
}

void CudaBuffer::CopyFromHost(size_t offset, const void* src, size_t bytes) {
  MakeCurrent();
  CUDA_CHECK(cudaMemcpy(static_cast<uint8_t*>(data_) + offset, src, bytes, cudaMemcpyHostToDevice));
}

void CudaBuffer::CopyToHost(void* dst, size_t offset, size_t bytes) const {
  MakeCurrent();
  CUDA_CHECK(
      cudaMemcpy(dst, static_cast<const uint8_t*>(data_) + offset, bytes, cudaMemcpyDeviceToHost));
}

void CudaBuffer::CopyFrom(size_t offset, const CudaBuffer& src, size_t src_offset, size_t bytes) {
  MakeCurrent();
  CUDA_CHECK(cudaMemcpy(static_cast<uint8_t*>(data_) + offset,
                        static_cast<const uint8_t*>(src.data_) + src_offset, bytes,
                        cudaMemcpyDeviceToDevice));
  CUDA_CHECK(cudaDeviceSynchronize());  // a device-to-device cudaMemcpy may return early
}

UniqueFd CudaBuffer::ExportDmabuf(const void* at, size_t size) const {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (reinterpret_cast<uintptr_t>(at) % page != 0 || size % page != 0) return UniqueFd();
  MakeCurrent();  // cuMemGetHandleForAddressRange needs a current context
  using GetHandle =
      CUresult (*)(void*, CUdeviceptr, size_t, CUmemRangeHandleType, unsigned long long);
  auto get_handle = Driver<GetHandle>("cuMemGetHandleForAddressRange");
  if (get_handle == nullptr) return UniqueFd();
  int fd = -1;
  CUresult rc = get_handle(&fd, reinterpret_cast<CUdeviceptr>(at), size,
                           CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  return UniqueFd(rc == CUDA_SUCCESS ? fd : -1);
}

PinnedBuffer::PinnedBuffer(size_t size) : size_(size) {
  void* p = nullptr;
  CUDA_CHECK(cudaMallocHost(&p, size));
  data_ = static_cast<uint8_t*>(p);
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

#else  // no CUDA in this build

void ThrowCudaError(const char* call, int rc, const char*, int) {
  throw Error(std::string(call) + " failed (" + std::to_string(rc) + ")");
}
bool CudaBuilt() {
  return false;
}
std::string CudaStatus() {
  return "";
}
int CudaDeviceCount() {
  return 0;
}
std::string CudaDeviceName(int) {
  return "";
}
std::string CudaPciBusId(int) {
  return "";
}
static void NoCuda() {
  throw HardwareAbsent("this build has no CUDA support (meson -Dcuda=enabled)");
}
CudaMemory CudaMemoryOf(int) {
  NoCuda();
  return {};
}
CudaBuffer::CudaBuffer(size_t, int, GpuAllocation) {
  NoCuda();
}
void CudaBuffer::MapVmm() {
  NoCuda();
}
void CudaBuffer::Release() {}
void CudaBuffer::CopyFromHost(size_t, const void*, size_t) {
  NoCuda();
}
void CudaBuffer::CopyToHost(void*, size_t, size_t) const {
  NoCuda();
}
void CudaBuffer::CopyFrom(size_t, const CudaBuffer&, size_t, size_t) {
  NoCuda();
}
UniqueFd CudaBuffer::ExportDmabuf(const void*, size_t) const {
  return UniqueFd();
}
void CudaBuffer::MakeCurrent() const {
  NoCuda();
}
PinnedBuffer::PinnedBuffer(size_t) {
  NoCuda();
}
PinnedBuffer::~PinnedBuffer() = default;

#endif

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  std::swap(data_, other.data_);
  std::swap(size_, other.size_);
  return *this;
}

}  // namespace common
