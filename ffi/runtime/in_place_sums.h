// Sums that read peers' buffers in place: what a backend whose devices all
// share this process's memory (the CPU backend) can do and a backend of
// separate memories (streams, CUDA, a proxy in host memory beside stream
// workers) cannot. A Device offers them through Device::in_place(), nullptr
// where it has none; the phases take the in-place path for the whole session
// or for none of it (GatherPull, phases.h), so no device answers an
// operation it cannot run with an error.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/device.h"
#include "xla/ffi/api/ffi.h"

namespace coarse {

class InPlaceSums {
 public:
  virtual ~InPlaceSums() = default;

  // dst[i] = (src[num-1][i] + (... + (src[1][i] + src[0][i]))) * scale: the sum a
  // ring's reduce-scatter makes of one chunk, in the same order (so the same
  // bits), in one pass; `dst` may be one of the sources (the one-shot
  // reduce-scatter, reduce_pieces.cc).
  virtual xla::ffi::Error SumInRingOrder(float* dst, const float* const* srcs, int64_t num,
                                         int64_t n, float scale) = 0;
  // For i in [lo, hi): dst[i - lo] = (g[num-1](i) + (... + g[0](i))) * scale,
  // where g[t](i) sums group t's clients' pushed values of piece element i
  // (widened to f32, client order, 0 for no client): what SumSlots then
  // SumInRingOrder make of the same pushes copied into storage, the same
  // bits, without the copies (the fused push, PushesInPlace).
  virtual xla::ffi::Error SumPushesInRingOrder(
      float* dst, int64_t lo, int64_t hi, const std::vector<std::vector<const PushedRuns*>>& groups,
      float scale) = 0;
};

}  // namespace coarse
