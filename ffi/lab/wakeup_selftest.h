// An adversarial test of the mailboxes' wait and notify (mailbox.h): many
// threads meet at a barrier, round after round, each waiting on a mailbox it
// shares with another thread and notifying every mailbox when it arrives,
// with seeded random delays (none, yields, busy spins, sleeps) before each
// arrival, between the arrival and its notifies, and inside the wait between
// its last check and parking (NoWaitHooks::BeforePark). A lost wake-up leaves
// a waiter asleep until its timeout: the test counts those (`lost`) and stops
// every thread at the first. tests/test_wakeups.py.
#pragma once

#include <cstdint>

namespace coarse {

struct WakeupSelfTestResult {
  int64_t waits = 0;       // waits made
  int64_t lost = 0;        // waits that timed out: a wake-up was lost
  double max_wait_ms = 0;  // the longest wait that did not time out
};

// `threads` threads, `rounds` barriers, delays drawn from `seed`; a wait
// times out after `timeout_ms`. Runs with the mailboxes' spin budget set to
// `spin_ns` (restored after).
WakeupSelfTestResult RunWakeupSelfTest(int64_t threads, int64_t rounds, uint64_t seed,
                                       int64_t timeout_ms, int64_t spin_ns);

}  // namespace coarse
