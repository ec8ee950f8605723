#include "runtime/host_memory.h"

#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>

namespace coarse {
namespace {

struct Registry {
  std::mutex mu;
  std::map<uintptr_t, uintptr_t> ranges;  // start -> end
};

Registry& TheRegistry() {
  static Registry* r = new Registry;  // never destroyed: used at exit by late frees
  return *r;
}

}  // namespace

void NoteHostMemory(const void* p, size_t bytes) {
  if (p == nullptr || bytes == 0) return;
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  const auto lo = reinterpret_cast<uintptr_t>(p);
  r.ranges[lo] = lo + bytes;
}

void ForgetHostMemory(const void* p) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.ranges.erase(reinterpret_cast<uintptr_t>(p));
}

bool IsHostMemory(const void* p, size_t bytes) {
  if (p == nullptr || bytes == 0) return false;
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.ranges.empty()) return false;
  const auto lo = reinterpret_cast<uintptr_t>(p);
  const uintptr_t hi = lo + bytes;
  // The last range starting below hi is the only one that can overlap
  // (registered ranges do not overlap one another).
  auto it = r.ranges.lower_bound(hi);
  if (it == r.ranges.begin()) return false;
  --it;
  return it->second > lo;
}

}  // namespace coarse
