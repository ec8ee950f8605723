// The CPU backend's element loops (see element_loops.h): bf16/f16 <-> f32
// conversion and the f32 sums, vectorized where the compiler can.
#include "host/element_loops.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/element_math.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define COARSE_ADAM_AVX2 1
#include "host/adam_avx2.h"
#endif

// The loops are memory-bound but a wide vector unit still helps; GCC builds
// an AVX2 clone beside the baseline one and picks at load time, so the
// binary stays portable.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define COARSE_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define COARSE_VECTOR_CLONES
#endif

namespace coarse::cpu {

namespace {

// The kernels' own conversions (the host stream and the CUDA kernels use them too).
using kernels::Bf16ToF32;
using kernels::F32ToBf16;

// A copy of at least this many floats (256 KiB) bypasses the caches
// (non-temporal stores): the transfers move the whole tree, far more than
// the caches hold, and a plain store first reads the line it overwrites, so
// streaming saves a third of a copy's memory traffic. The reader is another
// device's call, later, which finds the data in memory either way.
constexpr int64_t kStreamMin = 64 * 1024;

void CopyF32(float* dst, const float* src, int64_t n) {
#if defined(__SSE2__)
  if (n >= kStreamMin) {
    while (reinterpret_cast<uintptr_t>(dst) % 16 != 0 && n > 0) {
      *dst++ = *src++;
      --n;
    }
    const int64_t vec = n / 4 * 4;
    for (int64_t i = 0; i < vec; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
    for (int64_t i = vec; i < n; ++i) dst[i] = src[i];
    // Non-temporal stores are weakly ordered: fence them before the caller
    // publishes the data (a release store does not order them).
    _mm_sfence();
    return;
  }
#endif
  std::memcpy(dst, src, n * sizeof(float));
}

}  // namespace

void WidenToF32(DType dtype, const void* src, float* dst, int64_t n) {
  switch (dtype) {
    case DType::kF32: CopyF32(dst, static_cast<const float*>(src), n); return;
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToF32(s[i]);
      return;
    }
    case DType::kF16: {
      const _Float16* s = static_cast<const _Float16*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    default: return;
  }
}

void NarrowFromF32(DType dtype, const float* src, void* dst, int64_t n) {
  switch (dtype) {
    case DType::kF32: CopyF32(static_cast<float*>(dst), src, n); return;
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = F32ToBf16(src[i]);
      return;
    }
    case DType::kF16: {
      _Float16* d = static_cast<_Float16*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<_Float16>(src[i]);
      return;
    }
    default: return;
  }
}

COARSE_VECTOR_CLONES
void AddF32(float* __restrict acc, const float* __restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
}

void AddWidenedF32(DType dtype, const void* src, float* acc, int64_t n) {
  switch (dtype) {
    case DType::kF32: AddF32(acc, static_cast<const float*>(src), n); return;
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) acc[i] += Bf16ToF32(s[i]);
      return;
    }
    case DType::kF16: {
      const _Float16* s = static_cast<const _Float16*>(src);
      for (int64_t i = 0; i < n; ++i) acc[i] += static_cast<float>(s[i]);
      return;
    }
    default: return;
  }
}

COARSE_VECTOR_CLONES
void AddScaleF32(float* __restrict acc, const float* __restrict x, float scale, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] = (acc[i] + x[i]) * scale;
}

COARSE_VECTOR_CLONES
void ScaleF32(float* x, float scale, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

void SumInOrderF32(float* dst, const float* const* srcs, int64_t num, int64_t n, float scale) {
  // Block by block through a stack buffer: every source's block is read
  // before `dst`'s (possibly one of them) is written.
  constexpr int64_t kBlock = 2048;
  float acc[kBlock];
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t m = std::min(kBlock, n - i0);
    std::memcpy(acc, srcs[0] + i0, m * sizeof(float));
    for (int64_t t = 1; t < num; ++t) AddF32(acc, srcs[t] + i0, m);  // a + b == b + a
    if (scale != 1.0f) ScaleF32(acc, scale, m);
    std::memcpy(dst + i0, acc, m * sizeof(float));
  }
}

namespace {

#if defined(COARSE_ADAM_AVX2)
bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#endif

}  // namespace

