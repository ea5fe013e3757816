// A test-and-test-and-set lock for the pool's short critical sections (a TLSF operation and
// counters). Measured on the H200 host with 8 threads: std::mutex parks waiters in futex calls
// that cost microseconds each in the VM, so pairs took 15-20 us; spinning briefly avoids that.
// After a bounded spin it yields, so a descheduled holder cannot stall waiters for long.
#pragma once

#include <atomic>
#include <sched.h>

namespace cupool {

class SpinLock {
 public:
  void lock() noexcept {
    for (;;) {
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
      int spins = 0;
      while (locked_.load(std::memory_order_relaxed)) {
        if (++spins < 256) {
          __builtin_ia32_pause();
        } else {
          sched_yield();
          spins = 0;
        }
      }
    }
  }
  bool try_lock() noexcept {
    return !locked_.load(std::memory_order_relaxed) && !locked_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }
  // In a forked child (one thread): a lock another thread of the parent held stays held.
  void reset_after_fork() noexcept { locked_.store(false, std::memory_order_relaxed); }

 private:
  std::atomic<bool> locked_{false};
};

}  // namespace cupool
