// CudaDevice (see cuda_device.h): each Device operation as kernel launches and
// peer copies on XLA's stream, Publish/Acquire as events.
#include "cuda/cuda_device.h"

#include <algorithm>
#include <string>
#include <vector>

#include "coarse_kernels.h"
#include "cuda/cuda_util.h"

namespace coarse::cuda {
namespace ffi = xla::ffi;

CudaDevice::CudaDevice(cudaStream_t stream, int64_t self, CudaStorage& storage)
    : stream_(stream), self_(self), st_(storage) {}

ffi::Error CudaDevice::UploadRuns(const LeafRun* runs, int64_t num_runs, int64_t buf_len,
                                  int64_t* total) {
  if (num_runs > st_.max_runs())
    return ffi::Error::Internal("coarse_jax: " + std::to_string(num_runs) +
                                " runs exceed the span table (" + std::to_string(st_.max_runs()) +
                                ")");
  std::vector<kernels::Span> spans(num_runs);
  for (int64_t r = 0; r < num_runs; ++r) {
    if (runs[r].buf_off < 0 || runs[r].buf_off + runs[r].len > buf_len)
      return ffi::Error::Internal("coarse_jax: a run falls outside its buffer");
    spans[r].leaf = runs[r].leaf;
    spans[r].buf_off = runs[r].buf_off;
    spans[r].len = runs[r].len;
    if (!ToKernelDType(runs[r].dtype, &spans[r].leaf_dtype))
      return ffi::Error::InvalidArgument(
          "coarse_jax: only float32, bfloat16 and float16 leaves are synchronized");
  }
  *total = kernels::SetBegins(spans.data(), num_runs);
  return Check(UploadAsync(st_.ordinal(self_), st_.spans(self_), spans.data(),
                           num_runs * sizeof(kernels::Span), stream_),
               "uploading a span table");
}

ffi::Error CudaDevice::PeerCopy(float* dst, int64_t dst_device, const float* src,
                                int64_t src_device, int64_t n, const char* what) {
  if (n <= 0) return ffi::Error::Success();
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  if (dst_device == src_device)
    return Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), what);
  return Check(cudaMemcpyPeerAsync(dst, st_.ordinal(dst_device), src, st_.ordinal(src_device),
                                   bytes, stream_),
               what);
}

ffi::Error CudaDevice::Gather(const LeafRun* runs, int64_t num_runs, float* dst, int64_t dst_device,
                              int64_t dst_len) {
  if (num_runs == 0 || dst_len == 0) return ffi::Error::Success();
  if (dst_device != self_ && dst_len > st_.staging_len())
    return ffi::Error::Internal("coarse_jax: a piece exceeds the staging buffer");
  int64_t total = 0;
  ffi::Error e = UploadRuns(runs, num_runs, dst_len, &total);
  if (e.failure()) return e;
  // A peer's storage: pack here, then one peer copy of the whole piece.
  float* target = dst_device == self_ ? dst : st_.staging(self_);
  e = Check(kernels::LaunchPack(st_.spans(self_), num_runs, total, target, kernels::DType::kF32,
                                1.0f, stream_),
            "pack kernel");
  if (e.failure() || target == dst) return e;
  return PeerCopy(dst, dst_device, target, self_, dst_len, "push: peer copy to the proxy");
}

ffi::Error CudaDevice::Scatter(const float* src, int64_t src_device, int64_t src_len,
                               const LeafRun* runs, int64_t num_runs) {
  if (num_runs == 0 || src_len == 0) return ffi::Error::Success();
  const float* from = src;
  if (src_device != self_) {  // a peer's storage: one peer copy here, then unpack
    if (src_len > st_.staging_len())
      return ffi::Error::Internal("coarse_jax: a piece exceeds the staging buffer");
    ffi::Error e = PeerCopy(st_.staging(self_), self_, src, src_device, src_len,
                            "pull: peer copy from the proxy");
    if (e.failure()) return e;
    from = st_.staging(self_);
  }
  int64_t total = 0;
  ffi::Error e = UploadRuns(runs, num_runs, src_len, &total);
  if (e.failure()) return e;
  return Check(kernels::LaunchUnpack(from, kernels::DType::kF32, st_.spans(self_), num_runs, total,
                                     1.0f, stream_),
               "unpack kernel");
}

