// CudaStream (see cuda_stream.h).
#include "cuda/cuda_stream.h"

#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>

#include "coarse_kernels.h"
#include "cuda/cuda_util.h"
#include "runtime/storage.h"

namespace coarse::cuda {

CudaStream::CudaStream(cudaStream_t stream, int ordinal, std::vector<int64_t> ordinals)
    : stream_(stream), ordinal_(ordinal), ordinals_(std::move(ordinals)) {}

Status CudaStream::Pack(const kernels::Span* spans, int64_t num_spans, int64_t total, float* buf) {
  return Check(
      kernels::LaunchPack(spans, num_spans, total, buf, kernels::DType::kF32, 1.0f, stream_),
      "pack kernel");
}

Status CudaStream::Unpack(const float* buf, const kernels::Span* spans, int64_t num_spans,
                          int64_t total) {
  return Check(
      kernels::LaunchUnpack(buf, kernels::DType::kF32, spans, num_spans, total, 1.0f, stream_),
      "unpack kernel");
}

Status CudaStream::Reduce(const float* const* inputs, int num_inputs, float* out, int64_t n,
                          float scale) {
  const void* in[kernels::kMaxReduceInputs];
  for (int k = 0; k < num_inputs && k < kernels::kMaxReduceInputs; ++k) in[k] = inputs[k];
  return Check(kernels::LaunchReduce(in, num_inputs, out, n, kernels::DType::kF32, scale, stream_),
               "reduce kernel");
}

Status CudaStream::ReduceRows(const float* const* inputs, int num_inputs, float* out, int64_t n,
                              float scale, const RowPitches& rows) {
  return Check(kernels::LaunchReduceRows(inputs, rows.in, num_inputs, out, rows.out, n, rows.count,
                                         scale, stream_),
               "reduce kernel (rows)");
}

Status CudaStream::Optimizer(const OptScalars& o, const OptBuffers& b, int64_t n) {
  return Check(kernels::LaunchOptimizer(o, b.grad_io, b.w_in, b.w_out, b.s_in[0], b.s_in[1],
                                        b.s_out[0], b.s_out[1], n, stream_),
               "optimizer kernel");
}

Status CudaStream::OptimizerRows(const OptScalars& o, const OptBuffers& b, int64_t n, int64_t rows,
                                 int64_t grad_pitch, int64_t buf_pitch) {
  return Check(
      kernels::LaunchOptimizerRows(o, b.grad_io, b.w_in, b.w_out, b.s_in[0], b.s_in[1], b.s_out[0],
                                   b.s_out[1], n, rows, grad_pitch, buf_pitch, stream_),
      "optimizer kernel (rows)");
}

Status CudaStream::SumSquares(const float* x, int64_t n, double* partial, double* out) {
  return Check(kernels::LaunchSumSquares(x, n, partial, out, stream_), "sum-of-squares kernel");
}

Status CudaStream::SumSquaresSpans(const kernels::Span* spans, int64_t num_spans, int64_t total,
                                   double* partial, double* out, bool accumulate) {
  return Check(
      kernels::LaunchSumSquaresSpans(spans, num_spans, total, partial, out, accumulate, stream_),
      "sum-of-squares kernel");
}

Status CudaStream::ClipScalars(const double* parts, int64_t num, float clip_norm, float* out) {
  return Check(kernels::LaunchClipScalars(parts, num, clip_norm, out, stream_),
               "clip-scalars kernel");
}

Status CudaStream::FirstMismatch(const float* master, kernels::DType dtype, const void* given,
                                 kernels::DType given_dtype, int64_t n, unsigned long long base,
                                 unsigned long long* first) {
  return Check(
      kernels::LaunchFirstMismatch(master, dtype, given, given_dtype, n, base, first, stream_),
      "params-check kernel");
}

Status CudaStream::Memset(void* dst, size_t bytes, const char* what) {
  return Check(cudaMemsetAsync(dst, 0, bytes, stream_), what);
}

Status CudaStream::Copy(void* dst, int64_t dst_device, const void* src, int64_t src_device,
                        size_t bytes, const char* what) {
  if (dst_device == src_device)
    return Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), what);
  if (dst_device >= static_cast<int64_t>(ordinals_.size()) ||
      src_device >= static_cast<int64_t>(ordinals_.size()))
    return Status::Internal(std::string("coarse_jax: ") + what +
                            ": the stream has no ordinal for a mesh device");
  // A proxy in host memory has no GPU: its pinned, mapped storage (worker k
  // copying proxy k's optimizer store into its snapshot) shares the GPUs'
  // address space (UVA), and the driver infers the direction.
  if (IsHostOrdinal(ordinals_[dst_device]) || IsHostOrdinal(ordinals_[src_device]))
    return Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), what);
  return Check(cudaMemcpyPeerAsync(dst, static_cast<int>(ordinals_[dst_device]), src,
                                   static_cast<int>(ordinals_[src_device]), bytes, stream_),
               what);
}

