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

  Status Pack(const kernels::Span* spans, int64_t num_spans, int64_t total, float* buf) override;
  Status Unpack(const float* buf, const kernels::Span* spans, int64_t num_spans,
                int64_t total) override;
  Status Reduce(const float* const* inputs, int num_inputs, float* out, int64_t n,
                float scale) override;
  Status ReduceRows(const float* const* inputs, int num_inputs, float* out, int64_t n, float scale,
                    const RowPitches& rows) override;
  Status Optimizer(const OptScalars& o, const OptBuffers& b, int64_t n) override;
  Status OptimizerRows(const OptScalars& o, const OptBuffers& b, int64_t n, int64_t rows,
                       int64_t grad_pitch, int64_t buf_pitch) override;
  Status SumSquares(const float* x, int64_t n, double* partial, double* out) override;
  Status SumSquaresSpans(const kernels::Span* spans, int64_t num_spans, int64_t total,
                         double* partial, double* out, bool accumulate) override;
  Status ClipScalars(const double* parts, int64_t num, float clip_norm, float* out) override;
  Status FirstMismatch(const float* master, kernels::DType dtype, const void* given,
                       kernels::DType given_dtype, int64_t n, unsigned long long base,
                       unsigned long long* first) override;
  Status Memset(void* dst, size_t bytes, const char* what) override;
  Status Copy(void* dst, int64_t dst_device, const void* src, int64_t src_device, size_t bytes,
              const char* what) override;
  Status CopyRows(void* dst, int64_t dst_device, size_t dst_pitch, const void* src,
                  int64_t src_device, size_t src_pitch, size_t row_bytes, int64_t rows,
                  const char* what) override;
  Status Upload(void* dst, const void* src, size_t bytes, const char* what) override;
  Status Download(void* dst, const void* src, size_t bytes, const char* what) override;
  Status Record(StreamEvent event) override;
  Status Wait(StreamEvent event, int64_t device) override;
  Status Synchronize(const char* what) override;
  // cudaMemcpyAsync from pinned host memory.
  Status UploadPinned(void* dst, const void* src, size_t bytes, const char* what) override;
  // cudaEventQuery in a loop (backing off to 50 us) until the deadline:
  // cudaEventSynchronize has no timeout.
  Status HostWait(StreamEvent event, std::chrono::milliseconds timeout,
                  const std::string& what) override;
  // cuStreamWaitValue32(GEQ) on the flag's device address (pinned, mapped:
  // cudaHostGetDevicePointer), from the driver's entry point
  // (cudaGetDriverEntryPointByVersion, so the module still needs only
  // cudart). The GPU's wait has no timeout: `timeout` is not used.
  Status WaitValue(const uint32_t* flag, uint32_t value, std::chrono::milliseconds timeout,
                   const std::string& what) override;

 private:
  cudaStream_t stream_;
  int ordinal_;
  std::vector<int64_t> ordinals_;
};

}  // namespace coarse::cuda
