// Where a thread of this process is, as the kernel sees it (proc(5)): its state, the system
// call it is in, the CPU it has used. What tells a thread stuck inside a provider call that
// spins (a lock, a busy loop) from one that waits on the network, on the kernel, or for a
// core of a loaded host (07's stall lines and its engine watch).
#pragma once

#include <sys/types.h>

#include <string>
#include <thread>

namespace common {

// CPU time another thread of ours has used, in seconds (its pthread CPU clock); -1 if unknown.
double CpuSecondsOf(std::thread& t);
// Its state letter (R running or runnable, S/D waiting in the kernel, T stopped); '?' if gone.
char ThreadState(pid_t tid);
// Where it is now: running in user space, in a named system call with its first three
// arguments, or in the kernel outside one (a page fault); with its state and wchan.
std::string WhereIs(pid_t tid);

}  // namespace common