Status CudaStream::CopyRows(void* dst, int64_t dst_device, size_t dst_pitch, const void* src,
                            int64_t src_device, size_t src_pitch, size_t row_bytes, int64_t rows,
                            const char* what) {
  if (rows <= 0 || row_bytes == 0) return Status::Success();
  const size_t height = static_cast<size_t>(rows);
  if (dst_device == src_device)
    return Check(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, height,
                                   cudaMemcpyDeviceToDevice, stream_),
                 what);
  if (dst_device >= static_cast<int64_t>(ordinals_.size()) ||
      src_device >= static_cast<int64_t>(ordinals_.size()))
    return Status::Internal(std::string("coarse_jax: ") + what +
                            ": the stream has no ordinal for a mesh device");
  // Host memory is mapped (UVA), as in Copy: the driver infers the direction.
  if (IsHostOrdinal(ordinals_[dst_device]) || IsHostOrdinal(ordinals_[src_device]))
    return Check(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, height,
                                   cudaMemcpyDefault, stream_),
                 what);
  // Between two GPUs: a 2D copy as a 3D peer copy of depth 1.
  cudaMemcpy3DPeerParms parms{};
  parms.srcPtr = make_cudaPitchedPtr(const_cast<void*>(src), src_pitch, row_bytes, height);
  parms.srcDevice = static_cast<int>(ordinals_[src_device]);
  parms.dstPtr = make_cudaPitchedPtr(dst, dst_pitch, row_bytes, height);
  parms.dstDevice = static_cast<int>(ordinals_[dst_device]);
  parms.extent = make_cudaExtent(row_bytes, height, 1);
  return Check(cudaMemcpy3DPeerAsync(&parms, stream_), what);
}

Status CudaStream::Upload(void* dst, const void* src, size_t bytes, const char* what) {
  return Check(UploadAsync(ordinal_, dst, src, bytes, stream_), what);
}

Status CudaStream::Download(void* dst, const void* src, size_t bytes, const char* what) {
  return Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), what);
}

Status CudaStream::Record(StreamEvent event) {
  return Check(cudaEventRecord(static_cast<cudaEvent_t>(event), stream_),
               "recording this device's event");
}

Status CudaStream::Wait(StreamEvent event, int64_t device) {
  const std::string gpu = device < static_cast<int64_t>(ordinals_.size())
                              ? "GPU " + std::to_string(ordinals_[device])
                              : "mesh device " + std::to_string(device);
  return Check(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(event), 0),
               "waiting for " + gpu + "'s event");
}

Status CudaStream::Synchronize(const char* what) {
  return Check(cudaStreamSynchronize(stream_), what);
}

Status CudaStream::UploadPinned(void* dst, const void* src, size_t bytes, const char* what) {
  return Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), what);
}

Status CudaStream::HostWait(StreamEvent event, std::chrono::milliseconds timeout,
                            const std::string& what) {
  auto ev = static_cast<cudaEvent_t>(event);
  if (ev == nullptr) return Status::Success();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::chrono::microseconds nap(1);
  for (;;) {
    const cudaError_t err = cudaEventQuery(ev);  // cudaSuccess if never recorded
    if (err == cudaSuccess) return Status::Success();
    if (err != cudaErrorNotReady) return Check(err, what);
    if (std::chrono::steady_clock::now() >= deadline)
      return Status::Internal(what + ": timed out after " + std::to_string(timeout.count()) +
                              " ms waiting on the host for a GPU's event");
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(50));
  }
}

namespace {

using WaitValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

// The driver's cuStreamWaitValue32, looked up once; null (with `why`) if
// this driver has none.
WaitValue32Fn TheWaitValue32(std::string* why) {
  static std::once_flag once;
  static WaitValue32Fn fn = nullptr;
  static std::string error;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    cudaError_t err = cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &p, 12000,
                                                       cudaEnableDefault, &status);
#else
    cudaError_t err = cudaGetDriverEntryPoint("cuStreamWaitValue32", &p, cudaEnableDefault, &status);
#endif
    if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || p == nullptr) {
      cudaGetLastError();
      error =
          "the driver has no cuStreamWaitValue32 (" + std::string(cudaGetErrorString(err)) + ")";
      return;
    }
    fn = reinterpret_cast<WaitValue32Fn>(p);
  });
  if (fn == nullptr) *why = error;
  return fn;
}

}  // namespace

Status CudaStream::WaitValue(const uint32_t* flag, uint32_t value, std::chrono::milliseconds,
                             const std::string& what) {
  std::string why;
  WaitValue32Fn wait = TheWaitValue32(&why);
  if (wait == nullptr) return Status::Internal(what + ": " + why);
  void* device_flag = nullptr;
  Status e = Check(cudaHostGetDevicePointer(&device_flag, const_cast<uint32_t*>(flag), 0),
                   what + ": the flag's device address");
  if (e.failure()) return e;
  const CUresult r =
      wait(reinterpret_cast<CUstream>(stream_), reinterpret_cast<CUdeviceptr>(device_flag), value,
           CU_STREAM_WAIT_VALUE_GEQ);
  if (r != CUDA_SUCCESS)
    return Status::Internal(what + ": cuStreamWaitValue32 failed (CUresult " +
                            std::to_string(static_cast<int>(r)) + ")");
  return Status::Success();
}

}  // namespace coarse::cuda
