// A thread that never comes back from a provider call, said in one line, and the program
// ends (every stage from 03 on; README.md, "When the provider cannot go on").
//
// Some local misbehaviour leaves a provider unable to go on: over shm, a message longer than
// its 64 KiB limit makes the receiver's fi_cq_read spin for good, and a peer killed while it
// holds the spinlock of its shared region makes the next send or WRITE to it spin for good
// (tests/provider/shm_faults.cpp shows both without project code). Nothing inside the process
// can free that thread. The policy: an InProvider mark around each call that may spin, and a
// watchdog thread that, once a mark is kStuckSeconds old and its thread has spent that long on
// a CPU inside it (a spin, not a wait for a CPU on a loaded host), prints which call it is and
// why that happens, and exits 1 at once, for the supervisor (systemd, Slurm, Kubernetes) to
// restart the server. A mark costs two relaxed stores: the watchdog keeps the clock, in ticks,
// and reads the thread's CPU clock only for a mark a tick old.
#pragma once

#include <time.h>

#include <atomic>
#include <cstdint>

namespace common {

inline constexpr double kStuckSeconds = 3;
// Where the provider is not shm, whose spins are known, a call is stuck only past this: no
// loaded host keeps a call that makes progress in it for so long.
inline constexpr double kSlowCallSeconds = 30;
// How long a mark may last before the watchdog ends the program (kStuckSeconds unless set).
// A client sets its --timeout: its receive progress may stay inside one fi_cq_read while
// its server keeps it fed (shm's receiver drains its whole command queue in one call), and
// it is no supervised service that a quick restart helps.
void SetStuckSeconds(double seconds);
double StuckSeconds();
// The provider this process's endpoints use (Endpoint::Open), named in the stated exit: the
// causes it gives are shm's only over shm.
void SetWatchedProvider(const char* name);

struct ProviderSlot {
  std::atomic<uint32_t> since{0};  // the watchdog's tick when the call began; 0: not inside
  std::atomic<const char*> call{nullptr};
  std::atomic<clockid_t> clock{0};  // the thread's CPU clock (pthread_getcpuclockid)
  std::atomic<bool> clock_known{false};
};
inline std::atomic<uint32_t> provider_tick{1};  // advanced by the watchdog, 10 a second
inline thread_local ProviderSlot* provider_slot = nullptr;
ProviderSlot& TakeProviderSlot();  // this thread's, and the watchdog started, on first use

// Marks the calling thread as inside `call` (a string literal) for the mark's lifetime.
class InProvider {
 public:
  explicit InProvider(const char* call)
      : slot_(provider_slot != nullptr ? *provider_slot : TakeProviderSlot()) {
    slot_.call.store(call, std::memory_order_relaxed);
    slot_.since.store(provider_tick.load(std::memory_order_relaxed), std::memory_order_release);
  }
  ~InProvider() { slot_.since.store(0, std::memory_order_release); }
  InProvider(const InProvider&) = delete;
  InProvider& operator=(const InProvider&) = delete;

 private:
  ProviderSlot& slot_;
};

}  // namespace common
