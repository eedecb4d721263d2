// A spinlock in shared memory that its holder died with is taken over, not waited on for good.
//
// libfabric's shm keeps each endpoint's queues in a region (a file in /dev/shm that every peer
// maps), and guards some of it with pthread spinlocks that live in the region itself. 1.17: the
// region's lock, which the owner takes in each progress call with work to do and a sender
// before it queues anything (smr_generic_rma, smr_generic_sendmsg). 2.6: the lock of its
// inject buffers (fs_lock), which a sender takes to borrow one for a message or WRITE too long
// to travel in the command, and the owner to give it back as it reads it. A process killed
// while it holds one never releases it, and the next WRITE or send to that region that needs
// it spins inside the provider for good (tests/provider/shm_faults.cpp, locked-peer): the
// calling thread was lost, and with it a data thread of 07, or the whole server of 03-06.
//
// So every program defines pthread_spin_lock itself. libfabric's calls bind to this definition
// before glibc's (the dynamic linker looks in the executable first), and it behaves as glibc's
// but for one case: a lock that lives in a /dev/shm mapping and stays held for
// kShmLockPatienceSeconds is taken as its dead holder's. The caller goes on as if it had taken
// it, and its pthread_spin_unlock frees it. Nothing a live process does in shm holds that lock
// for more than microseconds; a process stopped (SIGSTOP) while holding it for that long is
// treated as dead, and whatever it does on waking it does to its own region, which its peers
// trust anyway (any local process of the same user can already write into it). Elsewhere (tcp,
// and shm 2.0-2.5, whose regions hold no lock) this is glibc's spinlock with one more call.
#include "shm_lock.hpp"

#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "shared_memory.hpp"

namespace common {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spins until `lock` is ours, or until it has been held for the patience in shared memory.
int WaitForLock(pthread_spinlock_t* lock) {
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  const auto patience = std::chrono::duration<double>(kShmLockPatienceSeconds);
  bool looked = false;  // asked only once the wait is long: reading the maps is slow
  std::string file;     // the /dev/shm file the lock lives in, "" for a process's own lock
  for (uint64_t spins = 1;; ++spins) {
    if (pthread_spin_trylock(lock) == 0) return 0;
    CpuRelax();
    if (spins % 4096 != 0) continue;
    const auto waited = Clock::now() - started;
    if (waited < std::chrono::milliseconds(100)) continue;
    if (!looked) file = SharedMemoryFileOf(lock);
    looked = true;
    if (file.empty() || waited < patience) continue;
    const std::string line = "warning: took over the lock of shm region " + file + ", held for " +
                             std::to_string(static_cast<int>(patience.count())) +
                             " s: its holder died holding it\n";
    [[maybe_unused]] ssize_t n = write(STDOUT_FILENO, line.data(), line.size());
    return 0;  // held as the dead holder left it; the caller's unlock frees it
  }
}

}  // namespace

}  // namespace common

extern "C" int pthread_spin_lock(pthread_spinlock_t* lock) {
  if (pthread_spin_trylock(lock) == 0) return 0;
  return common::WaitForLock(lock);
}
