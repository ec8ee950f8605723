// CudaStream (see cuda_stream.h).
#include "cuda/cuda_stream.h"

#include <string>

#include "coarse_kernels.h"
#include "cuda/cuda_util.h"

namespace coarse::cuda {
namespace ffi = xla::ffi;

CudaStream::CudaStream(cudaStream_t stream, int ordinal, std::vector<int64_t> ordinals)
    : stream_(stream), ordinal_(ordinal), ordinals_(std::move(ordinals)) {}

ffi::Error CudaStream::Pack(const kernels::Span* spans, int64_t num_spans, int64_t total,
                            float* buf) {
  return Check(
      kernels::LaunchPack(spans, num_spans, total, buf, kernels::DType::kF32, 1.0f, stream_),
      "pack kernel");
}

ffi::Error CudaStream::Unpack(const float* buf, const kernels::Span* spans, int64_t num_spans,
                              int64_t total) {
  return Check(
      kernels::LaunchUnpack(buf, kernels::DType::kF32, spans, num_spans, total, 1.0f, stream_),
      "unpack kernel");
}

ffi::Error CudaStream::Reduce(const float* const* inputs, int num_inputs, float* out, int64_t n,
                              float scale) {
  const void* in[kernels::kMaxReduceInputs];
  for (int k = 0; k < num_inputs && k < kernels::kMaxReduceInputs; ++k) in[k] = inputs[k];
  return Check(kernels::LaunchReduce(in, num_inputs, out, n, kernels::DType::kF32, scale, stream_),
               "reduce kernel");
}

ffi::Error CudaStream::Optimizer(const OptScalars& o, const OptBuffers& b, int64_t n) {
  return Check(kernels::LaunchOptimizer(o, b.grad_io, b.w_in, b.w_out, b.s_in[0], b.s_in[1],
                                        b.s_out[0], b.s_out[1], n, stream_),
               "optimizer kernel");
}

ffi::Error CudaStream::SumSquares(const float* x, int64_t n, double* partial, double* out) {
  return Check(kernels::LaunchSumSquares(x, n, partial, out, stream_), "sum-of-squares kernel");
}

ffi::Error CudaStream::FirstMismatch(const float* master, const float* given, int64_t n,
                                     kernels::DType dtype, unsigned long long* first) {
  return Check(kernels::LaunchFirstMismatch(master, given, n, dtype, first, stream_),
               "params-check kernel");
}

ffi::Error CudaStream::Memset(void* dst, size_t bytes, const char* what) {
  return Check(cudaMemsetAsync(dst, 0, bytes, stream_), what);
}

ffi::Error CudaStream::Copy(void* dst, int64_t dst_device, const void* src, int64_t src_device,
                            size_t bytes, const char* what) {
  if (dst_device == src_device)
    return Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), what);
  if (dst_device >= static_cast<int64_t>(ordinals_.size()) ||
      src_device >= static_cast<int64_t>(ordinals_.size()))
    return ffi::Error::Internal(std::string("coarse_jax: ") + what +
                                ": the stream has no ordinal for a mesh device");
  return Check(cudaMemcpyPeerAsync(dst, static_cast<int>(ordinals_[dst_device]), src,
                                   static_cast<int>(ordinals_[src_device]), bytes, stream_),
               what);
}

ffi::Error CudaStream::Upload(void* dst, const void* src, size_t bytes, const char* what) {
  return Check(UploadAsync(ordinal_, dst, src, bytes, stream_), what);
}

ffi::Error CudaStream::Download(void* dst, const void* src, size_t bytes, const char* what) {
  return Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), what);
}

ffi::Error CudaStream::Record(StreamEvent event) {
  return Check(cudaEventRecord(static_cast<cudaEvent_t>(event), stream_),
               "recording this device's event");
}

ffi::Error CudaStream::Wait(StreamEvent event, int64_t device) {
  const std::string gpu = device < static_cast<int64_t>(ordinals_.size())
                              ? "GPU " + std::to_string(ordinals_[device])
                              : "mesh device " + std::to_string(device);
  return Check(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(event), 0),
               "waiting for " + gpu + "'s event");
}

ffi::Error CudaStream::Synchronize(const char* what) {
  return Check(cudaStreamSynchronize(stream_), what);
}

}  // namespace coarse::cuda
