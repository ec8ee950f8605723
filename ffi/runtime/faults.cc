// The deliberate faults' switch (see faults.h).
#include "runtime/faults.h"

#include <atomic>

namespace coarse {
namespace {
std::atomic<int64_t> active{0};
}  // namespace

int64_t SetFaults(int64_t mask) { return active.exchange(mask, std::memory_order_relaxed); }

bool HasFault(Fault fault) {
  return (active.load(std::memory_order_relaxed) & static_cast<int64_t>(fault)) != 0;
}

}  // namespace coarse
