// The kernels' per-element arithmetic, one definition for both platforms:
// the CUDA kernels (pack.cu, reduce.cu, optim.cu) and the host stream's loops
// (ffi/cpu/host_kernels.cc) call these same functions, so the stream-semantics
// CPU backend runs the kernels' own arithmetic. Under nvcc they are
// __host__ __device__; in a plain C++ build COARSE_HD is just `inline`.
//
// Conversions take and give raw 16-bit patterns. Under nvcc they use CUDA's
// round-to-nearest-even conversions (host and device); in plain C++ bf16 is
// rounded in bits, to nearest even as XLA's convert, and f16 through the
// compiler's _Float16 (also to nearest even). The two differ only in which
// NaN pattern a NaN becomes.
#pragma once

#include <cstdint>
#include <cstring>

#include "span.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define COARSE_HD __host__ __device__ __forceinline__
#else
#define COARSE_HD inline
#endif

namespace coarse::kernels {

COARSE_HD float BitsToF32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

COARSE_HD uint32_t F32ToBits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

// bf16 <-> f32 (widening is exact: the bf16 bits are the f32's top half).
COARSE_HD float Bf16ToF32(uint16_t h) { return BitsToF32(static_cast<uint32_t>(h) << 16); }
COARSE_HD uint16_t F32ToBf16(float f) {
#if defined(__CUDACC__)
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
  uint32_t u = F32ToBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                    // round to nearest even
  return static_cast<uint16_t>(u >> 16);
#endif
}

// f16 <-> f32.
COARSE_HD float F16ToF32(uint16_t h) {
#if defined(__CUDACC__)
  return __half2float(__ushort_as_half(h));
#else
  _Float16 x;
  memcpy(&x, &h, sizeof x);
  return static_cast<float>(x);
#endif
}
COARSE_HD uint16_t F32ToF16(float f) {
#if defined(__CUDACC__)
  return __half_as_ushort(__float2half_rn(f));
#else
  const _Float16 x = static_cast<_Float16>(f);
  uint16_t h;
  memcpy(&h, &x, sizeof h);
  return h;
#endif
}

// Pack / unpack: one element on its way between a leaf and a packed buffer,
// widened to f32, scaled, then narrowed to the destination's type.
COARSE_HD float PackValue(float widened, float scale) { return widened * scale; }

// Reduce: out = (in_0 + in_1 + ... + in_{k-1}) * scale, added in input order.
COARSE_HD float ReduceAdd(float acc, float x) { return acc + x; }
COARSE_HD float ReduceResult(float acc, float scale) { return acc * scale; }

// Sum of squares (global-norm clipping): one term, accumulated in f64.
COARSE_HD double SquareAdd(double acc, float x) { return acc + static_cast<double>(x) * x; }

// The params check: `master` rounded to the params' type and widened back.
COARSE_HD float RoundTrip(float v, DType t) {
  if (t == DType::kBF16) return Bf16ToF32(F32ToBf16(v));
  if (t == DType::kF16) return F16ToF32(F32ToF16(v));
  return v;
}
// Element i of `p`, an array of `t`, widened to f32 (exact).
COARSE_HD float WidenAt(const void* p, DType t, int64_t i) {
  if (t == DType::kBF16) return Bf16ToF32(static_cast<const uint16_t*>(p)[i]);
  if (t == DType::kF16) return F16ToF32(static_cast<const uint16_t*>(p)[i]);
  return static_cast<const float*>(p)[i];
}
// Bitwise: a NaN the step returned must come back as the same NaN.
COARSE_HD bool SameBits(float a, float b) { return F32ToBits(a) == F32ToBits(b); }

}  // namespace coarse::kernels