ffi::Error CudaDevice::SumSlots(float* own, int64_t n, int64_t slots) {
  if (n == 0 || slots == 1) return ffi::Error::Success();
  if (slots == 0)
    return Check(cudaMemsetAsync(own, 0, n * sizeof(float), stream_), "zeroing a slot");
  // Slot order, as on CPU: ((s0 + s1) + s2) + ..., in launches of up to 8 inputs.
  for (int64_t j = 1; j < slots;) {
    const void* in[kernels::kMaxReduceInputs] = {own};
    int count = 1;
    for (; count < kernels::kMaxReduceInputs && j < slots; ++count, ++j) in[count] = own + j * n;
    ffi::Error e =
        Check(kernels::LaunchReduce(in, count, own, n, kernels::DType::kF32, 1.0f, stream_),
              "summing the clients' slots");
    if (e.failure()) return e;
  }
  return ffi::Error::Success();
}

ffi::Error CudaDevice::AddFrom(float* own, const float* peer, int64_t peer_device, int64_t n,
                               float scale) {
  if (n == 0) return ffi::Error::Success();
  const float* x = peer;
  if (peer_device != self_) {
    // Received at the accumulator's own 16-byte offset, so the reduce kernel
    // peels the same head from both and runs the rest vectorized.
    const int64_t shift = (reinterpret_cast<uintptr_t>(own) / sizeof(float)) % 4;
    if (n + shift > st_.staging_len() + 4)
      return ffi::Error::Internal("coarse_jax: a ring chunk exceeds the staging buffer");
    float* recv = st_.staging(self_) + shift;
    ffi::Error e = PeerCopy(recv, self_, peer, peer_device, n, "ring: peer copy");
    if (e.failure()) return e;
    x = recv;
  }
  const void* in[2] = {own, x};
  return Check(kernels::LaunchReduce(in, 2, own, n, kernels::DType::kF32, scale, stream_),
               "ring: reduce kernel");
}

ffi::Error CudaDevice::CopyFrom(float* own, const float* peer, int64_t peer_device, int64_t n) {
  return PeerCopy(own, self_, peer, peer_device, n, "ring: peer copy");
}

ffi::Error CudaDevice::SumInRingOrder(float*, const float* const*, int64_t, int64_t, float) {
  // GPUs run the ring (ReadsPeersInPlace() is false): peers' memory is not this device's.
  return ffi::Error::Internal("coarse_jax: SumInRingOrder is CPU-only");
}

ffi::Error CudaDevice::SumPushesInRingOrder(float*, int64_t, int64_t,
                                            const std::vector<std::vector<const PushedRuns*>>&,
                                            float) {
  // Pushes are copied on GPUs (ReadsPeersInPlace() is false).
  return ffi::Error::Internal("coarse_jax: SumPushesInRingOrder is CPU-only");
}

ffi::Error CudaDevice::Scale(float* x, int64_t n, float scale) {
  const void* in[1] = {x};
  return Check(kernels::LaunchReduce(in, 1, x, n, kernels::DType::kF32, scale, stream_),
               "scale kernel");
}

ffi::Error CudaDevice::ZeroBytes(void* dst, size_t bytes) {
  if (bytes == 0) return ffi::Error::Success();
  return Check(cudaMemsetAsync(dst, 0, bytes, stream_), "zeroing a result");
}

ffi::Error CudaDevice::CopyBytes(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return ffi::Error::Success();
  return Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_),
               "copying a pass-through result");
}

ffi::Error CudaDevice::Publish() {
  return Check(cudaEventRecord(st_.event(self_), stream_), "recording this device's event");
}

