// Every program's own pthread_spin_lock, which takes over a lock in a shm region that its holder
// died with (libfabric 1.17's and 2.6's shm; the reasons are in shm_lock.cpp).
#pragma once

namespace common {

// How long a lock in shared memory may stay held before it is taken as a dead holder's.
inline constexpr double kShmLockPatienceSeconds = 2.0;

}  // namespace common
