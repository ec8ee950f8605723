// The proxy optimizer's kernels (see coarse_kernels.h): one element-wise
// update launch per run, a two-stage f64 sum of squares (a fixed order, so
// clipping is reproducible run to run), and the first-mismatch search that
// checks the params a step gets against the proxies' master.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "coarse_kernels.h"
#include "element_math.h"
#include "optimizer_math.h"

namespace coarse::kernels {

namespace {

constexpr int kThreads = 256;

// One element per OptStep, in place or not; kVectorized: four at a time
// through 16-byte loads and stores (every pointer aligned), the tail after.
// Each element is read and written by one thread, so aliasing w_in/w_out or
// s_in/s_out is safe.
template <bool kVectorized>
__global__ void __launch_bounds__(kThreads)
    OptimizerKernel(coarse::OptScalars given, float* g, const float* w_in, float* w_out,
                    const float* s_in0, const float* s_in1, float* s_out0, float* s_out1,
                    int64_t n) {
  const coarse::OptScalars o = coarse::WithStep(given);  // this step's lr, bc1, bc2
  const int32_t slots = coarse::OptSlots(o.kind, o.momentum);
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  const int64_t first = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  int64_t scalar_from = 0;
  if (kVectorized) {
    const int64_t nv = n / 4;
    for (int64_t j = first; j < nv; j += stride) {
      float4 gv = reinterpret_cast<const float4*>(g)[j];
      const float4 wv = reinterpret_cast<const float4*>(w_in)[j];
      float4 a = slots > 0 ? reinterpret_cast<const float4*>(s_in0)[j] : float4{};
      float4 b = slots > 1 ? reinterpret_cast<const float4*>(s_in1)[j] : float4{};
      gv.x = coarse::OptStep(o, gv.x, wv.x, &a.x, &b.x);
      gv.y = coarse::OptStep(o, gv.y, wv.y, &a.y, &b.y);
      gv.z = coarse::OptStep(o, gv.z, wv.z, &a.z, &b.z);
      gv.w = coarse::OptStep(o, gv.w, wv.w, &a.w, &b.w);
      reinterpret_cast<float4*>(w_out)[j] = gv;
      reinterpret_cast<float4*>(g)[j] = gv;
      if (slots > 0) reinterpret_cast<float4*>(s_out0)[j] = a;
      if (slots > 1) reinterpret_cast<float4*>(s_out1)[j] = b;
    }
    scalar_from = nv * 4;
  }
  for (int64_t i = scalar_from + first; i < n; i += stride) {
    float s0 = slots > 0 ? s_in0[i] : 0.0f, s1 = slots > 1 ? s_in1[i] : 0.0f;
    const float w = coarse::OptStep(o, g[i], w_in[i], &s0, &s1);
    w_out[i] = w;
    g[i] = w;
    if (slots > 0) s_out0[i] = s0;
    if (slots > 1) s_out1[i] = s1;
  }
}

// The block's threads' values summed in a fixed tree; every thread gets the sum.
__device__ double BlockSum(double v) {
  __shared__ double acc[kThreads];
  acc[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) acc[threadIdx.x] += acc[threadIdx.x + s];
    __syncthreads();
  }
  return acc[0];
}

// Stage 1: block b sums elements b, b + grid, ... (strided, fixed order per
// thread, then a fixed tree) into partial[b]. Stage 2: one block sums the
// partials the same way.
__global__ void SumSquaresKernel(const float* x, int64_t n, double* partial) {
  double v = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    v = SquareAdd(v, x[i]);
  const double sum = BlockSum(v);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// SumSquaresKernel over a span table's runs, one after the other: each
// thread's strided elements of run 0, then of run 1, ... (a fixed order).
__global__ void SumSquaresSpansKernel(const Span* spans, int64_t num_spans, double* partial) {
  double v = 0;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t r = 0; r < num_spans; ++r) {
    const float* x = static_cast<const float*>(spans[r].leaf);
    const int64_t n = spans[r].len;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += stride)
      v = SquareAdd(v, x[i]);
  }
  const double sum = BlockSum(v);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

__global__ void ClipScalarsKernel(const double* parts, int64_t num, float clip_norm, float* out) {
  coarse::ClipScalarsOf(parts, num, clip_norm, out);
}

__global__ void SumPartialsKernel(const double* partial, int n, double* out, bool accumulate) {
  double v = 0;
  for (int i = threadIdx.x; i < n; i += kThreads) v += partial[i];
  const double sum = BlockSum(v);
  if (threadIdx.x == 0) *out = accumulate ? *out + sum : sum;
}

__global__ void FirstMismatchKernel(const float* master, DType t, const void* given, DType gt,
                                    int64_t n, unsigned long long base, unsigned long long* first) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float r = RoundTrip(master[i], t);
    if (!SameBits(r, WidenAt(given, gt, i)))
      atomicMin(first, base + static_cast<unsigned long long>(i));
  }
}

