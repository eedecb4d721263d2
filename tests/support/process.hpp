// Real processes for the end-to-end and cluster tests: start a stage binary, capture what
// it prints, wait for it with a deadline, and never leave it running.
#pragma once

#include <rdma/fabric.h>
#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace testing_support {

// Whether this libfabric's shm has a spinlock in each region that the region's owner takes
// and that a sender to it then needs (tests/provider/shm_faults.cpp, locked-peer): 1.17's
// region lock, 2.6's inject-buffer lock (new in 2.6.0). 2.0-2.5 have neither; 1.18-1.22 were
// not tried.
inline bool ShmPeersTakeLocks() {
  return fi_version() < FI_VERSION(1, 18) || fi_version() >= FI_VERSION(2, 6);
}

struct Result {
  int exit_code = -1;  // -1: killed by a signal or by the deadline
  bool timed_out = false;
  std::string out;
  std::string err;
};

class Process {
 public:
  // Starts argv[0] with the given arguments; stdout and stderr go to temporary files.
  explicit Process(std::vector<std::string> argv);
  Process(Process&& other) noexcept;
  Process& operator=(Process&&) = delete;
  Process(const Process&) = delete;
  ~Process();  // kills (SIGKILL) and reaps a process still running

  pid_t pid() const { return pid_; }
  // Waits until it exits or `limit` passes (then SIGTERM, and SIGKILL 3 s later).
  Result Wait(std::chrono::duration<double> limit = std::chrono::seconds(60));
  void Signal(int sig);
  std::string Output() const;  // what it printed on stdout so far
  std::string Errors() const;  // and on stderr

 private:
  pid_t pid_ = -1;
  std::string out_path_, err_path_;
};

// Runs to completion and returns what happened.
Result RunToEnd(std::vector<std::string> argv,
                std::chrono::duration<double> limit = std::chrono::seconds(60));

// Path of a stage's executable in the build tree (from the E2E_BUILD_DIR environment).
std::string StageBinary(const std::string& stage);

// A fresh empty directory under /tmp, removed with everything in it by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The whole of a file ("" when it cannot be read).
std::string ReadFile(const std::string& path);
// Waits for `path` to hold a whole line and returns it without the newline ("" on timeout).
std::string WaitForLine(const std::string& path, std::chrono::duration<double> limit);
// Waits until `process` printed `text` on stdout or stderr (true; with --json the lines for
// people are on stderr), or `limit` passed (false).
bool WaitForOutput(const Process& process, const std::string& text,
                   std::chrono::duration<double> limit);

// The decimal after `key` in `text` (e.g. "verified ", "\"verified_bytes\":"), or -1.
long long NumberAfter(const std::string& text, const std::string& key);
// The number, with a fraction or not, after the last `key` in `text` (e.g. " bytes) in ",
// "\"seconds\":"), or NaN when `key` is not there (every comparison with it then fails).
double DecimalAfter(const std::string& text, const std::string& key);

// The line of a 07 log that says a data thread was held while its client lived: the server's
// stall line (docs/failure-modes.md, "When WRITEs stop completing") when the thread did not go
// round its loop, or had a share to write and nothing in flight. "" when the log has none. A
// loaded host can hold a pinned thread off its core for seconds; a held thread is not what the
// tests that call this test: they try their scenario again once, and say so.
std::string HeldDataThreadLine(const std::string& log);

// Whether `out` holds JSON records only, one a line, and at least one (--json's stdout).
bool OnlyJsonLines(const std::string& out);

// Provider arguments for a test: tcp is pinned to the loopback domain, so nothing leaves
// this host.
std::vector<std::string> ProviderArgs(const std::string& provider);

// A stage's server started with --address-file (and --exit-after when not 0); `address`
// is empty when it published none within 10 s.
class StageServer {
 public:
  StageServer(const std::string& stage, const std::string& provider, int exit_after,
              std::vector<std::string> extra = {});
  Process& process() { return *process_; }
  const std::string& address() const { return address_; }
  Result Wait(std::chrono::duration<double> limit = std::chrono::seconds(30)) {
    return process_->Wait(limit);
  }

 private:
  TempDir dir_;
  std::unique_ptr<Process> process_;
  std::string address_;
};

// Runs a stage's client against `address` with the provider's arguments and `args`.
Result RunClient(const std::string& stage, const std::string& provider, const std::string& address,
                 std::vector<std::string> args = {},
                 std::chrono::duration<double> limit = std::chrono::seconds(120));

}  // namespace testing_support
