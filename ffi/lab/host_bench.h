// Timing the host optimizer against this machine's memory bandwidth, for
// benchmarks/test_host_optimizer.py (bound as _coarse_lab_cpu.HostOptimizerBench).
//
// One pass of the CPU backend's Adam/AdamW (host/element_loops.h, OptimizerF32) over
// n elements reads the gradient, the master weight and two moments and
// writes the new weight (twice: the master's other buffer and the gradient's
// place, which the ring's all-gather carries) and two moments: 32 bytes per
// element. A STREAM triad a[i] = b[i] + s * c[i] over n floats moves 12 (two
// reads, one write, STREAM's count). Both run over page-aligned anonymous
// mappings, as the proxies' storage is (cpu_storage.cc).
#pragma once

#include <cstdint>

namespace coarse {

class HostOptimizerBench {
 public:
  explicit HostOptimizerBench(int64_t n);  // fills the state with finite values
  ~HostOptimizerBench();
  HostOptimizerBench(const HostOptimizerBench&) = delete;
  HostOptimizerBench& operator=(const HostOptimizerBench&) = delete;

  // One optimizer pass (adamw: with weight decay); `vectorized`: the AVX2
  // loop where the CPU has it, else the scalar one; `parallel`: split over
  // the bounded host pool (host_pool.h), as a proxy runs it. The output
  // becomes the next pass's input (the state moves on, as in training).
  void Adam(bool adamw, bool vectorized, bool parallel);
  // One triad pass.
  void Triad();
  // Testing: the AVX2 pass (with its streaming stores and aligning prologue)
  // over `count` elements from `offset` into 64-byte-aligned copies of the
  // state, against the scalar pass over other copies: the first element
  // whose new weight, gradient place or moments differ in any bit, or -1.
  int64_t FirstMismatchWithScalar(bool adamw, int64_t offset, int64_t count) const;
  int64_t n() const { return n_; }

 private:
  int64_t n_;
  float* arrays_[8] = {};  // grad, w[2], m[2], v[2], triad out
  int parity_ = 0;         // which of the double buffers holds the state
};

}  // namespace coarse
