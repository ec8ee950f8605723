// The shared-memory strategy: how a session runs where every mesh device's
// buffers are this process's memory (the CPU platform's host storage), so a
// host loop reads a peer's buffer as cheaply as its own. The strategy is
// chosen once, when a session is created (Session::shared_memory): its
// storage offers it (Storage::shared_memory) unless links are emulated; the
// streams backend, CUDA, and proxies in host memory beside stream workers
// have none. With it the phases take three shortcuts for the whole session
// (phases.h: GatherPull, OneShotLeading, PushesInPlace) and run the sums
// below in place of copies; without it they run the GPU's paths. No Device
// method exists for one platform only: the sums are the strategy's, not a
// device's.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/device.h"
#include "runtime/status.h"

namespace coarse {

class SharedMemory {
 public:
  virtual ~SharedMemory() = default;

  // dst[i] = (src[num-1][i] + (... + (src[1][i] + src[0][i]))) * scale: the sum a
  // ring's reduce-scatter makes of one chunk, in the same order (so the same
  // bits), in one pass; `dst` may be one of the sources (the one-shot
  // reduce-scatter, reduce_pieces.cc).
  virtual Status SumInRingOrder(float* dst, const float* const* srcs, int64_t num, int64_t n,
                                float scale) = 0;
  // For i in [lo, hi): dst[i - lo] = (g[num-1](i) + (... + g[0](i))) * scale,
  // where g[t](i) sums group t's clients' pushed values of piece element i
  // (widened to f32, client order, 0 for no client): what SumSlots then
  // SumInRingOrder make of the same pushes copied into storage, the same
  // bits, without the copies (the fused push, PushesInPlace).
  virtual Status SumPushesInRingOrder(float* dst, int64_t lo, int64_t hi,
                                      const std::vector<std::vector<const PushedRuns*>>& groups,
                                      float scale) = 0;
};

}  // namespace coarse
