// The wake-up counters (see wakeups.h).
#include "runtime/wakeups.h"

#include <atomic>

namespace coarse {
namespace {

constexpr int kSlots = static_cast<int>(Wakeup::kCount) + 1;  // + parked ns
std::atomic<int64_t> g_counts[kSlots];

int64_t Read(int slot) { return g_counts[slot].load(std::memory_order_relaxed); }

}  // namespace

void CountWakeup(Wakeup what, int64_t n) {
  g_counts[static_cast<int>(what)].fetch_add(n, std::memory_order_relaxed);
}

void AddParkedNs(int64_t ns) { g_counts[kSlots - 1].fetch_add(ns, std::memory_order_relaxed); }

WakeupStats TheWakeupStats() {
  auto at = [](Wakeup w) { return Read(static_cast<int>(w)); };
  return WakeupStats{
      at(Wakeup::kThreadStart), at(Wakeup::kPark),          at(Wakeup::kWokeWithWork),
      at(Wakeup::kSpinFound),   at(Wakeup::kNotifySleeper), at(Wakeup::kNotifyNoSleeper),
      Read(kSlots - 1)};
}

void ResetWakeupStats() {
  for (auto& c : g_counts) c.store(0, std::memory_order_relaxed);
}

}  // namespace coarse
