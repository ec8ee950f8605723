// The proxy optimizer over rows (see coarse_kernels.h: LaunchOptimizerRows):
// the owned chunks of a ring group's pieces, one launch for the group
// (ffi/runtime/ring_groups.h). Scalar loads; each element's update is
// OptStep's, as in optim.cu's kernel, so the bits are the same.
#include <algorithm>
#include <cstdint>

#include "coarse_kernels.h"
#include "optimizer_math.h"

namespace coarse::kernels {
namespace {

constexpr int kThreads = 256;

// Rows over blockIdx.y, a row's elements over blockIdx.x. Each element is
// read and written by one thread (w_in/w_out and s_in/s_out may alias).
__global__ void __launch_bounds__(kThreads)
    OptimizerRowsKernel(coarse::OptScalars given, float* g, const float* w_in, float* w_out,
                        const float* s_in0, const float* s_in1, float* s_out0, float* s_out1,
                        int64_t n, int64_t rows, int64_t grad_pitch, int64_t buf_pitch) {
  const coarse::OptScalars o = coarse::WithStep(given);  // this step's lr, bc1, bc2
  const int32_t slots = coarse::OptSlots(o.kind, o.momentum);
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  const int64_t first = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    float* gr = g + r * grad_pitch;
    const int64_t b = r * buf_pitch;
    for (int64_t i = first; i < n; i += stride) {
      float s0 = slots > 0 ? s_in0[b + i] : 0.0f, s1 = slots > 1 ? s_in1[b + i] : 0.0f;
      const float w = coarse::OptStep(o, gr[i], w_in[b + i], &s0, &s1);
      w_out[b + i] = w;
      gr[i] = w;
      if (slots > 0) s_out0[b + i] = s0;
      if (slots > 1) s_out1[b + i] = s1;
    }
  }
}

}  // namespace

cudaError_t LaunchOptimizerRows(const coarse::OptScalars& o, float* grad_io, const float* w_in,
                                float* w_out, const float* s_in0, const float* s_in1, float* s_out0,
                                float* s_out1, int64_t n, int64_t rows, int64_t grad_pitch,
                                int64_t buf_pitch, cudaStream_t stream) {
  if (n <= 0 || rows <= 0) return cudaSuccess;
  const int64_t per_block = kThreads * 4;
  const dim3 grid(static_cast<unsigned>(std::max<int64_t>(
                      1, std::min<int64_t>((n + per_block - 1) / per_block, 1 << 16))),
                  static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
  OptimizerRowsKernel<<<grid, kThreads, 0, stream>>>(o, grad_io, w_in, w_out, s_in0, s_in1, s_out0,
                                                     s_out1, n, rows, grad_pitch, buf_pitch);
  return cudaGetLastError();
}

}  // namespace coarse::kernels
