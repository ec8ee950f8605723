// What the kernels and the runtime share about a packed transfer, in plain
// C++ (no CUDA headers): the element types a leaf may have and the span
// table a pack / unpack walks. The CUDA kernels (coarse_kernels.h) and the
// host stream's loops (ffi/cpu/host_kernels.cc) read the same table.
#pragma once

#include <cstddef>
#include <cstdint>

namespace coarse::kernels {

enum class DType : int32_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

inline size_t ByteWidth(DType t) { return t == DType::kF32 ? 4 : 2; }

// One run of consecutive elements of a leaf that lands at `buf_off` in the
// packed buffer. Spans are ordered and `begin` is the exclusive prefix sum of
// `len` over the spans before this one (SetBegins fills it): it is how a
// block finds its spans by binary search, so one launch covers thousands of
// small leaves as well as one huge one.
struct Span {
  void* leaf;        // device pointer to the run's first element inside the leaf
  int64_t buf_off;   // element offset of the run in the packed buffer
  int64_t len;       // elements in the run
  int64_t begin;     // sum of len over the spans before this one
  DType leaf_dtype;  // element type of the leaf
  int32_t pad_ = 0;
};

// Fills `begin` for spans[0..n) on the host and returns the total length.
inline int64_t SetBegins(Span* spans, int64_t n) {
  int64_t total = 0;
  for (int64_t i = 0; i < n; ++i) {
    spans[i].begin = total;
    total += spans[i].len;
  }
  return total;
}

// A reduce launch sums at most this many inputs.
constexpr int kMaxReduceInputs = 8;
// Doubles of scratch a sum of squares needs (its partial sums), besides the result.
constexpr int kSumSquaresBlocks = 256;

}  // namespace coarse::kernels
