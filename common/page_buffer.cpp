#include "page_buffer.hpp"

#include <algorithm>
#include <cstring>

#include "error.hpp"
#include "page_data.hpp"
#include "registration.hpp"

namespace common {

PageBuffer::PageBuffer(size_t size, const MemoryPath& memory, int device, Pages pages)
    : path_(memory.path), size_(size), device_(device) {
  if (path_ == Path::kHost) {
    host_ = HostBuffer(size, pages);
    return;
  }
  gpu_ = CudaBuffer(size, device, memory.allocation);
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

void PageBuffer::SyncToNic(size_t offset, size_t bytes) {
  if (path_ != Path::kGpuStaged) return;
  bytes = std::min(bytes, size_ - offset);
  gpu_.CopyToHost(mirror_.data() + offset, offset, bytes);
}

void FillPages(PageBuffer& buffer, size_t offset, uint64_t seed, std::span<const uint32_t> ids,
               size_t page_size, HostBuffer& staging) {
  const size_t bytes = ids.size() * page_size;
  const bool host = buffer.path() == PageBuffer::Path::kHost;
  if (!host && staging.size() < bytes) staging = HostBuffer(bytes, Pages::kSmall);
  uint8_t* pages = host ? static_cast<uint8_t*>(buffer.nic_data()) + offset : staging.data();
  for (size_t k = 0; k < ids.size(); ++k)
    FillPage({pages + k * page_size, page_size}, seed, ids[k]);
  if (host) return;
  buffer.Write(offset, {pages, bytes});
  buffer.SyncToNic(offset, bytes);
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
  const std::string option = std::string("--memory ") + MemoryName(requested);
  if (!CudaBuilt()) throw HardwareAbsent(option + ": this build has no CUDA support");
  if (!have_gpu) throw HardwareAbsent(option + ": no CUDA GPU on this machine");
  return requested;
}

}  // namespace common
