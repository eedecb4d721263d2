#include "program.hpp"

#include "error.hpp"
#include "protocol.hpp"
#include "provider.hpp"

#include <semaphore.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>

namespace common {

static std::atomic<bool> stop_requested{false};
static std::atomic<const char*> program_name{"program"};

const char* ProgramName() {
  return program_name.load();
}
static sem_t stop_signal;

static void OnStopSignal(int) {
  stop_requested.store(true);
  sem_post(&stop_signal);  // async-signal-safe: wakes the watchdog
}

void InstallStopHandlers(const char* program) {
  sem_init(&stop_signal, 0, 0);
  struct sigaction action {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  // A stop ends the program even when a provider call never returns (shm spins forever in a
  // few cases; see docs/architecture.md): after kStopGraceSeconds the watchdog exits for it.
  std::thread([program] {
    while (sem_wait(&stop_signal) != 0) {
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(kStopGraceSeconds));
    const std::string line = std::string(program) + ": error: still inside a provider call " +
                             std::to_string(static_cast<int>(kStopGraceSeconds)) +
                             " s after the stop request; exiting without cleaning up\n";
    [[maybe_unused]] ssize_t n = write(STDERR_FILENO, line.data(), line.size());
    _exit(kExitFailure);
  }).detach();
}

static std::atomic<bool> verbose{false};
void SetVerbose(bool on) {
  verbose.store(on);
}
void Diagnostic(const char* format, ...) {
  if (!verbose.load()) return;
  va_list args;
  va_start(args, format);
  std::vprintf(format, args);
  va_end(args);
}

bool StopRequested() {
  return stop_requested.load(std::memory_order_relaxed);
}

void Abandon(const char* program, const std::string& why) {
  std::fflush(stdout);
  std::fprintf(stderr, "%s: error: %s\n", program, why.c_str());
  std::fflush(stderr);
  RemoveShmRegionsOf(getpid());
  _exit(kExitFailure);
}

int RunProgram(const char* name, const std::function<int()>& body) {
  program_name.store(name);
  wire::SetOwnStage(wire::StageOfProgram(name));  // what its messages say it is
  try {
    return body();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", name, e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", name, e.what());
    return kExitFailure;
  }
}

}  // namespace common
