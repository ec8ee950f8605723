// A bounded pool of CPU threads for the proxies' element loops on the host
// (the optimizer): a proxy in host memory serves k workers and may own
// gigabytes of state, more than one thread's share of the memory bandwidth.
//
// ParallelFor splits [0, n) into blocks and runs them on the pool and on the
// calling thread, which takes blocks too (so a call always progresses, even
// while every pool thread serves another proxy's call). The pool has
// min(hardware threads, COARSE_JAX_HOST_THREADS or 8) - 1 threads, started
// on first use and never stopped. Blocks are disjoint ranges of element-wise
// loops, so the results do not depend on the split.
#pragma once

#include <cstdint>
#include <functional>

namespace coarse::cpu {

// Below this many elements per block a loop stays on one thread (1 MiB of
// f32 per array: splitting less costs more than it saves).
inline constexpr int64_t kParallelMinElems = int64_t{1} << 18;

// fn(lo, hi) over [0, n) in blocks of at least `min_block` elements; runs
// `fn(0, n)` on the caller when n < 2 * min_block or the pool is one thread.
void ParallelFor(int64_t n, int64_t min_block, const std::function<void(int64_t, int64_t)>& fn);

// The threads ParallelFor uses at most, the caller's included.
int HostThreads();

}  // namespace coarse::cpu
