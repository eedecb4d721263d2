// die_holding_lock.so: makes any program die as shm_faults' `lock` peer does, for tests of the
// stages themselves (tests/e2e/engine_test.cpp). Preloaded (LD_PRELOAD), it waits for SIGUSR1;
// from then on, the process kills itself (SIGKILL) holding the first lock it is about to
// release in a shm region whose /dev/shm file name ends with DIE_HOLDING_SHM_LOCK_IN (":0:1", a 07
// client's first lane; ":0:0" is its control endpoint; unset: any region). A signal, not a time, so
// that the test chooses the moment (mid-transfer) however slowly a loaded host starts the program.
// Over libfabric 1.17's shm, every later send or WRITE to that region then spins inside the
// provider (for good in a program of its own, tests/provider/shm_faults.cpp, locked-peer; for
// the stages' stuck-call line and exit, common/provider_watch.hpp): 1.17's region lock, 2.6's
// inject-buffer lock. A libfabric that takes no such lock lets the process live.
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "shared_memory.hpp"

namespace {

std::atomic<bool> armed{false};

void Arm(int) {
  armed = true;
}

// SIGUSR1 arms it (the stages leave SIGUSR1 alone).
__attribute__((constructor)) void InstallArm() {
  struct sigaction action {};
  action.sa_handler = Arm;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &action, nullptr);
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

// The hook is the unlock: the holder dies with the lock taken, just before it would free it.
extern "C" int pthread_spin_unlock(pthread_spinlock_t* lock) {
  using Unlock = int (*)(pthread_spinlock_t*);
  static const Unlock real = reinterpret_cast<Unlock>(dlsym(RTLD_NEXT, "pthread_spin_unlock"));
  if (armed && Chosen(SharedMemoryFileOf(lock))) {
    static const char said[] = "die_holding_lock: killed holding a lock in shared memory\n";
    (void)!write(STDERR_FILENO, said, sizeof(said) - 1);
    raise(SIGKILL);
  }
  return real(lock);
}
