// Errors: one exception type that carries the exit code, and the checks that throw it.
#pragma once

#include <stdexcept>
#include <string>

namespace common {

// Exit codes of every program (docs/architecture.md, "Programs").
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;      // runtime failure: peer error, wrong data
inline constexpr int kExitUsage = 2;        // bad usage or bad input
inline constexpr int kExitNoHardware = 77;  // required hardware absent (Meson: skipped)
inline constexpr int kExitBusy = 75;        // the server has no room now: try again (EX_TEMPFAIL)

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, int exit_code = kExitFailure)
      : std::runtime_error(what), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// Bad usage or input: exit 2, one line naming the bad value.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& what) : Error(what, kExitUsage) {}
};

// A GPU (or another device) was asked for and is not there: exit 77.
// A server with no room for one more client now: it refused at once, and a later try may fit.
class Busy : public Error {
 public:
  explicit Busy(const std::string& what) : Error(what, kExitBusy) {}
};

class HardwareAbsent : public Error {
 public:
  explicit HardwareAbsent(const std::string& what) : Error(what, kExitNoHardware) {}
};

[[noreturn]] void ThrowFiError(const char* call, long rc, const char* file, int line);
[[noreturn]] void ThrowCudaError(const char* call, int rc, const char* file, int line);
[[noreturn]] void ThrowHwlocError(const char* call, int err, const char* file, int line);

}  // namespace common

// libfabric calls return 0 or a positive count on success and -FI_Exxx on failure.
#define FI_CHECK(call)                                                                     \
  do {                                                                                     \
    long fi_check_rc_ = static_cast<long>(call);                                           \
    if (fi_check_rc_ < 0) ::common::ThrowFiError(#call, fi_check_rc_, __FILE__, __LINE__); \
  } while (0)

// CUDA runtime calls return cudaSuccess (0) or an error code.
#define CUDA_CHECK(call)                                                                          \
  do {                                                                                            \
    int cuda_check_rc_ = static_cast<int>(call);                                                  \
    if (cuda_check_rc_ != 0) ::common::ThrowCudaError(#call, cuda_check_rc_, __FILE__, __LINE__); \
  } while (0)

// hwloc calls return -1 (or NULL) and set errno on failure.
#define HWLOC_CHECK(call)                                                        \
  do {                                                                           \
    if ((call) < 0) ::common::ThrowHwlocError(#call, errno, __FILE__, __LINE__); \
  } while (0)
