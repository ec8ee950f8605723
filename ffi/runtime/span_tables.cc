// SpanTables (see span_tables.h).
#include "runtime/span_tables.h"

#include <cstring>

namespace coarse {

int SpanTables::Find(const kernels::Span* table, int64_t n) {
  for (int i = 0; i < kSpanTables; ++i) {
    const std::vector<kernels::Span>& h = held_[i];
    if (used_[i] == 0 || static_cast<int64_t>(h.size()) != n) continue;
    // Span has no implicit padding (kernels/span.h): bytes compare as fields.
    if (n == 0 || std::memcmp(h.data(), table, n * sizeof(kernels::Span)) == 0) {
      used_[i] = ++clock_;
      return i;
    }
  }
  return -1;
}

int SpanTables::Claim(const kernels::Span* table, int64_t n) {
  int victim = 0;
  for (int i = 1; i < kSpanTables; ++i)
    if (used_[i] < used_[victim]) victim = i;
  held_[victim].assign(table, table + n);
  used_[victim] = ++clock_;
  return victim;
}

}  // namespace coarse