ffi::Error CudaDevice::Acquire(int64_t device) {
  if (device == self_) return ffi::Error::Success();
  return Check(cudaStreamWaitEvent(stream_, st_.event(device), 0),
               "waiting for GPU " + std::to_string(st_.ordinal(device)) + "'s event");
}

ffi::Error CudaDevice::ApplyOptimizer(const OptScalars& o, const OptBuffers& b, int64_t n) {
  return Check(kernels::LaunchOptimizer(o, b.grad_io, b.w_in, b.w_out, b.s_in[0], b.s_in[1],
                                        b.s_out[0], b.s_out[1], n, stream_),
               "optimizer kernel");
}

// The two below block the host on the stream: they serve global-norm
// clipping and the params check, a few scalars per step on the proxies.
ffi::ErrorOr<double> CudaDevice::SumSquares(const float* x, int64_t n) {
  double* scratch = nullptr;
  const size_t bytes = (kernels::kSumSquaresBlocks + 1) * sizeof(double);
  ffi::Error e = Check(cudaMallocAsync(reinterpret_cast<void**>(&scratch), bytes, stream_),
                       "cudaMallocAsync (sum of squares)");
  if (e.failure()) return ffi::Unexpected(e);
  double out = 0;
  e = Check(kernels::LaunchSumSquares(x, n, scratch, scratch + kernels::kSumSquaresBlocks, stream_),
            "sum-of-squares kernel");
  if (e.success())
    e = Check(cudaMemcpyAsync(&out, scratch + kernels::kSumSquaresBlocks, sizeof out,
                              cudaMemcpyDeviceToHost, stream_),
              "copying the sum of squares");
  cudaFreeAsync(scratch, stream_);
  if (e.success()) e = Check(cudaStreamSynchronize(stream_), "sum of squares");
  if (e.failure()) return ffi::Unexpected(e);
  return out;
}

ffi::ErrorOr<Mismatch> CudaDevice::FirstMismatch(const float* master, const float* given, int64_t n,
                                                 ffi::DataType dtype) {
  kernels::DType t;
  if (!ToKernelDType(dtype, &t))
    return ffi::Unexpected(ffi::Error::InvalidArgument("coarse_jax: unsupported params dtype"));
  unsigned long long* first = nullptr;
  ffi::Error e = Check(cudaMallocAsync(reinterpret_cast<void**>(&first), sizeof *first, stream_),
                       "cudaMallocAsync (params check)");
  if (e.failure()) return ffi::Unexpected(e);
  unsigned long long host = static_cast<unsigned long long>(n);
  e = Check(cudaMemcpyAsync(first, &host, sizeof host, cudaMemcpyHostToDevice, stream_),
            "params check");
  if (e.success())
    e = Check(kernels::LaunchFirstMismatch(master, given, n, t, first, stream_),
              "params-check kernel");
  if (e.success())
    e = Check(cudaMemcpyAsync(&host, first, sizeof host, cudaMemcpyDeviceToHost, stream_),
              "params check");
  cudaFreeAsync(first, stream_);
  if (e.success()) e = Check(cudaStreamSynchronize(stream_), "params check");
  if (e.failure()) return ffi::Unexpected(e);
  Mismatch m;
  if (static_cast<int64_t>(host) >= n) return m;
  m.index = static_cast<int64_t>(host);
  float values[2] = {0, 0};
  e = Check(cudaMemcpy(&values[0], given + m.index, sizeof(float), cudaMemcpyDeviceToHost),
            "params check");
  if (e.success())
    e = Check(cudaMemcpy(&values[1], master + m.index, sizeof(float), cudaMemcpyDeviceToHost),
              "params check");
  if (e.failure()) return ffi::Unexpected(e);
  m.given = values[0];
  m.held = values[1];  // before rounding to the params' dtype
  return m;
}

}  // namespace coarse::cuda
