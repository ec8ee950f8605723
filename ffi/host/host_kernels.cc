// The host loops of the kernels (see host_kernels.h).
#include "host/host_kernels.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>

#include "host/element_loops.h"
#include "host/host_pool.h"
#include "kernels/element_math.h"
#include "runtime/dtype.h"
#include "runtime/stream.h"

namespace coarse::host_kernels {

Status CheckReduceInputs(int num_inputs) {
  if (num_inputs >= 1 && num_inputs <= kernels::kMaxReduceInputs) return Status::Success();
  return Status::Internal("coarse_jax: a reduce takes 1 to " +
                          std::to_string(kernels::kMaxReduceInputs) + " inputs, got " +
                          std::to_string(num_inputs));
}

bool PollFlag(const uint32_t* flag, uint32_t value, std::chrono::steady_clock::time_point deadline,
              uint32_t* held) {
  std::chrono::microseconds nap(1);
  *held = ReadFlag(flag);
  while (!FlagReached(*held, value)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(50));
    *held = ReadFlag(flag);
  }
  return true;
}

void Pack(const kernels::Span* spans, int64_t num_spans, float* buf) {
  for (int64_t s = 0; s < num_spans; ++s)
    cpu::WidenToF32(spans[s].leaf_dtype, spans[s].leaf, buf + spans[s].buf_off, spans[s].len);
}

void Unpack(const float* buf, const kernels::Span* spans, int64_t num_spans) {
  for (int64_t s = 0; s < num_spans; ++s)
    cpu::NarrowFromF32(spans[s].leaf_dtype, buf + spans[s].buf_off, spans[s].leaf, spans[s].len);
}

void Reduce(const float* const* inputs, int num_inputs, float* out, int64_t n, float scale) {
  // In place, one or two inputs: the rings' and the scaling passes' loops;
  // else one pass over every input, block by block (the same bits: each
  // add rounds to f32 either way).
  if (out == inputs[0] && num_inputs == 1) {
    if (scale != 1.0f) cpu::ScaleF32(out, scale, n);
  } else if (out == inputs[0] && num_inputs == 2) {
    if (scale != 1.0f)
      cpu::AddScaleF32(out, inputs[1], scale, n);
    else
      cpu::AddF32(out, inputs[1], n);
  } else {
    cpu::SumInOrderF32(out, inputs, num_inputs, n, scale);
  }
}

void ReduceRows(const float* const* inputs, int num_inputs, float* out, int64_t n, float scale,
                const RowPitches& rows) {
  const float* in[kernels::kMaxReduceInputs];
  for (int64_t i = 0; i < rows.count; ++i) {
    for (int k = 0; k < num_inputs; ++k) in[k] = inputs[k] + i * rows.in[k];
    Reduce(in, num_inputs, out + i * rows.out, n, scale);
  }
}

void CopyRows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
              int64_t rows) {
  for (int64_t i = 0; i < rows; ++i) {
    char* d = static_cast<char*>(dst) + i * dst_pitch;
    const char* from = static_cast<const char*>(src) + i * src_pitch;
    if (d != from) std::memcpy(d, from, row_bytes);
  }
}

void Optimizer(const OptScalars& o, const OptBuffers& b, int64_t n) {
  // A large share (a host proxy's of a big model) on the bounded host pool:
  // element-wise, so the same bits however it is split. (OptimizerF32 reads
  // the step's scalars when it runs: WithStep.)
  cpu::ParallelFor(n, cpu::kParallelMinElems, [&](int64_t lo, int64_t hi) {
    cpu::OptimizerF32(o, cpu::AdvanceBuffers(b, lo), hi - lo);
  });
}

void SumSquares(const float* x, int64_t n, double* out) { *out = cpu::SumSquaresF32(x, n); }

void SumSquaresSpans(const kernels::Span* spans, int64_t num_spans, double* out, bool accumulate) {
  double acc = accumulate ? *out : 0.0;
  for (int64_t r = 0; r < num_spans; ++r)
    acc += cpu::SumSquaresF32(static_cast<const float*>(spans[r].leaf), spans[r].len);
  *out = acc;
}

void FirstMismatch(const float* master, kernels::DType dtype, const void* given,
                   kernels::DType given_dtype, int64_t n, unsigned long long base,
                   unsigned long long* first) {
  if (base >= *first) return;
  int64_t at = -1;
  if (given_dtype == dtype) {
    at = cpu::FirstMismatchIn(master, given, n, dtype);
  } else {  // widened to f32
    const float* g = static_cast<const float*>(given);
    for (int64_t i = 0; i < n && at < 0; ++i)
      if (!kernels::SameBits(kernels::RoundTrip(master[i], dtype), g[i])) at = i;
  }
  if (at >= 0 && base + static_cast<unsigned long long>(at) < *first)
    *first = base + static_cast<unsigned long long>(at);
}

}  // namespace coarse::host_kernels
