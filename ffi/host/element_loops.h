// The CPU device backend: the only code that touches element values.
//
// Proxies and the worker ring keep every value in f32 ("f32 accumulate for
// bf16/f16"): a push widens into f32 storage, the ring folds the 1/p scale into
// its last reduce-scatter step, a pull narrows back (for f32 a plain memcpy),
// so each transfer is exactly one pass over memory. On CPU all
// devices share one address space, so a transfer is this one loop, not a
// send plus a receive. The CUDA backend (kernels/) mirrors these signatures.
// Which dtypes are supported: runtime/dtype.h.
#pragma once

#include <cstdint>

#include "runtime/device.h"
#include "runtime/status.h"

namespace coarse::cpu {

// dst[i] = float(src[i]) for a leaf of `dtype`.
void WidenToF32(DType dtype, const void* src, float* dst, int64_t n);
// dst[i] = dtype(src[i]), round to nearest even.
void NarrowFromF32(DType dtype, const float* src, void* dst, int64_t n);
// acc[i] += float(src[i]) for a leaf of `dtype`.
void AddWidenedF32(DType dtype, const void* src, float* acc, int64_t n);
// acc[i] += x[i]
void AddF32(float* __restrict acc, const float* __restrict x, int64_t n);
// acc[i] = (acc[i] + x[i]) * scale: the last reduce-scatter step of a mean.
void AddScaleF32(float* __restrict acc, const float* __restrict x, float scale, int64_t n);
// x[i] *= scale
void ScaleF32(float* x, float scale, int64_t n);
// dst[i] = (srcs[0][i] + srcs[1][i] + ... + srcs[num-1][i]) * scale, added in
// that order, in one pass; `dst` may be one of the sources.
void SumInOrderF32(float* dst, const float* const* srcs, int64_t num, int64_t n, float scale);
// The proxy optimizer over n elements (Device::ApplyOptimizer). Adam and
// AdamW run 8 elements at a time with AVX2 where the CPU has it, the same
// bits as the scalar loop (`vectorized` false: the scalar loop alone).
void OptimizerF32(const OptScalars& o, const OptBuffers& b, int64_t n, bool vectorized = true);
// `b` with its first `done` elements skipped.
OptBuffers AdvanceBuffers(const OptBuffers& b, int64_t done);
// a[i] = b[i] + s * c[i]: STREAM's triad (lab/host_bench.h).
void TriadF32(float* __restrict a, const float* __restrict b, const float* __restrict c, float s,
              int64_t n);
// sum x[i]^2, accumulated in f64 in index order.
double SumSquaresF32(const float* x, int64_t n);
// Device::FirstMismatch: the first i < n where params[i] (n elements of
// `dtype`) differs bitwise from master[i] rounded to `dtype`; -1 if none.
int64_t FirstMismatchIn(const float* master, const void* params, int64_t n, DType dtype);

}  // namespace coarse::cpu
