#include "host_buffer.hpp"

#include "error.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace common {

void HostBuffer::Free::operator()(uint8_t* p) const noexcept {
  if (mapped > 0)
    munmap(p, mapped);
  else
    std::free(p);
}

HostBuffer::HostBuffer(size_t size, Pages pages, size_t alignment) : size_(size) {
  const bool huge = pages != Pages::kSmall && size >= kHugePage;
  if (huge) alignment = std::max(alignment, kHugePage);
  const size_t rounded = (size + alignment - 1) / alignment * alignment;
  if (pages == Pages::kHugeLazy) {  // mapped: its pages come as they are first written
    const size_t length = std::max(rounded, alignment);
    void* m = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
      throw Error("cannot map " + std::to_string(size) + " bytes of host memory");
    if (huge) madvise(m, length, MADV_HUGEPAGE);  // advice only: fine if refused
    data_ = std::unique_ptr<uint8_t, Free>(static_cast<uint8_t*>(m), Free{length});
    return;
  }
  void* p = std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded);
  if (p == nullptr)
    throw Error("cannot allocate " + std::to_string(size) + " bytes of host memory");
  if (huge) madvise(p, rounded, MADV_HUGEPAGE);           // advice only: fine if refused
  std::memset(p, 0, rounded == 0 ? alignment : rounded);  // touch now, not inside a timed run
  data_.reset(static_cast<uint8_t*>(p));
}

}  // namespace common
