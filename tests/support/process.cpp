#include "process.hpp"

#include "provider.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace testing_support {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

static std::string TempName(const char* tag) {
  char name[] = "/tmp/e2e-XXXXXX";
  int fd = mkstemp(name);
  if (fd < 0) throw std::runtime_error("mkstemp failed");
  close(fd);
  return std::string(name) + tag;
}

Process::Process(std::vector<std::string> argv) {
  out_path_ = TempName(".out");
  err_path_ = TempName(".err");
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    setpgid(0, 0);  // its own group, so a kill reaches anything it started
    int out = open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, 1);
    dup2(err, 2);
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    execv(args[0], args.data());
    dprintf(2, "exec %s failed\n", args[0]);
    _exit(127);
  }
}

Process::Process(Process&& other) noexcept
    : pid_(other.pid_),
      out_path_(std::move(other.out_path_)),
      err_path_(std::move(other.err_path_)) {
  other.pid_ = -1;
}

Process::~Process() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    common::RemoveShmRegionsOf(pid_);
  }
  std::error_code ec;
  if (!out_path_.empty()) {
    fs::remove(out_path_, ec);
    fs::remove(err_path_, ec);
    fs::remove(out_path_.substr(0, out_path_.size() - 4), ec);
    fs::remove(err_path_.substr(0, err_path_.size() - 4), ec);
  }
}

void Process::Signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

std::string Process::Output() const {
  return ReadFile(out_path_);
}

std::string Process::Errors() const {
  return ReadFile(err_path_);
}

Result Process::Wait(std::chrono::duration<double> limit) {
  Result r;
  const auto deadline = Clock::now() + limit;
  int status = 0;
  bool term_sent = false;
  auto kill_at = Clock::time_point::max();
  while (true) {
    pid_t w = waitpid(pid_, &status, WNOHANG);
    if (w == pid_) {
      common::RemoveShmRegionsOf(pid_);
      break;
    }
    auto now = Clock::now();
    if (!term_sent && now > deadline) {
      r.timed_out = true;
      kill(pid_, SIGTERM);
      term_sent = true;
      kill_at = now + std::chrono::seconds(3);
    }
    if (now > kill_at) kill(pid_, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  pid_ = -1;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(out_path_);
  r.err = ReadFile(err_path_);
  // A crash must say which signal: "exit code -1" alone cannot be told from a timeout.
  if (WIFSIGNALED(status))
    r.err += "\n[test support: process ended by signal " + std::to_string(WTERMSIG(status)) + " (" +
             strsignal(WTERMSIG(status)) + ")" + (r.timed_out ? ", after its time limit" : "") +
             "]\n";
  return r;
}

Result RunToEnd(std::vector<std::string> argv, std::chrono::duration<double> limit) {
  Process p(std::move(argv));
  return p.Wait(limit);
}

std::string StageBinary(const std::string& stage) {
  const char* dir = std::getenv("E2E_BUILD_DIR");
  return std::string(dir ? dir : ".") + "/" + stage + "/" + stage;
}

TempDir::TempDir() {
  char name[] = "/tmp/e2e-dir-XXXXXX";
  if (mkdtemp(name) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = name;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

bool WaitForOutput(const Process& process, const std::string& text,
                   std::chrono::duration<double> limit) {
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    if (process.Output().find(text) != std::string::npos ||
        process.Errors().find(text) != std::string::npos)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

std::string WaitForLine(const std::string& path, std::chrono::duration<double> limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    std::string text = ReadFile(path);
    if (auto nl = text.find('\n'); nl != std::string::npos) return text.substr(0, nl);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return "";
}

long long NumberAfter(const std::string& text, const std::string& key) {
  auto pos = text.rfind(key);
  if (pos == std::string::npos) return -1;
  pos += key.size();
  size_t end = pos;
  while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
  if (end == pos) return -1;
  return std::stoll(text.substr(pos, end - pos));
}

std::string HeldDataThreadLine(const std::string& log) {
  for (size_t begin = 0; begin < log.size();) {
    const size_t end = std::min(log.find('\n', begin), log.size());
    const std::string line = log.substr(begin, end - begin);
    begin = end + 1;
    if (line.find("no WRITE has completed for ") != std::string::npos &&
        (line.find("went round 0 times") != std::string::npos ||
         line.find("none in flight") != std::string::npos))
      return line;
  }
  return "";
}

double DecimalAfter(const std::string& text, const std::string& key) {
  const auto pos = text.rfind(key);
  if (pos == std::string::npos) return std::nan("");
  return std::strtod(text.c_str() + pos + key.size(), nullptr);
}

std::vector<std::string> ProviderArgs(const std::string& provider) {
  if (provider == "tcp") return {"-p", "tcp", "--domain", "lo"};
  return {"-p", provider};
}

StageServer::StageServer(const std::string& stage, const std::string& provider, int exit_after,
                         std::vector<std::string> extra) {
  const std::string address_file = dir_.path() + "/addr";
  // -v: a test reads what its server dropped and where a thread stalled (diagnostics).
  std::vector<std::string> argv = {StageBinary(stage), "--address-file", address_file, "-v"};
  if (exit_after > 0) {
    argv.push_back("--exit-after");
    argv.push_back(std::to_string(exit_after));
  }
  for (auto& a : ProviderArgs(provider)) argv.push_back(a);
  for (auto& a : extra) argv.push_back(a);
  process_ = std::make_unique<Process>(argv);
  // A server is up in well under a second when the host is idle; on a host that also builds
  // and runs other tests a 07 server over tcp can take over 10 s, so it gets 30 s. One that
  // never writes its address still fails its test then.
  address_ = WaitForLine(address_file, std::chrono::seconds(30));
}

Result RunClient(const std::string& stage, const std::string& provider, const std::string& address,
                 std::vector<std::string> args, std::chrono::duration<double> limit) {
  std::vector<std::string> argv = {StageBinary(stage)};
  for (auto& a : ProviderArgs(provider)) argv.push_back(a);
  argv.push_back(address);
  for (auto& a : args) argv.push_back(a);
  return RunToEnd(argv, limit);
}

bool OnlyJsonLines(const std::string& out) {
  size_t records = 0;
  for (size_t at = 0; at < out.size();) {
    size_t end = out.find('\n', at);
    if (end == std::string::npos) end = out.size();
    const std::string line = out.substr(at, end - at);
    if (!line.empty() && (line.front() != '{' || line.back() != '}')) return false;
    records += !line.empty();
    at = end + 1;
  }
  return records > 0;
}

}  // namespace testing_support