OptBuffers AdvanceBuffers(const OptBuffers& b, int64_t done) {
  OptBuffers r = b;
  r.grad_io += done;
  r.w_in += done;
  r.w_out += done;
  for (int j = 0; j < 2; ++j) {
    if (r.s_in[j] != nullptr) r.s_in[j] += done;
    if (r.s_out[j] != nullptr) r.s_out[j] += done;
  }
  return r;
}

namespace {

// OptStep on n elements, one at a time.
void ScalarSteps(const OptScalars& o, const OptBuffers& b, int64_t n) {
  const int32_t slots = OptSlots(o.kind, o.momentum);
  float s0 = 0, s1 = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (slots > 0) s0 = b.s_in[0][i];
    if (slots > 1) s1 = b.s_in[1][i];
    const float w = OptStep(o, b.grad_io[i], b.w_in[i], &s0, &s1);
    b.w_out[i] = w;
    b.grad_io[i] = w;
    if (slots > 0) b.s_out[0][i] = s0;
    if (slots > 1) b.s_out[1][i] = s1;
  }
}

#if defined(COARSE_ADAM_AVX2)
// How many leading elements to do one at a time so that the AVX2 loop's
// streaming stores start 32-byte aligned: 0 unless the three outputs are
// misaligned alike (a store's buffers are laid out alike; otherwise the loop
// stores plainly).
int64_t AlignPrologue(const OptBuffers& b, int64_t n) {
  if (n < kStreamStoresFrom || b.s_out[0] == nullptr || b.s_out[1] == nullptr) return 0;
  const uintptr_t w = reinterpret_cast<uintptr_t>(b.w_out);
  if (w % sizeof(float) != 0) return 0;
  for (const float* s : {b.s_out[0], b.s_out[1]})
    if ((reinterpret_cast<uintptr_t>(s) & 31) != (w & 31)) return 0;
  return static_cast<int64_t>(((32 - (w & 31)) & 31) / sizeof(float));
}
#endif

}  // namespace

void OptimizerF32(const OptScalars& with_step, const OptBuffers& given, int64_t n,
                  bool vectorized) {
  const OptScalars o = WithStep(with_step);
  OptBuffers b = given;
#if defined(COARSE_ADAM_AVX2)
  if (vectorized && o.kind != OptKind::kSgd && HasAvx2()) {
    // Element by element the same operations: the bits do not depend on
    // where the prologue ends.
    const int64_t pre = AlignPrologue(b, n);
    ScalarSteps(o, b, pre);
    b = AdvanceBuffers(b, pre);
    n -= pre;
    const int64_t done =
        AdamAvx2(o, b.grad_io, b.w_in, b.w_out, b.s_in[0], b.s_in[1], b.s_out[0], b.s_out[1], n);
    b = AdvanceBuffers(b, done);
    n -= done;
  }
#endif
  ScalarSteps(o, b, n);
}

COARSE_VECTOR_CLONES
void TriadF32(float* __restrict a, const float* __restrict b, const float* __restrict c, float s,
              int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

double SumSquaresF32(const float* x, int64_t n) {
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(x[i]) * x[i];
  return acc;
}

int64_t FirstMismatchIn(const float* master, const void* params, int64_t n, DType dtype) {
  // In the params' own dtype, read where they are (no widened copy): f32
  // compares with the master as it is, 16-bit dtypes with the master rounded
  // to them (widening is exact and one-to-one, so this is the comparison of
  // both widened). Bitwise: a NaN the step returned must come back as the
  // same NaN.
  if (dtype == DType::kF32) {
    const float* given = static_cast<const float*>(params);
    for (int64_t i = 0; i < n; i += 256) {
      const int64_t m = n - i < 256 ? n - i : 256;
      if (std::memcmp(master + i, given + i, m * sizeof(float)) != 0)
        for (int64_t j = 0; j < m; ++j)
          if (std::memcmp(master + i + j, given + i + j, sizeof(float)) != 0) return i + j;
    }
    return -1;
  }
  const uint16_t* given = static_cast<const uint16_t*>(params);
  uint16_t narrow[256];
  for (int64_t i = 0; i < n; i += 256) {
    const int64_t m = n - i < 256 ? n - i : 256;
    NarrowFromF32(dtype, master + i, narrow, m);
    if (std::memcmp(narrow, given + i, m * sizeof(uint16_t)) != 0)
      for (int64_t j = 0; j < m; ++j)
        if (narrow[j] != given[i + j]) return i + j;
  }
  return -1;
}

}  // namespace coarse::cpu