// The sum of squares' grid: at most kSumSquaresBlocks partials, a fixed
// order for a given n.
int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < kSumSquaresBlocks ? (b > 0 ? b : 1) : kSumSquaresBlocks);
}

// An element-wise kernel's grid: `per_thread` elements per thread, so that
// enough loads are in flight to fill the memory system (256 blocks, as the
// sum of squares has, gave adam 55-67% of a copy's GB/s on an H200).
unsigned ElementBlocks(int64_t n, int64_t per_thread) {
  const int64_t per_block = kThreads * per_thread;
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>((n + per_block - 1) / per_block, 1 << 20)));
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t LaunchOptimizer(const coarse::OptScalars& o, float* grad_io, const float* w_in,
                            float* w_out, const float* s_in0, const float* s_in1, float* s_out0,
                            float* s_out1, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const int32_t slots = coarse::OptSlots(o.kind, o.momentum);
  const bool aligned = Aligned16(grad_io) && Aligned16(w_in) && Aligned16(w_out) &&
                       (slots < 1 || (Aligned16(s_in0) && Aligned16(s_out0))) &&
                       (slots < 2 || (Aligned16(s_in1) && Aligned16(s_out1)));
  if (aligned)
    OptimizerKernel<true><<<ElementBlocks(n, 4), kThreads, 0, stream>>>(
        o, grad_io, w_in, w_out, s_in0, s_in1, s_out0, s_out1, n);
  else
    OptimizerKernel<false><<<ElementBlocks(n, 1), kThreads, 0, stream>>>(
        o, grad_io, w_in, w_out, s_in0, s_in1, s_out0, s_out1, n);
  return cudaGetLastError();
}

cudaError_t LaunchSumSquares(const float* x, int64_t n, double* partial, double* out,
                             cudaStream_t stream) {
  const int blocks = Blocks(n);
  SumSquaresKernel<<<blocks, kThreads, 0, stream>>>(x, n, partial);
  SumPartialsKernel<<<1, kThreads, 0, stream>>>(partial, blocks, out, false);
  return cudaGetLastError();
}

cudaError_t LaunchSumSquaresSpans(const Span* spans, int64_t num_spans, int64_t total,
                                  double* partial, double* out, bool accumulate,
                                  cudaStream_t stream) {
  const int blocks = Blocks(total);
  SumSquaresSpansKernel<<<blocks, kThreads, 0, stream>>>(spans, num_spans, partial);
  SumPartialsKernel<<<1, kThreads, 0, stream>>>(partial, blocks, out, accumulate);
  return cudaGetLastError();
}

cudaError_t LaunchClipScalars(const double* parts, int64_t num, float clip_norm, float* out,
                              cudaStream_t stream) {
  ClipScalarsKernel<<<1, 1, 0, stream>>>(parts, num, clip_norm, out);
  return cudaGetLastError();
}

cudaError_t LaunchFirstMismatch(const float* master, DType dtype, const void* given,
                                DType given_dtype, int64_t n, unsigned long long base,
                                unsigned long long* first, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  FirstMismatchKernel<<<ElementBlocks(n, 1), kThreads, 0, stream>>>(master, dtype, given,
                                                                    given_dtype, n, base, first);
  return cudaGetLastError();
}

}  // namespace coarse::kernels
