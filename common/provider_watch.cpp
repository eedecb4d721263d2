#include "provider_watch.hpp"

#include <unistd.h>

#include <csignal>

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

// A crash inside a marked call is the provider's (1.17's shm reads a message from the region of
// a peer already gone: docs/architecture.md), said as a stuck call is; the signal then ends the
// program as it would have (the handler is reset), so a supervisor sees the crash.
void OnCrash(int signal) {
  // No allocation here (the crash may be inside malloc): the line is built in a fixed buffer.
  char line[512];
  size_t used = 0;
  auto add = [&](const char* text) {
    for (; *text != '\0' && used < sizeof(line) - 2; ++text) line[used++] = *text;
  };
  const ProviderSlot* slot = provider_slot;
  const char* call = slot != nullptr && slot->since.load() != 0 ? slot->call.load() : nullptr;
  add(ProgramName());
  add(signal == SIGSEGV ? ": error: a thread crashed (SIGSEGV)"
                        : ": error: a thread crashed (SIGBUS)");
  if (call != nullptr) {
    add(" inside the provider's ");
    add(call);
    add(" (shm 1.17: a peer gone before its first message was read; README.md, \"When the "
        "provider cannot go on\"); exiting\n");
  } else {
    add(" outside any provider call: a defect of this program; please report it\n");
  }
  if (line[used - 1] != '\n') line[used++] = '\n';  // cut short: the line still ends
  [[maybe_unused]] ssize_t n = write(STDOUT_FILENO, line, used);
  n = write(STDERR_FILENO, line, used);
  raise(signal);  // delivered on return, to the default action: a crash raised, not faulted
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

void SetStuckSeconds(double seconds) {
  stuck_seconds.store(seconds);
}
double StuckSeconds() {
  return stuck_seconds.load();
}

ProviderSlot& TakeProviderSlot() {
  static std::once_flag started;
  std::call_once(started, [] {
    struct sigaction action {};
    action.sa_handler = OnCrash;
    action.sa_flags = SA_RESETHAND;  // the faulting instruction runs again, and ends us
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, nullptr);
    sigaction(SIGBUS, &action, nullptr);
    std::thread(Watch).detach();
  });
  const size_t i = slots_taken.fetch_add(1, std::memory_order_acq_rel);
  if (i >= kSlots) throw Error("more than 1024 threads made provider calls");
  provider_slot = &slots[i];
  return slots[i];
}

}  // namespace common
