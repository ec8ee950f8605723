// reduce: out = scale * (in_0 + ... + in_{k-1}), accumulated in f32.
//
// The ring's step (acc += received, with the 1/p scale folded into the last
// reduce-scatter step) and a proxy's sum of its clients' slots are both this
// one kernel. Inputs travel in the kernel's parameters (no upload); each
// thread reads 4 elements of every input per vector, so k loads are in flight
// before the first add, and the sum runs in input order for reproducibility.
#include <algorithm>

#include "coarse_kernels.h"
#include "elementwise.cuh"

namespace coarse::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kVectorsPerThread = 4;  // grid sized so each thread does about this many

struct Inputs {
  const void* p[kMaxReduceInputs];
  int n;
};

template <typename T, bool kVectorized>
__global__ void __launch_bounds__(kThreads)
    ReduceKernel(Inputs in, T* out, int64_t n, float scale) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  int64_t scalar_from = 0;
  if (kVectorized) {
    const int64_t nv = n / kVec;
    for (int64_t j = first; j < nv; j += stride) {
      Vec4<T> x[kMaxReduceInputs];
#pragma unroll
      for (int k = 0; k < kMaxReduceInputs; ++k)
        if (k < in.n) x[k] = static_cast<const Vec4<T>*>(in.p[k])[j];
      float acc[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[e] = ToF32(x[0].v[e]);
#pragma unroll
      for (int k = 1; k < kMaxReduceInputs; ++k)
        if (k < in.n) {
#pragma unroll
          for (int e = 0; e < kVec; ++e) acc[e] = ReduceAdd(acc[e], ToF32(x[k].v[e]));
        }
      Vec4<T> y;
#pragma unroll
      for (int e = 0; e < kVec; ++e) y.v[e] = FromF32<T>(ReduceResult(acc[e], scale));
      reinterpret_cast<Vec4<T>*>(out)[j] = y;
    }
    scalar_from = nv * kVec;
  }
  for (int64_t i = scalar_from + first; i < n; i += stride) {
    float acc = ToF32(static_cast<const T*>(in.p[0])[i]);
#pragma unroll
    for (int k = 1; k < kMaxReduceInputs; ++k)  // constant indices: in.p stays in registers
      if (k < in.n) acc = ReduceAdd(acc, ToF32(static_cast<const T*>(in.p[k])[i]));
    out[i] = FromF32<T>(ReduceResult(acc, scale));
  }
}

struct RowInputs {
  const float* p[kMaxReduceInputs];
  int64_t pitch[kMaxReduceInputs];
  int n;
};

// Rows of a group (blockIdx.y strides over them), elements of a row over
// blockIdx.x: scalar loads, the same per-element sum as ReduceKernel.
__global__ void __launch_bounds__(kThreads)
    ReduceRowsKernel(RowInputs in, float* out, int64_t out_pitch, int64_t n, int64_t rows,
                     float scale) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t i = first; i < n; i += stride) {
      float acc = in.p[0][r * in.pitch[0] + i];
#pragma unroll
      for (int k = 1; k < kMaxReduceInputs; ++k)
        if (k < in.n) acc = ReduceAdd(acc, in.p[k][r * in.pitch[k] + i]);
      out[r * out_pitch + i] = ReduceResult(acc, scale);
    }
  }
}

}  // namespace

cudaError_t LaunchReduceRows(const float* const* inputs, const int64_t* in_pitch, int num_inputs,
                             float* out, int64_t out_pitch, int64_t n, int64_t rows, float scale,
                             cudaStream_t stream) {
  if (num_inputs < 1 || num_inputs > kMaxReduceInputs) return cudaErrorInvalidValue;
  if (n <= 0 || rows <= 0) return cudaSuccess;
  RowInputs in{};
  in.n = num_inputs;
  for (int k = 0; k < num_inputs; ++k) {
    in.p[k] = inputs[k];
    in.pitch[k] = in_pitch[k];
  }
  const int64_t per_block = kThreads * kVectorsPerThread;
  const int64_t blocks = std::min<int64_t>((n + per_block - 1) / per_block, 1 << 16);
  const dim3 grid(static_cast<unsigned>(std::max<int64_t>(blocks, 1)),
                  static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
  ReduceRowsKernel<<<grid, kThreads, 0, stream>>>(in, out, out_pitch, n, rows, scale);
  return cudaGetLastError();
}

cudaError_t LaunchReduce(const void* const* inputs, int num_inputs, void* out, int64_t n,
                         DType dtype, float scale, cudaStream_t stream) {
  if (num_inputs < 1 || num_inputs > kMaxReduceInputs) return cudaErrorInvalidValue;
  if (n <= 0) return cudaSuccess;
  Inputs in{};
  in.n = num_inputs;
  for (int k = 0; k < num_inputs; ++k) in.p[k] = inputs[k];
  DispatchDType(dtype, [&](auto zero) {
    using T = decltype(zero);
    T* o = static_cast<T*>(out);
    constexpr uintptr_t kVecBytes = kVec * sizeof(T);
    // Pointers equally far from a 16-byte (8-byte) boundary, as a ring chunk
    // of the accumulator and the received copy placed at the same offset
    // are: peel the few head elements so the rest runs vectorized.
    const uintptr_t mis = reinterpret_cast<uintptr_t>(o) % kVecBytes;
    bool same = mis % sizeof(T) == 0;
    for (int k = 0; k < num_inputs; ++k)
      same = same && reinterpret_cast<uintptr_t>(in.p[k]) % kVecBytes == mis;
    if (same && mis != 0) {
      const int64_t head = std::min<int64_t>(n, (kVecBytes - mis) / sizeof(T));
      ReduceKernel<T, false><<<1, kThreads, 0, stream>>>(in, o, head, scale);
      for (int k = 0; k < num_inputs; ++k) in.p[k] = static_cast<const T*>(in.p[k]) + head;
      o += head;
      n -= head;
      if (n == 0) return;
    }
    bool aligned = VecAligned<T>(o);
    for (int k = 0; k < num_inputs; ++k) aligned = aligned && VecAligned<T>(in.p[k]);
    const int64_t per_block = kThreads * (aligned ? kVec * kVectorsPerThread : kVectorsPerThread);
    const int64_t blocks = std::min<int64_t>((n + per_block - 1) / per_block, 1 << 20);
    const unsigned grid = static_cast<unsigned>(std::max<int64_t>(blocks, 1));
    if (aligned)
      ReduceKernel<T, true><<<grid, kThreads, 0, stream>>>(in, o, n, scale);
    else
      ReduceKernel<T, false><<<grid, kThreads, 0, stream>>>(in, o, n, scale);
  });
  return cudaGetLastError();
}

}  // namespace coarse::kernels
