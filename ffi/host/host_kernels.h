// The kernels of kernels/coarse_kernels.h on the host: the CPU platform's
// arithmetic, one implementation for both of its streams (host_stream.h:
// the threaded stream-semantics one and the inline default). Each is a
// loop of the CPU backend (cpu_backend.h: vectorized, the optimizer split
// over the host pool for a large share), with the kernels' per-element
// arithmetic (kernels/element_math.h, kernels/optimizer_math.h): the same
// bits as the CUDA kernels.
#pragma once

#include <chrono>
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
// Reduce over `rows.count` rows (Stream::ReduceRows), row by row.
void ReduceRows(const float* const* inputs, int num_inputs, float* out, int64_t n, float scale,
                const RowPitches& rows);
// `rows` rows of `row_bytes`, row i from src + i * src_pitch to dst + i * dst_pitch (bytes).
void CopyRows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
              int64_t rows);
void Optimizer(const OptScalars& o, const OptBuffers& b, int64_t n);
// *out = sum x[i]^2 in f64, in index order.
void SumSquares(const float* x, int64_t n, double* out);
// *out = (accumulate ? *out : 0) + each span's run (f32) summed as SumSquares
// sums it, the runs' sums added in span order.
void SumSquaresSpans(const kernels::Span* spans, int64_t num_spans, double* out, bool accumulate);
// *first = min(*first, base + the first i where master[i] rounded to `dtype`
// differs bitwise from given[i], an element of `given_dtype` (`dtype`: the
// params where they are; f32: widened); runs at or past *first are skipped.
void FirstMismatch(const float* master, kernels::DType dtype, const void* given,
                   kernels::DType given_dtype, int64_t n, unsigned long long base,
                   unsigned long long* first);

// Whether a reduce of `num_inputs` inputs is one the kernels take
// (1..kernels::kMaxReduceInputs): both host streams check it when enqueued.
Status CheckReduceInputs(int num_inputs);

// Polls the host-written flag on the calling thread, backing off from 1 to
// 50 us between reads (as a GPU's front end polls a cuStreamWaitValue32
// flag), until FlagReached(it, value) or `deadline`; false on the deadline.
// `*held`: the flag's last value read. Both host streams' WaitValue.
bool PollFlag(const uint32_t* flag, uint32_t value, std::chrono::steady_clock::time_point deadline,
              uint32_t* held);

}  // namespace coarse::host_kernels
