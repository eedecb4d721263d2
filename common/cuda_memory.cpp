#include "cuda_memory.hpp"

#include "error.hpp"

#include <unistd.h>

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

#ifdef HAVE_CUDA

void ThrowCudaError(const char* call, int rc, const char* file, int line) {
  std::string where = file;
  where = where.substr(where.rfind('/') + 1) + ":" + std::to_string(line);
  throw Error(where + ": " + call + " failed: " + cudaGetErrorString(static_cast<cudaError_t>(rc)));
}

bool CudaBuilt() {
  return true;
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

CudaBuffer::CudaBuffer(size_t size, int device) : size_(size), device_(device) {
  if (CudaDeviceCount() <= device)
    throw HardwareAbsent("no CUDA device " + std::to_string(device) + " on this machine");
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaMalloc(&data_, size));
  CUDA_CHECK(cudaMemset(data_, 0, size));
}

CudaBuffer::CudaBuffer(CudaBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      device_(other.device_) {}

CudaBuffer& CudaBuffer::operator=(CudaBuffer&& other) noexcept {
  std::swap(data_, other.data_);
  std::swap(size_, other.size_);
  std::swap(device_, other.device_);
  return *this;
}

CudaBuffer::~CudaBuffer() {
  if (data_ == nullptr) return;
  cudaSetDevice(device_);
  cudaError_t rc = cudaFree(data_);
  if (rc != cudaSuccess) std::fprintf(stderr, "warning: cudaFree: %s\n", cudaGetErrorString(rc));
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
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050  // cudaGetDriverEntryPoint is deprecated from 12.5 on
  if (cudaGetDriverEntryPointByVersion("cuMemGetHandleForAddressRange", &fn, 12000,
                                       cudaEnableDefault, &found) != cudaSuccess ||
#else
  if (cudaGetDriverEntryPoint("cuMemGetHandleForAddressRange", &fn, cudaEnableDefault, &found) !=
          cudaSuccess ||
#endif
      found != cudaDriverEntryPointSuccess || fn == nullptr)
    return UniqueFd();
  int fd = -1;
  CUresult rc = reinterpret_cast<GetHandle>(fn)(&fd, reinterpret_cast<CUdeviceptr>(at), size,
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
CudaBuffer::CudaBuffer(size_t, int) {
  NoCuda();
}
CudaBuffer::CudaBuffer(CudaBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(other.size_), device_(other.device_) {}
CudaBuffer& CudaBuffer::operator=(CudaBuffer&&) noexcept = default;
CudaBuffer::~CudaBuffer() = default;
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
