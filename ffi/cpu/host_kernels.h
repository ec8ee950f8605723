// The kernels of kernels/coarse_kernels.h as host loops, for the host stream
// (host_stream.h): the same signatures' meaning and the same per-element
// arithmetic (kernels/element_math.h, kernels/optimizer_math.h). Each runs
// on the stream's thread when the stream reaches it.
#pragma once

#include <cstdint>

#include "kernels/span.h"
#include "runtime/device.h"

namespace coarse::host_kernels {

// buf[span.buf_off + i] = float(span.leaf[i]) for every span (f32 buffer, scale 1).
void Pack(const kernels::Span* spans, int64_t num_spans, float* buf);
// span.leaf[i] = leaf_dtype(buf[span.buf_off + i]).
void Unpack(const float* buf, const kernels::Span* spans, int64_t num_spans);
// out[i] = (in[0][i] + ... + in[k-1][i]) * scale, in input order; out may alias in[0].
void Reduce(const float* const* inputs, int num_inputs, float* out, int64_t n, float scale);
void Optimizer(const OptScalars& o, const OptBuffers& b, int64_t n);
// *out = sum x[i]^2 in f64, in index order (the default CPU backend's order).
void SumSquares(const float* x, int64_t n, double* out);
// *first = min(*first, base + the first bitwise mismatch).
void FirstMismatch(const float* master, const float* given, int64_t n, kernels::DType dtype,
                   unsigned long long base, unsigned long long* first);

}  // namespace coarse::host_kernels
