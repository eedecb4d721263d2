#include "thread_state.hpp"

#include <pthread.h>
#include <sys/syscall.h>

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <sstream>

namespace common {

double CpuSecondsOf(std::thread& t) {
  clockid_t clock{};
  timespec ts{};
  if (!t.joinable() || pthread_getcpuclockid(t.native_handle(), &clock) != 0 ||
      clock_gettime(clock, &ts) != 0)
    return -1;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}
char ThreadState(pid_t tid) {
  std::string stat;
  std::getline(std::ifstream("/proc/self/task/" + std::to_string(tid) + "/stat"), stat);
  const size_t paren = stat.rfind(')');  // the state follows the name, which may hold spaces
  return paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : '?';
}
// /proc/self/task/TID: stat's state, syscall and wchan.
std::string WhereIs(pid_t tid) {
  const std::string dir = "/proc/self/task/" + std::to_string(tid) + "/";
  std::string syscall_line, wchan;
  std::getline(std::ifstream(dir + "syscall"), syscall_line);
  std::getline(std::ifstream(dir + "wchan"), wchan);
  const char state = ThreadState(tid);
  if (syscall_line.empty()) return std::string("state ") + state;
  if (syscall_line.rfind("running", 0) == 0)
    return std::string("running in user space (state ") + state + ")";
  const long nr = std::strtol(syscall_line.c_str(), nullptr, 10);
  static const std::map<long, const char*> kNames = {
      {SYS_read, "read"},
      {SYS_write, "write"},
      {SYS_futex, "futex (a lock)"},
      {SYS_sendmsg, "sendmsg"},
      {SYS_recvmsg, "recvmsg"},
      {SYS_sendto, "sendto"},
      {SYS_recvfrom, "recvfrom"},
      {SYS_ppoll, "ppoll"},
      {SYS_epoll_pwait, "epoll_pwait"},
      {SYS_munmap, "munmap"},
      {SYS_madvise, "madvise"},
      {SYS_mmap, "mmap"},
      {SYS_ioctl, "ioctl"},
      {SYS_clock_nanosleep, "clock_nanosleep"},
#ifdef SYS_poll
      {SYS_poll, "poll"},
      {SYS_epoll_wait, "epoll_wait"},
      {SYS_nanosleep, "nanosleep"},
#endif
  };
  std::string where;
  if (nr < 0) {
    where = "in the kernel outside a system call (a page fault)";
  } else {
    const auto name = kNames.find(nr);
    where = "in system call " +
            (name != kNames.end() ? std::string(name->second) : "number " + std::to_string(nr));
    // Its first three arguments, as proc(5) gives them (hex): a poll's fd count and timeout in
    // ms tell the engine's own 100 ms wait on its lanes from a wait of the provider's.
    std::istringstream fields(syscall_line);
    std::string field, args;
    fields >> field;
    for (int i = 0; i < 3 && fields >> field; ++i) args += (i ? " " : "") + field;
    if (!args.empty()) where += ", arguments " + args;
  }
  where += std::string(" (state ") + state;
  if (!wchan.empty() && wchan != "0") where += ", waiting in " + wchan;
  return where + ")";
}

}  // namespace common
