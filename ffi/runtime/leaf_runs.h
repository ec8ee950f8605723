// Cutting runs of leaf elements to a window of the f32 buffer they map to:
// the chunk one device reads or writes of a piece, a scratch or a gathered
// group.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "runtime/device.h"
#include "runtime/dtype.h"

namespace coarse {

// The part of run `r` (at its buf_off in the buffer) inside elements
// [lo, hi) of the buffer, its buf_off counted from `base` (lo: offsets into
// a chunk that starts at lo; 0: offsets into the whole buffer). False if
// they do not meet.
inline bool ClipRun(const LeafRun& r, int64_t lo, int64_t hi, int64_t base, LeafRun* out) {
  const int64_t a = std::max(lo, r.buf_off), b = std::min(hi, r.buf_off + r.len);
  if (a >= b) return false;
  *out = LeafRun{ElementPtr(r.leaf, r.dtype, a - r.buf_off), r.dtype, b - a, a - base};
  return true;
}

// ClipRun over every run of `runs`, keeping the parts that meet [lo, hi).
inline std::vector<LeafRun> ClipRuns(const std::vector<LeafRun>& runs, int64_t lo, int64_t hi,
                                     int64_t base) {
  std::vector<LeafRun> out;
  LeafRun part;
  for (const LeafRun& r : runs)
    if (ClipRun(r, lo, hi, base, &part)) out.push_back(part);
  return out;
}

}  // namespace coarse
