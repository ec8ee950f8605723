// Counters of the runtime's thread starts, parks and wake-ups: the fixed
// cost of a sync broken down (issue 39, "Wake-ups"). Relaxed atomics, bumped
// where a thread starts, parks on a condition variable, wakes, or finds its
// work by spinning, and where a state change notifies (or need not notify) a
// device's mailbox. Process-wide, never reset by the runtime itself: a
// reader takes differences (wakeup_stats / reset_wakeup_stats bindings).
#pragma once

#include <cstdint>

namespace coarse {

enum class Wakeup : int {
  kThreadStart,      // a runtime thread was created (service pool, queues, host pool)
  kPark,             // a wait slept on a condition variable (one per sleep)
  kWokeWithWork,     // a park ended and the wait's condition held
  kSpinFound,        // a wait's condition held while it spun, before parking
  kNotifySleeper,    // a notify found a parked waiter to wake
  kNotifyNoSleeper,  // a notify found none parked (nothing to wake)
  kJobStarted,       // a proxy's job began to run on a service thread
  kJobLate,          // ... after a push of its session had already arrived
  kJobQueuedAtPush,  // a proxy's job queued by a push: its session's first worker call
  kCount,
};

void CountWakeup(Wakeup what, int64_t n = 1);
// Nanoseconds from a proxy's job being submitted to its start.
void AddJobStartNs(int64_t ns);
// Nanoseconds a session's wait spent parked (summed over threads; not the
// service threads' idle time between jobs).
void AddParkedNs(int64_t ns);

struct WakeupStats {
  int64_t thread_starts = 0, parks = 0, woke_with_work = 0, spin_found = 0, notify_sleeper = 0,
          notify_no_sleeper = 0, jobs_started = 0, jobs_late = 0, jobs_queued_at_push = 0,
          parked_ns = 0, job_start_ns = 0;
};
WakeupStats TheWakeupStats();
void ResetWakeupStats();

}  // namespace coarse
