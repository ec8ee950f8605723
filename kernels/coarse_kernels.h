// coarse_jax CUDA kernels: plain launch functions on a cudaStream_t, no XLA types.
//
// Three jobs, the device half of the runtime (ffi/cuda/) and of the
// single-device ops coarse_pack / coarse_unpack / coarse_reduce:
//   * pack:   gather many runs of leaf elements into one packed buffer (one
//             launch however many leaves), casting and scaling on the way;
//   * unpack: the inverse scatter;
//   * reduce: out = scale * (in_0 + ... + in_{k-1}), accumulating in f32.
// The per-element arithmetic is element_math.h and optimizer_math.h, which
// the host stream (ffi/cpu/host_kernels.cc) runs too.
// Every launch returns the launch's cudaError_t; none synchronizes.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "optimizer_math.h"
#include "span.h"  // DType, Span, SetBegins, kMaxReduceInputs, kSumSquaresBlocks

namespace coarse::kernels {

// buf[span.buf_off + i] = buf_dtype(scale * float(span.leaf[i])) for every span.
// `spans` is device memory holding `num_spans` spans (begin filled), `total`
// the sum of their lengths. Elements of `buf` no span covers are not written.
cudaError_t LaunchPack(const Span* spans, int64_t num_spans, int64_t total, void* buf,
                       DType buf_dtype, float scale, cudaStream_t stream);

// span.leaf[i] = leaf_dtype(scale * float(buf[span.buf_off + i])) for every span.
cudaError_t LaunchUnpack(const void* buf, DType buf_dtype, const Span* spans, int64_t num_spans,
                         int64_t total, float scale, cudaStream_t stream);

// out[i] = dtype(scale * (float(in[0][i]) + ... + float(in[k-1][i]))), summed in
// input order (bitwise reproducible). 1 <= k <= kMaxReduceInputs; `out` may
// alias in[0] (an accumulator), other overlaps are not allowed.
cudaError_t LaunchReduce(const void* const* inputs, int num_inputs, void* out, int64_t n,
                         DType dtype, float scale, cudaStream_t stream);

// LaunchReduce over `rows` rows of n f32 elements in one launch: row i of
// input k at inputs[k] + i * in_pitch[k], of `out` at out + i * out_pitch
// (elements); each element's arithmetic is LaunchReduce's (the same bits).
cudaError_t LaunchReduceRows(const float* const* inputs, const int64_t* in_pitch, int num_inputs,
                             float* out, int64_t out_pitch, int64_t n, int64_t rows, float scale,
                             cudaStream_t stream);

// The proxy optimizer (kernels/optim.cu; arithmetic in optimizer_math.h): for i < n, w_out[i] =
// grad_io[i] = OptStep(o, grad_io[i], w_in[i], ...), state slots read from s_in*, written to s_out*
// (unused slots may be null).
cudaError_t LaunchOptimizer(const coarse::OptScalars& o, float* grad_io, const float* w_in,
                            float* w_out, const float* s_in0, const float* s_in1, float* s_out0,
                            float* s_out1, int64_t n, cudaStream_t stream);
// LaunchOptimizer over `rows` rows of n elements in one launch
// (kernels/optim_rows.cu): row i's gradient at grad_io + i * grad_pitch, its
// weights and state at w_in/w_out/s_* + i * buf_pitch (elements; unused
// slots null); each element's arithmetic is LaunchOptimizer's.
cudaError_t LaunchOptimizerRows(const coarse::OptScalars& o, float* grad_io, const float* w_in,
                                float* w_out, const float* s_in0, const float* s_in1, float* s_out0,
                                float* s_out1, int64_t n, int64_t rows, int64_t grad_pitch,
                                int64_t buf_pitch, cudaStream_t stream);
// *out = sum x[i]^2 in f64, in a fixed order; `partial` holds
// kSumSquaresBlocks doubles of scratch.
cudaError_t LaunchSumSquares(const float* x, int64_t n, double* partial, double* out,
                             cudaStream_t stream);
// The same over the f32 runs of a span table (span.leaf, span.len; `spans`
// device memory, `total` their length), all in one pass, in a fixed order for
// a given table: *out = (accumulate ? *out : 0) + the sum (global-norm
// clipping: a proxy's owned ranges in two launches, not two per range).
cudaError_t LaunchSumSquaresSpans(const Span* spans, int64_t num_spans, int64_t total,
                                  double* partial, double* out, bool accumulate,
                                  cudaStream_t stream);
// out[0, 2) = ClipScalarsOf(parts, num, clip_norm) (optimizer_math.h), one thread.
cudaError_t LaunchClipScalars(const double* parts, int64_t num, float clip_norm, float* out,
                              cudaStream_t stream);
// *first = min(*first, base + the first i where given[i], an element of
// `given_dtype` (`dtype`: the params where they are; f32: widened), differs
// bitwise from master[i] rounded to `dtype`); the caller sets *first
// beforehand (to at least base + n). `base` lets several runs share one
// result: the first mismatch of all of them by buffer offset, read back once.
cudaError_t LaunchFirstMismatch(const float* master, DType dtype, const void* given,
                                DType given_dtype, int64_t n, unsigned long long base,
                                unsigned long long* first, cudaStream_t stream);

}  // namespace coarse::kernels
