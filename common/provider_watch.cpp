#include "provider_watch.hpp"

#include <pthread.h>
#include <rdma/fabric.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "error.hpp"
#include "program.hpp"
#include "provider.hpp"
#include "provider_quirks.hpp"

namespace common {
namespace {

constexpr size_t kSlots = 1024;  // threads that ever made a provider call
constexpr auto kTick = std::chrono::milliseconds(100);
ProviderSlot slots[kSlots];
std::atomic<size_t> slots_taken{0};
std::atomic<double> stuck_seconds{kStuckSeconds};
char provider_name[64] = "";   // set before any watched call; read by the watchdog and OnCrash
char provider_line[160] = "";  // "tcp, libfabric 2.6", with shm's causes where they apply

bool IsShm() {
  return std::strcmp(provider_name, "shm") == 0;
}
// One line to the log: stdout, and stderr too where that is somewhere else (a terminal with
// stdout in a file), never the same line twice in one place.
void SayOnce(const char* line, size_t size) {
  struct stat out {
  }, err{};
  [[maybe_unused]] ssize_t n = write(STDOUT_FILENO, line, size);
  if (fstat(STDOUT_FILENO, &out) != 0 || fstat(STDERR_FILENO, &err) != 0 ||
      out.st_dev != err.st_dev || out.st_ino != err.st_ino)
    n = write(STDERR_FILENO, line, size);
}

// The spins above are shm's. Another provider's call that takes long is making progress on a
// slow or loaded host (a tcp call with much to send), so it gets kSlowCallSeconds.
double WatchedSeconds() {
  return IsShm() || provider_name[0] == '\0' ? stuck_seconds.load()
                                             : std::max(stuck_seconds.load(), kSlowCallSeconds);
}
[[noreturn]] void SayStuckAndExit(const char* call) {
  const std::string line =
      std::string(ProgramName()) + ": error: a thread has been inside the provider's " + call +
      " (" + provider_line + ") for " + std::to_string(static_cast<int>(stuck_seconds.load())) +
      " s and will not come back" +
      (IsShm()
           ? " (shm: a message over 64 KiB, or a peer killed or stopped holding its region's lock)"
           : "") +
      "; README.md, \"When the provider cannot go on\"; exiting\n";
  SayOnce(line.data(), line.size());
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
    add(" (");
    add(provider_line);
    add(")");
    // The one crash of shm's found so far (common/provider_quirks.cpp). Elsewhere the cause
    // is not known.
    if (Has(Quirk::kCrashesOnClosedSender, provider_name, fi_version()))
      add(": a peer gone before its first message was read");
    add("; README.md, \"When the provider cannot go on\"; exiting\n");
  } else {
    add(" outside any provider call: a defect of this program; please report it\n");
  }
  if (line[used - 1] != '\n') line[used++] = '\n';  // cut short: the line still ends
  SayOnce(line, used);
  raise(signal);  // delivered on return, to the default action: a crash raised, not faulted
}

// CPU seconds a thread has used; -1 if its clock is gone (the thread ended).
double CpuSeconds(const ProviderSlot& slot) {
  timespec ts{};
  if (!slot.clock_known.load() || clock_gettime(slot.clock.load(), &ts) != 0) return -1;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}
// A call is stuck once it is `stuck` ticks old and its thread spent nearly that long on a CPU
// since the watchdog first saw it (within a tick of its start): a thread that waits for a CPU
// on a loaded host is slow, not stuck, and a spin takes every CPU slice it gets.
void Watch() {
  static uint32_t seen_since[kSlots];
  static double cpu_at_seen[kSlots];
  for (;;) {
    std::this_thread::sleep_for(kTick);
    const double seconds = WatchedSeconds();
    const auto stuck = static_cast<uint32_t>(seconds * 1000 / kTick.count());
    const uint32_t now = provider_tick.fetch_add(1, std::memory_order_relaxed) + 1;
    const size_t taken = std::min(slots_taken.load(std::memory_order_acquire), kSlots);
    for (size_t i = 0; i < taken; ++i) {
      const uint32_t since = slots[i].since.load(std::memory_order_acquire);
      if (since == 0 || now - since < 1) continue;
      if (since != seen_since[i]) {  // a call first seen
        seen_since[i] = since;
        cpu_at_seen[i] = CpuSeconds(slots[i]);
      }
      if (now - since < stuck) continue;
      const double cpu = CpuSeconds(slots[i]);
      const double slack = 2.0 * kTick.count() / 1000;  // its first tick, and this one
      if (cpu < 0 || cpu_at_seen[i] < 0 || cpu - cpu_at_seen[i] >= seconds - slack)
        SayStuckAndExit(slots[i].call.load(std::memory_order_relaxed));
    }
  }
}

}  // namespace

void SetWatchedProvider(const char* name) {
  if (std::strcmp(provider_name, name) == 0) return;
  std::snprintf(provider_name, sizeof(provider_name), "%s", name);
  std::snprintf(provider_line, sizeof(provider_line), "%s, libfabric %u.%u", name,
                FI_MAJOR(fi_version()), FI_MINOR(fi_version()));
}
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
  clockid_t clock{};
  if (pthread_getcpuclockid(pthread_self(), &clock) == 0) {
    slots[i].clock.store(clock);
    slots[i].clock_known.store(true);
  }
  provider_slot = &slots[i];
  return slots[i];
}

}  // namespace common
