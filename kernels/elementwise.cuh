// Shared device helpers for the kernels: f32 <-> bf16/f16 conversion and
// 4-element vector loads/stores (16 bytes for f32, 8 for the 16-bit types).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "coarse_kernels.h"
#include "element_math.h"

namespace coarse::kernels {

// Through element_math.h's conversions, which the host stream shares.
__device__ __forceinline__ float ToF32(float x) { return x; }
__device__ __forceinline__ float ToF32(__nv_bfloat16 x) {
  return Bf16ToF32(__bfloat16_as_ushort(x));
}
__device__ __forceinline__ float ToF32(__half x) { return F16ToF32(__half_as_ushort(x)); }

template <typename T>
__device__ __forceinline__ T FromF32(float x);
template <>
__device__ __forceinline__ float FromF32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromF32<__nv_bfloat16>(float x) {
  return __ushort_as_bfloat16(F32ToBf16(x));  // round to nearest even, as XLA's convert
}
template <>
__device__ __forceinline__ __half FromF32<__half>(float x) {
  return __ushort_as_half(F32ToF16(x));
}

template <typename T>
struct alignas(4 * sizeof(T)) Vec4 {
  T v[4];
};

// Vector width in elements, and whether `p` may be accessed as Vec4<T>.
constexpr int kVec = 4;
template <typename T>
__device__ __host__ __forceinline__ bool VecAligned(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) % (kVec * sizeof(T))) == 0;
}

// Calls f(T{}) with T the C++ type of `t`: on the host to pick a kernel
// instantiation, on the device for a span's own leaf type.
#define COARSE_DISPATCH_DTYPE_BODY                \
  switch (t) {                                    \
    case DType::kF32: f(float{}); break;          \
    case DType::kBF16: f(__nv_bfloat16{}); break; \
    case DType::kF16: f(__half{}); break;         \
  }
template <typename F>
inline void DispatchDType(DType t, F&& f) {
  COARSE_DISPATCH_DTYPE_BODY
}
template <typename F>
__device__ __forceinline__ void DispatchDTypeOnDevice(DType t, F&& f) {
  COARSE_DISPATCH_DTYPE_BODY
}
#undef COARSE_DISPATCH_DTYPE_BODY

}  // namespace coarse::kernels
