// Kernel throughput next to a device-to-device copy of the same bytes, timed
// with CUDA events on one GPU (benchmarks/test_kernels_gpu.py). Lives in an
// extension so the numbers are the launch functions' own, without JAX's
// dispatch in them (the lab module _coarse_lab_cuda).
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace coarse::cuda {

// Times, on the current device, `iters` runs of each of:
//   copy   cudaMemcpyAsync D2D of the packed buffer's bytes
//   pack   `num_leaves` equal leaves of `dtype` -> one buffer of `dtype`
//   unpack the inverse
//   reduce out = 0.5 * (a + b), `nelems` elements of `dtype`
//   adam   (float32 only) the proxy optimizer's adam update in place: gradient,
//          weight and two state slots of `nelems` floats each, read and written
// and returns, per name, the median microseconds ("<name>_us") and the bytes
// it reads plus writes ("<name>_bytes"). Throws std::runtime_error on a CUDA error.
std::map<std::string, double> BenchKernels(int64_t nelems, const std::string& dtype,
                                           int64_t num_leaves, int iters);

// Times `iters` runs of a plain cudaMemcpyAsync of `bytes` between the current
// GPU and pinned host memory (cudaHostAlloc), each way: "d2h_us", "h2d_us"
// (medians) and "bytes". The baseline of the host proxies' pushes and pulls.
std::map<std::string, double> BenchHostCopy(int64_t bytes, int iters);

}  // namespace coarse::cuda
