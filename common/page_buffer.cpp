#include "page_buffer.hpp"

#include <cstring>

#include "error.hpp"

namespace common {

PageBuffer::PageBuffer(size_t size, Path path, int device)
    : path_(path), size_(size), device_(device) {
  if (path_ == Path::kHost) {
    host_ = HostBuffer(size);
    return;
  }
  gpu_ = CudaBuffer(size, device);
  if (path_ == Path::kGpuStaged) mirror_ = PinnedBuffer(size);
}

void* PageBuffer::nic_data() const {
  switch (path_) {
    case Path::kHost:
      return host_.data();
    case Path::kGpuDirect:
      return gpu_.data();
    default:
      return mirror_.data();
  }
}

void PageBuffer::Write(size_t offset, std::span<const uint8_t> bytes) {
  if (path_ == Path::kHost) {
    std::memcpy(host_.data() + offset, bytes.data(), bytes.size());
    return;
  }
  gpu_.CopyFromHost(offset, bytes.data(), bytes.size());
}

void PageBuffer::SyncToNic() {
  if (path_ == Path::kGpuStaged) gpu_.CopyToHost(mirror_.data(), 0, size_);
}

void PageBuffer::SyncFromNic() {
  if (path_ == Path::kGpuStaged) gpu_.CopyFromHost(0, mirror_.data(), size_);
}

std::span<uint8_t> PageBuffer::HostView() {
  if (path_ != Path::kHost) {
    if (host_.size() != size_) host_ = HostBuffer(size_);
    gpu_.CopyToHost(host_.data(), 0, size_);
  }
  return {host_.data(), size_};
}

MemoryKind ResolveMemory(MemoryKind requested) {
  if (requested == MemoryKind::kHost) return requested;
  const bool have_gpu = CudaDeviceCount() > 0;
  if (requested == MemoryKind::kAuto) return have_gpu ? MemoryKind::kCuda : MemoryKind::kHost;
  if (!CudaBuilt()) throw HardwareAbsent("--memory cuda: this build has no CUDA support");
  if (!have_gpu) throw HardwareAbsent("--memory cuda: no CUDA GPU on this machine");
  return requested;
}

}  // namespace common
