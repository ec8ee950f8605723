// HostSharedMemory (see shared_memory_sums.h).
#include "cpu/shared_memory_sums.h"

#include <algorithm>
#include <cstring>

#include "host/element_loops.h"
#include "runtime/leaf_runs.h"
#include "runtime/traffic.h"

namespace coarse {

constexpr int64_t kF32 = sizeof(float);

Status HostSharedMemory::SumInRingOrder(float* dst, const float* const* srcs, int64_t num,
                                        int64_t n, float scale) {
  cpu::SumInOrderF32(dst, srcs, num, n, scale);
  CountTraffic(TrafficOp::kSum, num * n * kF32, n * kF32);
  return Status::Success();
}

namespace {

// target[i - a] = (first) or += float(the pushed value of piece element i),
// for i in [a, b) covered by `runs` (sorted by buf_off). Returns the bytes read.
int64_t WidenRuns(const PushedRuns& runs, int64_t a, int64_t b, float* target, bool first) {
  auto it = std::upper_bound(runs.begin(), runs.end(), a,
                             [](int64_t x, const LeafRun& r) { return x < r.buf_off + r.len; });
  LeafRun part;  // buf_off from a: the offset in `target`
  int64_t read = 0;
  for (; it != runs.end() && it->buf_off < b; ++it) {
    if (!ClipRun(*it, a, b, a, &part)) continue;
    if (first)
      cpu::WidenToF32(part.dtype, part.leaf, target + part.buf_off, part.len);
    else
      cpu::AddWidenedF32(part.dtype, part.leaf, target + part.buf_off, part.len);
    read += part.len * ByteWidth(part.dtype);
  }
  return read;
}

}  // namespace

Status HostSharedMemory::SumPushesInRingOrder(
    float* dst, int64_t lo, int64_t hi, const std::vector<std::vector<const PushedRuns*>>& groups,
    float scale) {
  // Each client's runs of [lo, hi) are read once (in their dtype, counted as
  // they are widened), `dst` written once.
  int64_t read = 0;
  // Block by block through stack buffers, like SumInRingOrder.
  constexpr int64_t kBlock = 2048;
  float acc[kBlock], tmp[kBlock];
  for (int64_t a = lo; a < hi; a += kBlock) {
    const int64_t m = std::min(kBlock, hi - a);
    for (size_t t = 0; t < groups.size(); ++t) {
      const std::vector<const PushedRuns*>& g = groups[t];
      // A lone client adds straight into the sum: widening is exact, so the
      // bits are those of adding its (one-term) sum.
      const bool direct = t > 0 && g.size() == 1;
      float* target = t == 0 || direct ? acc : tmp;
      if (!direct) std::memset(target, 0, m * sizeof(float));  // no client: zeros
      for (size_t c = 0; c < g.size(); ++c)
        read += WidenRuns(*g[c], a, a + m, target, c == 0 && !direct);
      if (t > 0 && !direct) cpu::AddF32(acc, tmp, m);
    }
    if (scale != 1.0f) cpu::ScaleF32(acc, scale, m);
    std::memcpy(dst + (a - lo), acc, m * sizeof(float));
  }
  CountTraffic(TrafficOp::kSum, read, (hi - lo) * kF32);
  return Status::Success();
}

SharedMemory& TheHostSharedMemory() {
  static HostSharedMemory sums;
  return sums;
}

}  // namespace coarse
