// The host loops of the kernels (see host_kernels.h). Element by element,
// through the kernels' own functions: the stream-semantics backend checks
// ordering and arithmetic, not speed.
#include "cpu/host_kernels.h"

#include "kernels/element_math.h"
#include "kernels/optimizer_math.h"

namespace coarse::host_kernels {

namespace {

float Widen(const void* leaf, kernels::DType t, int64_t i) {
  switch (t) {
    case kernels::DType::kBF16: return kernels::Bf16ToF32(static_cast<const uint16_t*>(leaf)[i]);
    case kernels::DType::kF16: return kernels::F16ToF32(static_cast<const uint16_t*>(leaf)[i]);
    default: return static_cast<const float*>(leaf)[i];
  }
}

void Narrow(void* leaf, kernels::DType t, int64_t i, float v) {
  switch (t) {
    case kernels::DType::kBF16: static_cast<uint16_t*>(leaf)[i] = kernels::F32ToBf16(v); return;
    case kernels::DType::kF16: static_cast<uint16_t*>(leaf)[i] = kernels::F32ToF16(v); return;
    default: static_cast<float*>(leaf)[i] = v; return;
  }
}

}  // namespace

void Pack(const kernels::Span* spans, int64_t num_spans, float* buf) {
  for (int64_t s = 0; s < num_spans; ++s) {
    const kernels::Span& sp = spans[s];
    float* at = buf + sp.buf_off;
    for (int64_t i = 0; i < sp.len; ++i)
      at[i] = kernels::PackValue(Widen(sp.leaf, sp.leaf_dtype, i), 1.0f);
  }
}

void Unpack(const float* buf, const kernels::Span* spans, int64_t num_spans) {
  for (int64_t s = 0; s < num_spans; ++s) {
    const kernels::Span& sp = spans[s];
    const float* at = buf + sp.buf_off;
    for (int64_t i = 0; i < sp.len; ++i)
      Narrow(sp.leaf, sp.leaf_dtype, i, kernels::PackValue(at[i], 1.0f));
  }
}

void Reduce(const float* const* inputs, int num_inputs, float* out, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) {
    float acc = inputs[0][i];
    for (int k = 1; k < num_inputs; ++k) acc = kernels::ReduceAdd(acc, inputs[k][i]);
    out[i] = kernels::ReduceResult(acc, scale);
  }
}

void Optimizer(const OptScalars& given, const OptBuffers& b, int64_t n) {
  const OptScalars o = WithStep(given);  // read as the task runs, after the copy that wrote them
  const int32_t slots = OptSlots(o.kind, o.momentum);
  for (int64_t i = 0; i < n; ++i) {
    float s0 = slots > 0 ? b.s_in[0][i] : 0.0f, s1 = slots > 1 ? b.s_in[1][i] : 0.0f;
    const float w = OptStep(o, b.grad_io[i], b.w_in[i], &s0, &s1);
    b.w_out[i] = w;
    b.grad_io[i] = w;
    if (slots > 0) b.s_out[0][i] = s0;
    if (slots > 1) b.s_out[1][i] = s1;
  }
}

void SumSquares(const float* x, int64_t n, double* out) {
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) acc = kernels::SquareAdd(acc, x[i]);
  *out = acc;
}

void FirstMismatch(const float* master, const float* given, int64_t n, kernels::DType dtype,
                   unsigned long long base, unsigned long long* first) {
  for (int64_t i = 0; i < n && base + static_cast<unsigned long long>(i) < *first; ++i)
    if (!kernels::SameBits(kernels::RoundTrip(master[i], dtype), given[i])) {
      *first = base + static_cast<unsigned long long>(i);
      return;
    }
}

}  // namespace coarse::host_kernels
