// InlineHostStream (see inline_stream.h).
#include "host/inline_stream.h"

#include <cstring>
#include <string>

#include "host/host_kernels.h"

namespace coarse {

namespace {

class InlineHostStream final : public Stream {
 public:
  Status Pack(const kernels::Span* spans, int64_t num_spans, int64_t, float* buf) override {
    host_kernels::Pack(spans, num_spans, buf);
    return Status::Success();
  }

  Status Unpack(const float* buf, const kernels::Span* spans, int64_t num_spans, int64_t) override {
    host_kernels::Unpack(buf, spans, num_spans);
    return Status::Success();
  }

  Status Reduce(const float* const* inputs, int num_inputs, float* out, int64_t n,
                float scale) override {
    if (Status e = host_kernels::CheckReduceInputs(num_inputs); e.failure()) return e;
    host_kernels::Reduce(inputs, num_inputs, out, n, scale);
    return Status::Success();
  }

  Status ReduceRows(const float* const* inputs, int num_inputs, float* out, int64_t n, float scale,
                    const RowPitches& rows) override {
    if (Status e = host_kernels::CheckReduceInputs(num_inputs); e.failure()) return e;
    host_kernels::ReduceRows(inputs, num_inputs, out, n, scale, rows);
    return Status::Success();
  }

  Status Optimizer(const OptScalars& o, const OptBuffers& b, int64_t n) override {
    host_kernels::Optimizer(o, b, n);
    return Status::Success();
  }

  Status OptimizerRows(const OptScalars& o, const OptBuffers& b, int64_t n, int64_t rows,
                       int64_t grad_pitch, int64_t buf_pitch) override {
    for (int64_t i = 0; i < rows; ++i)
      host_kernels::Optimizer(o, OptRow(b, i, grad_pitch, buf_pitch), n);
    return Status::Success();
  }

  Status SumSquares(const float* x, int64_t n, double*, double* out) override {
    host_kernels::SumSquares(x, n, out);
    return Status::Success();
  }

  Status SumSquaresSpans(const kernels::Span* spans, int64_t num_spans, int64_t, double*,
                         double* out, bool accumulate) override {
    host_kernels::SumSquaresSpans(spans, num_spans, out, accumulate);
    return Status::Success();
  }

  Status ClipScalars(const double* parts, int64_t num, float clip_norm, float* out) override {
    ClipScalarsOf(parts, num, clip_norm, out);
    return Status::Success();
  }

  Status FirstMismatch(const float* master, kernels::DType dtype, const void* given,
                       kernels::DType given_dtype, int64_t n, unsigned long long base,
                       unsigned long long* first) override {
    host_kernels::FirstMismatch(master, dtype, given, given_dtype, n, base, first);
    return Status::Success();
  }

  Status Memset(void* dst, size_t bytes, const char*) override {
    std::memset(dst, 0, bytes);
    return Status::Success();
  }

  Status Copy(void* dst, int64_t, const void* src, int64_t, size_t bytes, const char*) override {
    if (dst != src) std::memcpy(dst, src, bytes);
    return Status::Success();
  }

  Status CopyRows(void* dst, int64_t, size_t dst_pitch, const void* src, int64_t, size_t src_pitch,
                  size_t row_bytes, int64_t rows, const char*) override {
    host_kernels::CopyRows(dst, dst_pitch, src, src_pitch, row_bytes, rows);
    return Status::Success();
  }

  Status Upload(void* dst, const void* src, size_t bytes, const char* what) override {
    return Copy(dst, 0, src, 0, bytes, what);
  }

  Status Download(void* dst, const void* src, size_t bytes, const char* what) override {
    return Copy(dst, 0, src, 0, bytes, what);
  }

  Status UploadPinned(void* dst, const void* src, size_t bytes, const char* what) override {
    return Copy(dst, 0, src, 0, bytes, what);
  }

  Status WaitValue(const uint32_t* flag, uint32_t value, std::chrono::milliseconds timeout,
                   const std::string& what) override {
    uint32_t now = 0;
    if (!host_kernels::PollFlag(flag, value, std::chrono::steady_clock::now() + timeout, &now))
      return Status::Internal(what + ": timed out after " + std::to_string(timeout.count()) +
                              " ms waiting for its flag to reach " + std::to_string(value) +
                              " (it holds " + std::to_string(now) + ")");
    return Status::Success();
  }

  // Nothing is left to mark or wait for: the work is done.
  Status Record(StreamEvent) override { return Status::Success(); }
  Status Wait(StreamEvent, int64_t) override { return Status::Success(); }
  Status Synchronize(const char*) override { return Status::Success(); }
  Status HostWait(StreamEvent, std::chrono::milliseconds, const std::string&) override {
    return Status::Success();
  }
  bool DoneWhenEnqueued() const override { return true; }
};

}  // namespace

std::unique_ptr<Stream> MakeInlineHostStream() { return std::make_unique<InlineHostStream>(); }

}  // namespace coarse
