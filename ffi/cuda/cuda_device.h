// The CUDA device backend: every operation is enqueued on XLA's stream of the
// calling GPU. Another GPU's storage is reached with cudaMemcpyPeerAsync
// (through this GPU's staging buffer where a kernel must read or write it),
// so nothing needs peer access enabled; Publish records this device's event,
// Acquire makes the stream wait for a peer's. No call blocks the host on GPU
// work.
#pragma once

#include <cuda_runtime.h>

#include "cuda/cuda_storage.h"
#include "runtime/device.h"

namespace coarse::cuda {

class CudaDevice final : public Device {
 public:
  // `self`: the caller's mesh device index (worker i -> i, proxy k -> p + k).
  CudaDevice(cudaStream_t stream, int64_t self, CudaStorage& storage);

  xla::ffi::Error Gather(const LeafRun* runs, int64_t num_runs, float* dst, int64_t dst_device,
                         int64_t dst_len) override;
  xla::ffi::Error Scatter(const float* src, int64_t src_device, int64_t src_len,
                          const LeafRun* runs, int64_t num_runs) override;
  xla::ffi::Error SumSlots(float* own, int64_t n, int64_t slots) override;
  xla::ffi::Error AddFrom(float* own, const float* peer, int64_t peer_device, int64_t n,
                          float scale) override;
  xla::ffi::Error CopyFrom(float* own, const float* peer, int64_t peer_device, int64_t n) override;
  xla::ffi::Error SumPushesInRingOrder(float* dst, int64_t lo, int64_t hi,
                                       const std::vector<std::vector<const PushedRuns*>>& groups,
                                       float scale) override;
  xla::ffi::Error SumInRingOrder(float* dst, const float* const* srcs, int64_t num, int64_t n,
                                 float scale) override;
  xla::ffi::Error Scale(float* x, int64_t n, float scale) override;
  xla::ffi::Error ApplyOptimizer(const OptScalars& o, const OptBuffers& b, int64_t n) override;
  xla::ffi::ErrorOr<double> SumSquares(const float* x, int64_t n) override;
  xla::ffi::ErrorOr<Mismatch> FirstMismatch(const float* master, const float* given, int64_t n,
                                            xla::ffi::DataType dtype) override;
  xla::ffi::Error ZeroBytes(void* dst, size_t bytes) override;
  xla::ffi::Error CopyBytes(void* dst, const void* src, size_t bytes) override;
  xla::ffi::Error Publish() override;
  xla::ffi::Error Acquire(int64_t device) override;
  bool SupportsEmulation() const override { return false; }
  bool ReadsPeersInPlace() const override { return false; }

 private:
  // Uploads `runs` as kernel spans into this device's span table.
  xla::ffi::Error UploadRuns(const LeafRun* runs, int64_t num_runs, int64_t buf_len,
                             int64_t* total);
  // cudaMemcpyPeerAsync of n floats from `src` on mesh device `src_device`.
  xla::ffi::Error PeerCopy(float* dst, int64_t dst_device, const float* src, int64_t src_device,
                           int64_t n, const char* what);

  cudaStream_t stream_;
  int64_t self_;
  CudaStorage& st_;
};

}  // namespace coarse::cuda
