// The stream API (runtime/stream.h) on the host, done when enqueued: the
// default CPU platform. Every call runs its work on the caller's thread
// before it returns (host_kernels.h, the CPU backend's loops), so events
// mark nothing still to do, stream waits and syncs are free, and the
// host's clock times the work (Stream::DoneWhenEnqueued: emulated links).
// A WaitValue waits on the caller's thread, at most its timeout, and fails
// there. All devices share one address space: a peer copy is a memcpy.
// The stream-semantics backend (COARSE_JAX_BACKEND=streams) runs the same
// kernels on threaded streams instead (host_stream.h).
#pragma once

#include "runtime/stream.h"

namespace coarse {

class InlineHostStream final : public Stream {
 public:
  xla::ffi::Error Pack(const kernels::Span* spans, int64_t num_spans, int64_t total,
                       float* buf) override;
  xla::ffi::Error Unpack(const float* buf, const kernels::Span* spans, int64_t num_spans,
                         int64_t total) override;
  xla::ffi::Error Reduce(const float* const* inputs, int num_inputs, float* out, int64_t n,
                         float scale) override;
  xla::ffi::Error Optimizer(const OptScalars& o, const OptBuffers& b, int64_t n) override;
  xla::ffi::Error SumSquares(const float* x, int64_t n, double* partial, double* out) override;
  xla::ffi::Error FirstMismatch(const float* master, kernels::DType dtype, const void* given,
                                kernels::DType given_dtype, int64_t n, unsigned long long base,
                                unsigned long long* first) override;
  xla::ffi::Error Memset(void* dst, size_t bytes, const char* what) override;
  xla::ffi::Error Copy(void* dst, int64_t dst_device, const void* src, int64_t src_device,
                       size_t bytes, const char* what) override;
  xla::ffi::Error Upload(void* dst, const void* src, size_t bytes, const char* what) override;
  xla::ffi::Error Download(void* dst, const void* src, size_t bytes, const char* what) override;
  xla::ffi::Error UploadPinned(void* dst, const void* src, size_t bytes, const char* what) override;
  // Nothing is left to mark or wait for: the work is done.
  xla::ffi::Error Record(StreamEvent) override { return xla::ffi::Error::Success(); }
  xla::ffi::Error Wait(StreamEvent, int64_t) override { return xla::ffi::Error::Success(); }
  xla::ffi::Error Synchronize(const char*) override { return xla::ffi::Error::Success(); }
  xla::ffi::Error HostWait(StreamEvent, std::chrono::milliseconds, const std::string&) override {
    return xla::ffi::Error::Success();
  }
  xla::ffi::Error WaitValue(const uint32_t* flag, uint32_t value, std::chrono::milliseconds timeout,
                            const std::string& what) override;
  bool DoneWhenEnqueued() const override { return true; }
};

}  // namespace coarse
