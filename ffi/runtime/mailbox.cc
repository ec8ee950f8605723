// The spin budget of the mailboxes' waits (see mailbox.h).
#include "runtime/mailbox.h"

#include <algorithm>
#include <atomic>

namespace coarse {
namespace {

int64_t HostDefault() {
  return DefaultSpinNs(static_cast<int64_t>(std::thread::hardware_concurrency()));
}

std::atomic<int64_t>& Budget() {
  static std::atomic<int64_t> ns{HostDefault()};
  return ns;
}

}  // namespace

int64_t DefaultSpinNs(int64_t hardware_threads) {
  if (hardware_threads <= 2) return 0;
  return std::min<int64_t>(50000, 2000 * (hardware_threads - 2));
}

int64_t SpinNs() { return Budget().load(std::memory_order_relaxed); }

int64_t SetSpinNs(int64_t ns) {
  return Budget().exchange(ns < 0 ? HostDefault() : ns, std::memory_order_relaxed);
}

}  // namespace coarse
