// The CPU device backend: every operation is a loop (or memcpy) over one
// address space, finished when it returns, so Publish/Acquire do nothing.
// (Sums that read peers' buffers in place are the session's shared-memory
// strategy, cpu/shared_memory_sums.h, not this device's.)
#pragma once

#include "runtime/device.h"

namespace coarse {

class CpuDevice final : public Device {
 public:
  xla::ffi::Error Gather(const LeafRun* runs, int64_t num_runs, float* dst, int64_t dst_device,
                         int64_t dst_len) override;
  xla::ffi::Error Scatter(const float* src, int64_t src_device, int64_t src_len,
                          const LeafRun* runs, int64_t num_runs) override;
  xla::ffi::Error SumSlots(float* own, int64_t n, int64_t slots, float scale) override;
  xla::ffi::Error AddFrom(float* own, const float* peer, int64_t peer_device, int64_t n,
                          float scale) override;
  xla::ffi::Error CopyFrom(float* own, const float* peer, int64_t peer_device, int64_t n) override;
  xla::ffi::Error Scale(float* x, int64_t n, float scale) override;
  xla::ffi::Error ApplyOptimizer(const OptScalars& o, const OptBuffers& b, int64_t n) override;
  xla::ffi::ErrorOr<double> SumSquares(const float* x, int64_t n) override;
  xla::ffi::ErrorOr<Mismatch> FirstMismatch(const float* master, const LeafRun* runs,
                                            int64_t num_runs, float* scratch,
                                            int64_t scratch_device, int64_t scratch_len) override;
  xla::ffi::Error ZeroBytes(void* dst, size_t bytes) override;
  xla::ffi::Error CopyBytes(void* dst, const void* src, size_t bytes) override;
  xla::ffi::Error CopyToHost(void* host, const void* own, size_t bytes) override;
  xla::ffi::Error CopyFromHost(void* own, const void* host, size_t bytes) override;
  xla::ffi::Error Publish() override { return xla::ffi::Error::Success(); }
  xla::ffi::Error Acquire(int64_t) override { return xla::ffi::Error::Success(); }
  xla::ffi::Error WaitFlag(const uint32_t* flag, uint32_t value, std::chrono::milliseconds timeout,
                           const std::string& what) override;
  xla::ffi::Error SynchronizeHost(const char*) override { return xla::ffi::Error::Success(); }
  bool SupportsEmulation() const override { return true; }
};

}  // namespace coarse
