#include "runtime/stream_ops.h"

#include <array>

namespace coarse {

namespace {

constexpr int kKinds = static_cast<int>(StreamOp::kCount);
std::array<std::atomic<int64_t>, kKinds> g_counts{};
constexpr std::array<const char*, kKinds> kNames = {
    "launches",     "copies_d2d", "copies_peer", "copies_d2h",   "copies_h2d",
    "bytes_d2d",    "bytes_peer", "bytes_d2h",   "bytes_h2d",    "records",
    "stream_waits", "host_waits", "host_syncs",  "table_uploads"};

void Add(StreamOp op, int64_t n = 1) {
  g_counts[static_cast<int>(op)].fetch_add(n, std::memory_order_relaxed);
}

class CountingStream final : public Stream {
 public:
  CountingStream(std::unique_ptr<Stream> inner, StreamResources& res)
      : inner_(std::move(inner)), res_(res) {}

  bool DoneWhenEnqueued() const override { return inner_->DoneWhenEnqueued(); }
  Status Pack(const kernels::Span* spans, int64_t num_spans, int64_t total, float* buf) override {
    Add(StreamOp::kLaunches);
    return inner_->Pack(spans, num_spans, total, buf);
  }
  Status Unpack(const float* buf, const kernels::Span* spans, int64_t num_spans,
                int64_t total) override {
    Add(StreamOp::kLaunches);
    return inner_->Unpack(buf, spans, num_spans, total);
  }
  Status Reduce(const float* const* inputs, int num_inputs, float* out, int64_t n,
                float scale) override {
    Add(StreamOp::kLaunches);
    return inner_->Reduce(inputs, num_inputs, out, n, scale);
  }
  Status ReduceRows(const float* const* inputs, int num_inputs, float* out, int64_t n, float scale,
                    const RowPitches& rows) override {
    Add(StreamOp::kLaunches);
    return inner_->ReduceRows(inputs, num_inputs, out, n, scale, rows);
  }
  Status Optimizer(const OptScalars& o, const OptBuffers& b, int64_t n) override {
    Add(StreamOp::kLaunches);
    return inner_->Optimizer(o, b, n);
  }
  Status OptimizerRows(const OptScalars& o, const OptBuffers& b, int64_t n, int64_t rows,
                       int64_t grad_pitch, int64_t buf_pitch) override {
    Add(StreamOp::kLaunches);
    return inner_->OptimizerRows(o, b, n, rows, grad_pitch, buf_pitch);
  }
  Status SumSquares(const float* x, int64_t n, double* partial, double* out) override {
    Add(StreamOp::kLaunches);
    return inner_->SumSquares(x, n, partial, out);
  }
  Status SumSquaresSpans(const kernels::Span* spans, int64_t num_spans, int64_t total,
                         double* partial, double* out, bool accumulate) override {
    Add(StreamOp::kLaunches);
    return inner_->SumSquaresSpans(spans, num_spans, total, partial, out, accumulate);
  }
  Status ClipScalars(const double* parts, int64_t num, float clip_norm, float* out) override {
    Add(StreamOp::kLaunches);
    return inner_->ClipScalars(parts, num, clip_norm, out);
  }
  Status FirstMismatch(const float* master, kernels::DType dtype, const void* given,
                       kernels::DType given_dtype, int64_t n, unsigned long long base,
                       unsigned long long* first) override {
    Add(StreamOp::kLaunches);
    return inner_->FirstMismatch(master, dtype, given, given_dtype, n, base, first);
  }
  Status Memset(void* dst, size_t bytes, const char* what) override {
    Add(StreamOp::kLaunches);
    return inner_->Memset(dst, bytes, what);
  }
  Status Copy(void* dst, int64_t dst_device, const void* src, int64_t src_device, size_t bytes,
              const char* what) override {
    CountCopy(dst_device, src_device, static_cast<int64_t>(bytes));
    return inner_->Copy(dst, dst_device, src, src_device, bytes, what);
  }
  // One copy of `n` bytes between mesh devices, by direction.
  void CountCopy(int64_t dst_device, int64_t src_device, int64_t n) {
    if (res_.in_host_memory(dst_device)) {
      Add(StreamOp::kCopiesD2H);
      Add(StreamOp::kBytesD2H, n);
    } else if (res_.in_host_memory(src_device)) {
      Add(StreamOp::kCopiesH2D);
      Add(StreamOp::kBytesH2D, n);
    } else if (dst_device == src_device) {
      Add(StreamOp::kCopiesD2D);
      Add(StreamOp::kBytesD2D, n);
    } else {
      Add(StreamOp::kCopiesPeer);
      Add(StreamOp::kBytesPeer, n);
    }
  }
  Status CopyRows(void* dst, int64_t dst_device, size_t dst_pitch, const void* src,
                  int64_t src_device, size_t src_pitch, size_t row_bytes, int64_t rows,
                  const char* what) override {
    CountCopy(dst_device, src_device, static_cast<int64_t>(row_bytes) * rows);
    return inner_->CopyRows(dst, dst_device, dst_pitch, src, src_device, src_pitch, row_bytes, rows,
                            what);
  }
  Status Upload(void* dst, const void* src, size_t bytes, const char* what) override {
    Add(StreamOp::kCopiesH2D);
    Add(StreamOp::kBytesH2D, static_cast<int64_t>(bytes));
    return inner_->Upload(dst, src, bytes, what);
  }
  Status Download(void* dst, const void* src, size_t bytes, const char* what) override {
    Add(StreamOp::kCopiesD2H);
    Add(StreamOp::kBytesD2H, static_cast<int64_t>(bytes));
    return inner_->Download(dst, src, bytes, what);
  }
  Status UploadPinned(void* dst, const void* src, size_t bytes, const char* what) override {
    Add(StreamOp::kCopiesH2D);
    Add(StreamOp::kBytesH2D, static_cast<int64_t>(bytes));
    return inner_->UploadPinned(dst, src, bytes, what);
  }
  Status Record(StreamEvent event) override {
    Add(StreamOp::kRecords);
    return inner_->Record(event);
  }
  Status Wait(StreamEvent event, int64_t device) override {
    Add(StreamOp::kStreamWaits);
    return inner_->Wait(event, device);
  }
  Status Synchronize(const char* what) override {
    Add(StreamOp::kHostSyncs);
    return inner_->Synchronize(what);
  }
  Status HostWait(StreamEvent event, std::chrono::milliseconds timeout,
                  const std::string& what) override {
    Add(StreamOp::kHostWaits);
    return inner_->HostWait(event, timeout, what);
  }
  Status WaitValue(const uint32_t* flag, uint32_t value, std::chrono::milliseconds timeout,
                   const std::string& what) override {
    Add(StreamOp::kStreamWaits);
    return inner_->WaitValue(flag, value, timeout, what);
  }

 private:
  std::unique_ptr<Stream> inner_;
  StreamResources& res_;
};

}  // namespace

std::vector<std::pair<std::string, int64_t>> StreamOpCounts() {
  std::vector<std::pair<std::string, int64_t>> out;
  out.reserve(kKinds);
  for (int i = 0; i < kKinds; ++i)
    out.emplace_back(kNames[i], g_counts[i].load(std::memory_order_relaxed));
  return out;
}

void CountStreamOp(StreamOp op) { Add(op); }

void ResetStreamOps() {
  for (auto& c : g_counts) c.store(0, std::memory_order_relaxed);
}

std::unique_ptr<Stream> Counted(std::unique_ptr<Stream> stream, StreamResources& resources) {
  return std::make_unique<CountingStream>(std::move(stream), resources);
}

}  // namespace coarse
