#include "provider_watch.hpp"

#include <unistd.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>

#include "error.hpp"
#include "program.hpp"
#include "provider.hpp"

namespace common {
namespace {

constexpr size_t kSlots = 1024;  // threads that ever made a provider call
constexpr auto kTick = std::chrono::milliseconds(100);
ProviderSlot slots[kSlots];
std::atomic<size_t> slots_taken{0};
std::atomic<double> stuck_seconds{kStuckSeconds};

[[noreturn]] void SayStuckAndExit(const char* call) {
  const std::string line =
      std::string(ProgramName()) + ": error: a thread has been inside the provider's " + call +
      " for " + std::to_string(static_cast<int>(stuck_seconds.load())) +
      " s and will not come back (shm: a message over 64 KiB, or a peer killed holding its "
      "region's lock; README.md, \"When the provider cannot go on\"); exiting\n";
  [[maybe_unused]] ssize_t n = write(STDOUT_FILENO, line.data(), line.size());
  n = write(STDERR_FILENO, line.data(), line.size());
  RemoveShmRegionsOf(getpid());
  _exit(kExitFailure);
}

void Watch() {
  for (;;) {
    std::this_thread::sleep_for(kTick);
    const auto stuck = static_cast<uint32_t>(stuck_seconds.load() * 1000 / kTick.count());
    const uint32_t now = provider_tick.fetch_add(1, std::memory_order_relaxed) + 1;
    const size_t taken = std::min(slots_taken.load(std::memory_order_acquire), kSlots);
    for (size_t i = 0; i < taken; ++i) {
      const uint32_t since = slots[i].since.load(std::memory_order_acquire);
      if (since != 0 && now - since >= stuck)
        SayStuckAndExit(slots[i].call.load(std::memory_order_relaxed));
    }
  }
}

}  // namespace

void SetStuckSeconds(double seconds) { stuck_seconds.store(seconds); }
double StuckSeconds() { return stuck_seconds.load(); }

ProviderSlot& TakeProviderSlot() {
  static std::once_flag started;
  std::call_once(started, [] { std::thread(Watch).detach(); });
  const size_t i = slots_taken.fetch_add(1, std::memory_order_acq_rel);
  if (i >= kSlots) throw Error("more than 1024 threads made provider calls");
  provider_slot = &slots[i];
  return slots[i];
}

}  // namespace common
