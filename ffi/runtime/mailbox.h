// Where a thread waits for state that other threads advance, and where they
// wake it: a device's mailbox in a Session (session.h), one waiter or a few.
//
// A wait first spins for a bounded time (SpinNs: tuned to the host's cores),
// then parks on the condition variable. On a host of at most 2 hardware
// threads it does not spin at all, it only yields once: a spinning waiter
// would hold the core that the thread it waits for (a worker's XLA thread, a
// proxy's job) needs to make progress.
//
// A notify skips the condition variable when no waiter is parked. No wake-up
// is lost: a waiter checks its condition and registers as parked under the
// mutex, in one critical section, and the notifier reads that count under the
// same mutex after its state change. So either the waiter's check comes after
// the notifier's critical section (and sees the change: the mutex orders
// them), or it comes before, and the waiter is counted parked when the
// notifier looks. A condition must only read state whose writers Notify this
// mailbox after writing it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "runtime/wakeups.h"

namespace coarse {

// How long a wait spins before it parks, in nanoseconds; 0: it yields once.
int64_t SpinNs();
// Sets it; a negative value restores DefaultSpinNs for this host. Returns
// the previous value (benchmarks, tests).
int64_t SetSpinNs(int64_t ns);
// The default for a host with `hardware_threads`: 0 up to 2, then 2 us per
// thread beyond 2, at most 50 us (the cost of a park and wake-up on a loaded
// host is tens of microseconds: spinning longer than that gains nothing).
int64_t DefaultSpinNs(int64_t hardware_threads);

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Checks `cond` for up to SpinNs() (or after one yield); true once it holds.
template <class Cond>
bool SpinFor(const Cond& cond) {
  const int64_t budget = SpinNs();
  if (budget <= 0) {
    std::this_thread::yield();
    return cond();
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::nanoseconds(budget);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (cond()) return true;
      CpuRelax();
    }
    if (std::chrono::steady_clock::now() >= end) return cond();
  }
}

// What a test may do inside a wait, with the mutex held, between the last
// check of the condition and parking (lab/wakeup_selftest.h delays there).
struct NoWaitHooks {
  void BeforePark() const {}
};

class Mailbox {
 public:
  // Waits until `cond()` holds (true) or `until` passes (false): spins, then
  // parks; a notify or a spurious wake-up re-checks.
  template <class Cond, class Hooks = NoWaitHooks>
  bool Await(const Cond& cond, std::chrono::steady_clock::time_point until,
             const Hooks& hooks = {}) {
    if (cond()) return true;
    if (SpinFor(cond)) {
      CountWakeup(Wakeup::kSpinFound);
      return true;
    }
    std::unique_lock<std::mutex> lock(mu_);
    bool slept = false;
    while (!cond()) {
      if (std::chrono::steady_clock::now() >= until) return false;
      hooks.BeforePark();
      ++parked_;
      CountWakeup(Wakeup::kPark);
      const auto t0 = std::chrono::steady_clock::now();
      cv_.wait_until(lock, until);
      AddParkedNs(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - t0)
                      .count());
      --parked_;
      slept = true;
    }
    if (slept) CountWakeup(Wakeup::kWokeWithWork);
    return true;
  }

  // Wakes the parked waiters, if any. Call it after the state change.
  void Notify() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (parked_ == 0) {
        CountWakeup(Wakeup::kNotifyNoSleeper);
        return;
      }
    }
    CountWakeup(Wakeup::kNotifySleeper);
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int parked_ = 0;  // waiters asleep on cv_ (guarded by mu_)
};

}  // namespace coarse
