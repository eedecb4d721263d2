// Page-aligned host memory with one owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace common {

// EFA wants 128-byte alignment; a page alignment also suits every other provider and
// keeps each page of a transfer on its own pages of memory.
inline constexpr size_t kBufferAlignment = 4096;
inline constexpr size_t kHugePage = 2 << 20;

// Huge pages (2 MiB, transparent) suit memory that lives long: fewer TLB misses, and far fewer
// pages for the kernel to pin when shm copies between processes. Asking for them costs time
// when the buffer is made (the kernel may compact memory to find them: 150 ms and more for
// 64 MiB), so memory made for one request takes small pages. A large buffer used in parts (a
// server's source memory, lent to many clients' requests) is mapped, not allocated, and touched
// only where first written (malloc would not leave it alone: MALLOC_PERTURB_, which Meson's
// test runner sets, fills every allocation).
enum class Pages { kHuge, kSmall, kHugeLazy };

class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(size_t size, Pages pages = Pages::kHuge, size_t alignment = kBufferAlignment);
  uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    Free() noexcept : mapped(0) {}
    explicit Free(size_t bytes) noexcept : mapped(bytes) {}
    size_t mapped;  // bytes of an mmap (kHugeLazy); 0: from aligned_alloc
    void operator()(uint8_t* p) const noexcept;
  };
  std::unique_ptr<uint8_t, Free> data_;
  size_t size_ = 0;
};

}  // namespace common
