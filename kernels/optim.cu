// The proxy optimizer's kernels (see coarse_kernels.h): one element-wise
// update launch per run, a two-stage f64 sum of squares (a fixed order, so
// clipping is reproducible run to run), and the first-mismatch search that
// checks the params a step gets against the proxies' master.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "coarse_kernels.h"
#include "element_math.h"
#include "optimizer_math.h"

namespace coarse::kernels {

namespace {

constexpr int kThreads = 256;

__global__ void OptimizerKernel(coarse::OptScalars o, float* g, const float* w_in, float* w_out,
                                const float* s_in0, const float* s_in1, float* s_out0,
                                float* s_out1, int64_t n) {
  const int32_t slots = coarse::OptSlots(o.kind, o.momentum);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float s0 = slots > 0 ? s_in0[i] : 0.0f, s1 = slots > 1 ? s_in1[i] : 0.0f;
    const float w = coarse::OptStep(o, g[i], w_in[i], &s0, &s1);
    w_out[i] = w;
    g[i] = w;
    if (slots > 0) s_out0[i] = s0;
    if (slots > 1) s_out1[i] = s1;
  }
}

// Stage 1: block b sums elements b, b + grid, ... (strided, fixed order per
// thread, then a fixed tree) into partial[b]. Stage 2: one block sums the
// partials the same way.
__global__ void SumSquaresKernel(const float* x, int64_t n, double* partial) {
  __shared__ double acc[kThreads];
  double v = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    v = SquareAdd(v, x[i]);
  acc[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) acc[threadIdx.x] += acc[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = acc[0];
}

__global__ void SumPartialsKernel(const double* partial, int n, double* out) {
  __shared__ double acc[kThreads];
  double v = 0;
  for (int i = threadIdx.x; i < n; i += kThreads) v += partial[i];
  acc[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) acc[threadIdx.x] += acc[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = acc[0];
}

__global__ void FirstMismatchKernel(const float* master, const float* given, int64_t n, DType t,
                                    unsigned long long* first) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float r = RoundTrip(master[i], t);
    if (!SameBits(r, given[i])) atomicMin(first, static_cast<unsigned long long>(i));
  }
}

int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < kSumSquaresBlocks ? (b > 0 ? b : 1) : kSumSquaresBlocks);
}

}  // namespace

cudaError_t LaunchOptimizer(const coarse::OptScalars& o, float* grad_io, const float* w_in,
                            float* w_out, const float* s_in0, const float* s_in1, float* s_out0,
                            float* s_out1, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  OptimizerKernel<<<Blocks(n), kThreads, 0, stream>>>(o, grad_io, w_in, w_out, s_in0, s_in1, s_out0,
                                                      s_out1, n);
  return cudaGetLastError();
}

cudaError_t LaunchSumSquares(const float* x, int64_t n, double* partial, double* out,
                             cudaStream_t stream) {
  const int blocks = Blocks(n);
  SumSquaresKernel<<<blocks, kThreads, 0, stream>>>(x, n, partial);
  SumPartialsKernel<<<1, kThreads, 0, stream>>>(partial, blocks, out);
  return cudaGetLastError();
}

cudaError_t LaunchFirstMismatch(const float* master, const float* given, int64_t n, DType dtype,
                                unsigned long long* first, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  FirstMismatchKernel<<<Blocks(n), kThreads, 0, stream>>>(master, given, n, dtype, first);
  return cudaGetLastError();
}

}  // namespace coarse::kernels
