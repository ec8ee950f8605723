// The mailboxes' stress test (see wakeup_selftest.h).
#include "lab/wakeup_selftest.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "runtime/mailbox.h"

namespace coarse {
namespace {

using SteadyClock = std::chrono::steady_clock;

// A seeded delay: three times in eight none, twice a yield, twice a busy
// spin of up to 20 us, once a sleep of up to 200 us (long enough to let the
// other threads run through a round's checks, notifies and parks).
struct Delay {
  std::mt19937_64 rng;
  void operator()() {
    const uint64_t d = rng();
    const int64_t us = static_cast<int64_t>((d >> 8) % 200);
    switch (d % 8) {
      case 3:
      case 4: std::this_thread::yield(); break;
      case 5:
      case 6: {
        const auto end = SteadyClock::now() + std::chrono::microseconds(us / 10);
        while (SteadyClock::now() < end) CpuRelax();
        break;
      }
      case 7: std::this_thread::sleep_for(std::chrono::microseconds(us)); break;
      default: break;
    }
  }
};

struct DelayBeforePark {
  Delay* delay;
  void BeforePark() const { (*delay)(); }
};

}  // namespace

WakeupSelfTestResult RunWakeupSelfTest(int64_t threads, int64_t rounds, uint64_t seed,
                                       int64_t timeout_ms, int64_t spin_ns) {
  const int64_t old_spin = SetSpinNs(spin_ns);
  const int64_t boxes = (threads + 1) / 2;  // two waiters per mailbox
  std::unique_ptr<Mailbox[]> mailbox(new Mailbox[boxes]);
  std::atomic<int64_t> arrived{0}, waits{0}, lost{0}, max_wait_ns{0};
  std::atomic<bool> failed{false};
  const auto timeout = std::chrono::milliseconds(timeout_ms);
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      Delay delay{std::mt19937_64(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(t))};
      const DelayBeforePark hooks{&delay};
      Mailbox& mine = mailbox[t % boxes];
      for (int64_t r = 0; r < rounds && !failed.load(); ++r) {
        delay();
        arrived.fetch_add(1, std::memory_order_release);
        delay();
        // Every mailbox, starting at a different one per thread.
        for (int64_t b = 0; b < boxes; ++b) mailbox[(t + b) % boxes].Notify();
        const int64_t target = (r + 1) * threads;
        const auto t0 = SteadyClock::now();
        const bool ok = mine.Await(
            [&] { return arrived.load(std::memory_order_acquire) >= target || failed.load(); },
            t0 + timeout, hooks);
        waits.fetch_add(1);
        if (!ok) {
          lost.fetch_add(1);
          failed.store(true);
          for (int64_t b = 0; b < boxes; ++b) mailbox[b].Notify();
          return;
        }
        const int64_t ns =
            std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now() - t0).count();
        int64_t cur = max_wait_ns.load();
        while (cur < ns && !max_wait_ns.compare_exchange_weak(cur, ns)) {
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  SetSpinNs(old_spin);
  return WakeupSelfTestResult{waits.load(), lost.load(), max_wait_ns.load() / 1e6};
}

}  // namespace coarse
