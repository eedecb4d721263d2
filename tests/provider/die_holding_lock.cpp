// die_holding_lock.so: makes any program die as shm_faults' `lock` peer does, for tests of the
// stages themselves (tests/e2e/engine_test.cpp). Preloaded (LD_PRELOAD) with
// DIE_HOLDING_SHM_LOCK_AFTER=SECONDS, the process kills itself (SIGKILL) holding the first
// lock of a shm region it takes once SECONDS have passed since it started; with
// DIE_HOLDING_SHM_LOCK_IN=SUFFIX, only a lock in the region whose /dev/shm file name ends so
// (":0:1", a 07 client's first lane; ":0:0" is its control endpoint). Over libfabric 1.17's
// shm, every later send or WRITE to that region then spins inside the provider for good
// (tests/provider/shm_faults.cpp, locked-peer). 2.x takes no such lock: the process lives.
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "shared_memory.hpp"

namespace {

using Clock = std::chrono::steady_clock;

const Clock::time_point started = Clock::now();

// The seconds from DIE_HOLDING_SHM_LOCK_AFTER, or a negative number: unset, never.
double ArmedAfter() {
  static const double after = [] {
    const char* text = std::getenv("DIE_HOLDING_SHM_LOCK_AFTER");
    return text != nullptr ? std::atof(text) : -1.0;
  }();
  return after;
}

// A lock in this /dev/shm file is one to die holding.
bool Chosen(const std::string& file) {
  static const std::string suffix = [] {
    const char* text = std::getenv("DIE_HOLDING_SHM_LOCK_IN");
    return std::string(text != nullptr ? text : "");
  }();
  return !file.empty() && file.size() >= suffix.size() &&
         file.compare(file.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

extern "C" int pthread_spin_lock(pthread_spinlock_t* lock) {
  using Lock = int (*)(pthread_spinlock_t*);
  static const Lock real = reinterpret_cast<Lock>(dlsym(RTLD_NEXT, "pthread_spin_lock"));
  const int rc = real(lock);
  const double after = ArmedAfter();
  if (after >= 0 && Clock::now() - started >= std::chrono::duration<double>(after) &&
      Chosen(SharedMemoryFileOf(lock))) {
    static const char said[] = "die_holding_lock: killed holding a lock in shared memory\n";
    (void)!write(STDERR_FILENO, said, sizeof(said) - 1);
    raise(SIGKILL);
  }
  return rc;
}
