// The wake-up counters (see wakeups.h).
#include "runtime/wakeups.h"

#include <atomic>

namespace coarse {
namespace {

constexpr int kParkedNs = static_cast<int>(Wakeup::kCount), kJobStartNs = kParkedNs + 1;
constexpr int kSlots = kJobStartNs + 1;
std::atomic<int64_t> g_counts[kSlots];

int64_t Read(int slot) { return g_counts[slot].load(std::memory_order_relaxed); }

}  // namespace

void CountWakeup(Wakeup what, int64_t n) {
  g_counts[static_cast<int>(what)].fetch_add(n, std::memory_order_relaxed);
}

void AddParkedNs(int64_t ns) { g_counts[kParkedNs].fetch_add(ns, std::memory_order_relaxed); }

void AddJobStartNs(int64_t ns) { g_counts[kJobStartNs].fetch_add(ns, std::memory_order_relaxed); }

WakeupStats TheWakeupStats() {
  auto at = [](Wakeup w) { return Read(static_cast<int>(w)); };
  WakeupStats w;
  w.thread_starts = at(Wakeup::kThreadStart);
  w.parks = at(Wakeup::kPark);
  w.woke_with_work = at(Wakeup::kWokeWithWork);
  w.spin_found = at(Wakeup::kSpinFound);
  w.notify_sleeper = at(Wakeup::kNotifySleeper);
  w.notify_no_sleeper = at(Wakeup::kNotifyNoSleeper);
  w.jobs_started = at(Wakeup::kJobStarted);
  w.jobs_late = at(Wakeup::kJobLate);
  w.jobs_queued_at_push = at(Wakeup::kJobQueuedAtPush);
  w.parked_ns = Read(kParkedNs);
  w.job_start_ns = Read(kJobStartNs);
  return w;
}

void ResetWakeupStats() {
  for (auto& c : g_counts) c.store(0, std::memory_order_relaxed);
}

}  // namespace coarse
