// An idle loop's manners, in every stage. A polling loop that finds nothing to do first yields
// its core for a while (sched_yield: back at once where nothing else wants the core; where the
// peer process or the kernel's TCP stack carries the data on the same cores, they run
// meanwhile), then sleeps, a little longer each idle round (1 us doubling to 64 us). Any round
// with work resets it. 01-04 count a poll that found no completion as idle; from 05 on, a round
// is idle only if it found nothing at all to do (no completion, no message, nothing posted); 06
// and 07 over tcp sleep in the CQ's wait fd instead (--wait block). On a link of 1 Gbit/s a
// 64 KiB WRITE takes 500 us, so a 64 us nap costs nothing. Figures:
// docs/2026-12-05-idle-manners.md.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace common {

class IdleBackoff {
 public:
  // `longest_shift`: naps of at most 2^longest_shift us (6: 64 us).
  explicit IdleBackoff(unsigned longest_shift = 6) : max_shift_(longest_shift) {}
  void Busy() { idle_ = 0; }
  void Idle() {
    if (++idle_ <= kYields) {
      std::this_thread::yield();
      return;
    }
    const unsigned shift = idle_ - kYields - 1;
    std::this_thread::sleep_for(
        std::chrono::microseconds(1u << (shift < max_shift_ ? shift : max_shift_)));
  }

 private:
  static constexpr unsigned kYields = 64;  // idle rounds that yield before the first nap
  unsigned max_shift_;
  unsigned idle_ = 0;
};

// A control thread's manners (07's service and its client's watcher, beside data threads that
// spin): with nothing to do it sleeps 1 ms, doubling to 8 ms while it stays idle, and any round
// with a message starts again at 1 ms. A message that comes while it sleeps waits at most 8 ms;
// the data threads lose a core to it only for its wake-ups.
class ControlNap {
 public:
  void Busy() { nap_ = kFirst; }
  void Idle() {
    std::this_thread::sleep_for(nap_);
    nap_ = std::min(nap_ * 2, kLongest);
  }

 private:
  static constexpr std::chrono::milliseconds kFirst{1}, kLongest{8};
  std::chrono::milliseconds nap_ = kFirst;
};

}  // namespace common
