#include "program.hpp"

#include "error.hpp"

#include <atomic>
#include <csignal>
#include <cstdio>
#include <exception>

namespace common {

static std::atomic<bool> stop_requested{false};

static void OnStopSignal(int) {
  stop_requested.store(true);
}

void InstallStopHandlers() {
  struct sigaction action {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

bool StopRequested() {
  return stop_requested.load(std::memory_order_relaxed);
}

int RunProgram(const char* name, const std::function<int()>& body) {
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
