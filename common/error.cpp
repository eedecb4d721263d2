#include "error.hpp"

#include <rdma/fabric.h>

#include <cstring>

namespace common {

static std::string Where(const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  return std::string(base ? base + 1 : file) + ":" + std::to_string(line);
}

void ThrowFiError(const char* call, long rc, const char* file, int line) {
  throw Error(Where(file, line) + ": " + call + " failed: " + fi_strerror(static_cast<int>(-rc)) +
              " (" + std::to_string(rc) + ")");
}

void ThrowHwlocError(const char* call, int err, const char* file, int line) {
  throw Error(Where(file, line) + ": " + call + " failed: " + std::strerror(err));
}

}  // namespace common
