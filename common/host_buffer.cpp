#include "host_buffer.hpp"

#include "error.hpp"

#include <cstdlib>
#include <cstring>

namespace common {

void HostBuffer::Free::operator()(uint8_t* p) const noexcept { std::free(p); }

HostBuffer::HostBuffer(size_t size, size_t alignment) : size_(size) {
  const size_t rounded = (size + alignment - 1) / alignment * alignment;
  void* p = std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded);
  if (p == nullptr) throw Error("cannot allocate " + std::to_string(size) + " bytes of host memory");
  std::memset(p, 0, rounded == 0 ? alignment : rounded);  // touch now, not inside a timed run
  data_.reset(static_cast<uint8_t*>(p));
}

}  // namespace common
