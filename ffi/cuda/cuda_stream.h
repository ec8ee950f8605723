// The stream API (runtime/stream.h) on a cudaStream_t: the kernels' launch
// functions (kernels/), cudaMemcpyPeerAsync between GPUs, cudaEventRecord /
// cudaStreamWaitEvent, cudaStreamSynchronize. All that is CUDA-only of the
// backend besides storage; the orchestration is runtime/stream_device.h.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "runtime/stream.h"

namespace coarse::cuda {

class CudaStream final : public Stream {
 public:
  // `ordinals`: the CUDA device of every mesh device (for peer copies; may be
  // empty if the stream never copies between devices). `ordinal`: the GPU
  // `stream` belongs to.
  CudaStream(cudaStream_t stream, int ordinal, std::vector<int64_t> ordinals);

  xla::ffi::Error Pack(const kernels::Span* spans, int64_t num_spans, int64_t total,
                       float* buf) override;
  xla::ffi::Error Unpack(const float* buf, const kernels::Span* spans, int64_t num_spans,
                         int64_t total) override;
  xla::ffi::Error Reduce(const float* const* inputs, int num_inputs, float* out, int64_t n,
                         float scale) override;
  xla::ffi::Error ReduceRows(const float* const* inputs, int num_inputs, float* out, int64_t n,
                             float scale, const RowPitches& rows) override;
  xla::ffi::Error Optimizer(const OptScalars& o, const OptBuffers& b, int64_t n) override;
  xla::ffi::Error OptimizerRows(const OptScalars& o, const OptBuffers& b, int64_t n, int64_t rows,
                                int64_t grad_pitch, int64_t buf_pitch) override;
  xla::ffi::Error SumSquares(const float* x, int64_t n, double* partial, double* out) override;
  xla::ffi::Error SumSquaresSpans(const kernels::Span* spans, int64_t num_spans, int64_t total,
                                  double* partial, double* out, bool accumulate) override;
  xla::ffi::Error ClipScalars(const double* parts, int64_t num, float clip_norm,
                              float* out) override;
  xla::ffi::Error FirstMismatch(const float* master, kernels::DType dtype, const void* given,
                                kernels::DType given_dtype, int64_t n, unsigned long long base,
                                unsigned long long* first) override;
  xla::ffi::Error Memset(void* dst, size_t bytes, const char* what) override;
  xla::ffi::Error Copy(void* dst, int64_t dst_device, const void* src, int64_t src_device,
                       size_t bytes, const char* what) override;
  xla::ffi::Error CopyRows(void* dst, int64_t dst_device, size_t dst_pitch, const void* src,
                           int64_t src_device, size_t src_pitch, size_t row_bytes, int64_t rows,
                           const char* what) override;
  xla::ffi::Error Upload(void* dst, const void* src, size_t bytes, const char* what) override;
  xla::ffi::Error Download(void* dst, const void* src, size_t bytes, const char* what) override;
  xla::ffi::Error Record(StreamEvent event) override;
  xla::ffi::Error Wait(StreamEvent event, int64_t device) override;
  xla::ffi::Error Synchronize(const char* what) override;
  // cudaMemcpyAsync from pinned host memory.
  xla::ffi::Error UploadPinned(void* dst, const void* src, size_t bytes, const char* what) override;
  // cudaEventQuery in a loop (backing off to 50 us) until the deadline:
  // cudaEventSynchronize has no timeout.
  xla::ffi::Error HostWait(StreamEvent event, std::chrono::milliseconds timeout,
                           const std::string& what) override;
  // cuStreamWaitValue32(GEQ) on the flag's device address (pinned, mapped:
  // cudaHostGetDevicePointer), from the driver's entry point
  // (cudaGetDriverEntryPointByVersion, so the module still needs only
  // cudart). The GPU's wait has no timeout: `timeout` is not used.
  xla::ffi::Error WaitValue(const uint32_t* flag, uint32_t value, std::chrono::milliseconds timeout,
                            const std::string& what) override;

 private:
  cudaStream_t stream_;
  int ordinal_;
  std::vector<int64_t> ordinals_;
};

}  // namespace coarse::cuda
