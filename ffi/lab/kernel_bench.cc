// BenchKernels (see kernel_bench.h): the launch functions timed with CUDA
// events next to a device-to-device copy.
#include "lab/kernel_bench.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <vector>

#include "coarse_kernels.h"

namespace coarse::cuda {
namespace {

void Ok(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("coarse_jax bench: ") + what + ": " +
                             cudaGetErrorString(err));
}

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    Ok(cudaMalloc(&p, std::max<size_t>(bytes, 16)), "cudaMalloc");
    // Never time on zeros: 0x3e3e3e3e is 0.186 as f32, 0.186 as bf16/f16 pairs.
    Ok(cudaMemset(p, 0x3e, std::max<size_t>(bytes, 16)), "cudaMemset");
  }
  ~DeviceBuffer() { cudaFree(p); }
};

double MedianMicros(const std::function<cudaError_t()>& launch, int iters) {
  cudaEvent_t start, stop;
  Ok(cudaEventCreate(&start), "cudaEventCreate");
  Ok(cudaEventCreate(&stop), "cudaEventCreate");
  for (int w = 0; w < 3; ++w) Ok(launch(), "warm-up launch");
  Ok(cudaDeviceSynchronize(), "warm-up");
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) {
    Ok(cudaEventRecord(start), "record");
    Ok(launch(), "launch");
    Ok(cudaEventRecord(stop), "record");
    Ok(cudaEventSynchronize(stop), "sync");
    Ok(cudaEventElapsedTime(&ms[i], start, stop), "elapsed");
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::nth_element(ms.begin(), ms.begin() + iters / 2, ms.end());
  return 1e3 * ms[iters / 2];
}

}  // namespace

std::map<std::string, double> BenchKernels(int64_t nelems, const std::string& dtype,
                                           int64_t num_leaves, int iters) {
  kernels::DType t;
  if (dtype == "float32")
    t = kernels::DType::kF32;
  else if (dtype == "bfloat16")
    t = kernels::DType::kBF16;
  else if (dtype == "float16")
    t = kernels::DType::kF16;
  else
    throw std::invalid_argument("dtype must be float32, bfloat16 or float16, got " + dtype);
  if (nelems <= 0 || num_leaves <= 0 || iters <= 0)
    throw std::invalid_argument("nelems, num_leaves and iters must be positive");
  const size_t width = kernels::ByteWidth(t), bytes = nelems * width;
  DeviceBuffer a(bytes), b(bytes), out(bytes), leaves(bytes);

  // num_leaves leaves of (almost) equal size, end to end in `leaves`.
  std::vector<kernels::Span> spans(num_leaves);
  for (int64_t i = 0; i < num_leaves; ++i) {
    const int64_t lo = nelems * i / num_leaves, hi = nelems * (i + 1) / num_leaves;
    spans[i] = kernels::Span{static_cast<char*>(leaves.p) + lo * width, lo, hi - lo, 0, t};
  }
  const int64_t total = kernels::SetBegins(spans.data(), num_leaves);
  DeviceBuffer d_spans(spans.size() * sizeof(kernels::Span));
  Ok(cudaMemcpy(d_spans.p, spans.data(), spans.size() * sizeof(kernels::Span),
                cudaMemcpyHostToDevice),
     "span upload");
  const auto* sp = static_cast<const kernels::Span*>(d_spans.p);

  std::map<std::string, double> r;
  r["copy_us"] = MedianMicros(
      [&] { return cudaMemcpyAsync(out.p, a.p, bytes, cudaMemcpyDeviceToDevice, 0); }, iters);
  r["copy_bytes"] = 2.0 * bytes;
  r["pack_us"] = MedianMicros(
      [&] { return kernels::LaunchPack(sp, num_leaves, total, out.p, t, 1.0f, 0); }, iters);
  r["pack_bytes"] = 2.0 * bytes;
  r["unpack_us"] = MedianMicros(
      [&] { return kernels::LaunchUnpack(a.p, t, sp, num_leaves, total, 1.0f, 0); }, iters);
  r["unpack_bytes"] = 2.0 * bytes;
  const void* in[2] = {a.p, b.p};
  r["reduce_us"] =
      MedianMicros([&] { return kernels::LaunchReduce(in, 2, out.p, nelems, t, 0.5f, 0); }, iters);
  r["reduce_bytes"] = 3.0 * bytes;
  if (t == kernels::DType::kF32) {
    // The proxy optimizer's update (adam, in place as the proxies run it):
    // reads gradient, weight and two state slots, writes all four back.
    OptScalars o;
    o.kind = OptKind::kAdam;
    o.lr = 1e-3f, o.b1 = 0.9f, o.one_minus_b1 = 0.1f, o.b2 = 0.999f, o.one_minus_b2 = 1e-3f;
    o.eps = 1e-8f, o.bc1 = 0.1f, o.bc2 = 1e-3f;
    auto* g = static_cast<float*>(a.p);
    auto* w = static_cast<float*>(b.p);
    auto* s0 = static_cast<float*>(out.p);
    auto* s1 = static_cast<float*>(leaves.p);
    Ok(cudaMemset(s1, 0, bytes), "cudaMemset");  // nu >= 0: no NaN from sqrt
    r["adam_us"] = MedianMicros(
        [&] { return kernels::LaunchOptimizer(o, g, w, w, s0, s1, s0, s1, nelems, 0); }, iters);
    r["adam_bytes"] = 8.0 * bytes;
  }
  return r;
}

std::map<std::string, double> BenchHostCopy(int64_t bytes, int iters) {
  if (bytes <= 0 || iters <= 0) throw std::invalid_argument("bytes and iters must be positive");
  DeviceBuffer dev(bytes);
  void* host = nullptr;
  Ok(cudaHostAlloc(&host, bytes, cudaHostAllocPortable), "cudaHostAlloc");
  std::map<std::string, double> r;
  try {
    r["d2h_us"] = MedianMicros(
        [&] { return cudaMemcpyAsync(host, dev.p, bytes, cudaMemcpyDeviceToHost, 0); }, iters);
    r["h2d_us"] = MedianMicros(
        [&] { return cudaMemcpyAsync(dev.p, host, bytes, cudaMemcpyHostToDevice, 0); }, iters);
  } catch (...) {
    cudaFreeHost(host);
    throw;
  }
  cudaFreeHost(host);
  r["bytes"] = static_cast<double>(bytes);
  return r;
}

}  // namespace coarse::cuda
