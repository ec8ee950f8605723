// StreamDevice (see stream_device.h): each Device operation as stream work.
// Moved from the CUDA backend, whose orchestration it was; what changed is
// only that it speaks the stream API instead of CUDA.
#include "runtime/stream_device.h"

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/element_math.h"
#include "runtime/stream_ops.h"

namespace coarse {
namespace ffi = xla::ffi;

StagingSizes StagingSizesOf(const Plan& plan) {
  int64_t max_piece = 0, max_segs = 0;
  for (int64_t s = 0; s < plan.num_pieces(); ++s) {
    max_piece = std::max(max_piece, plan.piece_nelems[s]);
    max_segs = std::max(max_segs, plan.piece_seg_begin[s + 1] - plan.piece_seg_begin[s]);
  }
  const int64_t leading_leaves =
      static_cast<int64_t>(plan.leaf_nelems.size()) - plan.num_proxy_leaves;
  StagingSizes out;
  out.staging_len = std::max<int64_t>({max_piece, plan.leading_nelems, 1});
  out.max_runs = std::max<int64_t>({max_segs, leading_leaves, 1});
  return out;
}

bool ToKernelDType(ffi::DataType t, kernels::DType* out) {
  switch (t) {
    case ffi::DataType::F32: *out = kernels::DType::kF32; return true;
    case ffi::DataType::BF16: *out = kernels::DType::kBF16; return true;
    case ffi::DataType::F16: *out = kernels::DType::kF16; return true;
    default: return false;
  }
}

StreamDevice::StreamDevice(std::unique_ptr<Stream> stream, int64_t self, StreamResources& resources)
    : stream_(Counted(std::move(stream), resources)), self_(self), res_(resources) {}

ffi::Error StreamDevice::UploadRuns(const LeafRun* runs, int64_t num_runs, int64_t buf_len,
                                    int64_t* total) {
  if (num_runs > res_.max_runs())
    return ffi::Error::Internal("coarse_jax: " + std::to_string(num_runs) +
                                " runs exceed the span table (" + std::to_string(res_.max_runs()) +
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
  // The span table is reused by the next transfer of this device: stream
  // order keeps this upload behind the kernel that read the previous table.
  return stream_->Upload(res_.spans(self_), spans.data(), num_runs * sizeof(kernels::Span),
                         "uploading a span table");
}

ffi::Error StreamDevice::PeerCopy(float* dst, int64_t dst_device, const float* src,
                                  int64_t src_device, int64_t n, const char* what) {
  if (n <= 0) return ffi::Error::Success();
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  if (res_.in_host_memory(dst_device)) return stream_->Download(dst, src, bytes, what);
  if (res_.in_host_memory(src_device)) return stream_->UploadPinned(dst, src, bytes, what);
  return stream_->Copy(dst, dst_device, src, src_device, bytes, what);
}

ffi::Error StreamDevice::Gather(const LeafRun* runs, int64_t num_runs, float* dst,
                                int64_t dst_device, int64_t dst_len) {
  if (num_runs == 0 || dst_len == 0) return ffi::Error::Success();
  if (dst_device == self_) {
    int64_t total = 0;
    ffi::Error e = UploadRuns(runs, num_runs, dst_len, &total);
    if (e.failure()) return e;
    return stream_->Pack(res_.spans(self_), num_runs, total, dst);
  }
  // A peer's storage: pack here, then one peer copy of what the runs cover,
  // [lo, hi) of `dst`. A push's runs tile a whole piece; worker k seeding
  // proxy k's master (BeginUpdate) gathers one run of a longer buffer, whose
  // other elements must stay as they are: only the window is staged and
  // copied (copying all of dst_len from staging overran the staging buffer).
  int64_t lo = runs[0].buf_off, hi = lo, covered = 0;
  for (int64_t r = 0; r < num_runs; ++r) {
    lo = std::min(lo, runs[r].buf_off);
    hi = std::max(hi, runs[r].buf_off + runs[r].len);
    covered += runs[r].len;
  }
  if (lo < 0 || hi > dst_len)
    return ffi::Error::Internal("coarse_jax: a run falls outside its buffer");
  if (covered != hi - lo)
    return ffi::Error::Internal(
        "coarse_jax: runs gathered into a peer's buffer must tile one range without gaps or "
        "overlaps (got " +
        std::to_string(covered) + " elements over a range of " + std::to_string(hi - lo) + ")");
  if (hi - lo > res_.staging_len())
    return ffi::Error::Internal("coarse_jax: a gather of " + std::to_string(hi - lo) +
                                " elements into a peer exceeds the staging buffer (" +
                                std::to_string(res_.staging_len()) + ")");
  std::vector<LeafRun> shifted(runs, runs + num_runs);
  for (LeafRun& r : shifted) r.buf_off -= lo;
  int64_t total = 0;
  ffi::Error e = UploadRuns(shifted.data(), num_runs, hi - lo, &total);
  if (e.success()) e = stream_->Pack(res_.spans(self_), num_runs, total, res_.staging(self_));
  if (e.failure()) return e;
  return PeerCopy(dst + lo, dst_device, res_.staging(self_), self_, hi - lo,
                  "push: peer copy to the proxy");
}

ffi::Error StreamDevice::Scatter(const float* src, int64_t src_device, int64_t src_len,
                                 const LeafRun* runs, int64_t num_runs) {
  if (num_runs == 0 || src_len == 0) return ffi::Error::Success();
  const float* from = src;
  if (src_device != self_) {  // a peer's storage: one peer copy here, then unpack
    if (src_len > res_.staging_len())
      return ffi::Error::Internal("coarse_jax: a piece exceeds the staging buffer");
    ffi::Error e = PeerCopy(res_.staging(self_), self_, src, src_device, src_len,
                            "pull: peer copy from the proxy");
    if (e.failure()) return e;
    from = res_.staging(self_);
  }
  int64_t total = 0;
  ffi::Error e = UploadRuns(runs, num_runs, src_len, &total);
  if (e.failure()) return e;
  return stream_->Unpack(from, res_.spans(self_), num_runs, total);
}

ffi::Error StreamDevice::SumSlots(float* own, int64_t n, int64_t slots, float scale) {
  if (n == 0) return ffi::Error::Success();
  if (slots == 0) return stream_->Memset(own, n * sizeof(float), "zeroing a slot");
  if (slots == 1) return scale != 1.0f ? Scale(own, n, scale) : ffi::Error::Success();
  // Slot order, as on CPU: ((s0 + s1) + s2) + ..., in launches of up to 8
  // inputs; the last launch scales.
  for (int64_t j = 1; j < slots;) {
    const float* in[kernels::kMaxReduceInputs] = {own};
    int count = 1;
    for (; count < kernels::kMaxReduceInputs && j < slots; ++count, ++j) in[count] = own + j * n;
    ffi::Error e = stream_->Reduce(in, count, own, n, j == slots ? scale : 1.0f);
    if (e.failure()) return e;
  }
  return ffi::Error::Success();
}

ffi::Error StreamDevice::AddFrom(float* own, const float* peer, int64_t peer_device, int64_t n,
                                 float scale) {
  if (n == 0) return ffi::Error::Success();
  const float* x = peer;
  if (peer_device != self_) {
    // Received at the accumulator's own 16-byte offset, so the reduce kernel
    // peels the same head from both and runs the rest vectorized.
    const int64_t shift = (reinterpret_cast<uintptr_t>(own) / sizeof(float)) % 4;
    if (n + shift > res_.staging_len() + 4)
      return ffi::Error::Internal("coarse_jax: a ring chunk exceeds the staging buffer");
    float* recv = res_.staging(self_) + shift;
    ffi::Error e = PeerCopy(recv, self_, peer, peer_device, n, "ring: peer copy");
    if (e.failure()) return e;
    x = recv;
  }
  const float* in[2] = {own, x};
  return stream_->Reduce(in, 2, own, n, scale);
}

ffi::Error StreamDevice::CopyFrom(float* own, const float* peer, int64_t peer_device, int64_t n) {
  // Not PeerCopy: besides the workers' ring, worker k copies proxy k's store
  // into its snapshot (ParamStore::CopySnapshot), both in the proxy's memory,
  // with `own` not this device's: for a proxy in host memory a host-to-host
  // copy on this stream (on CUDA with UVA, as host memory is mapped).
  if (n <= 0) return ffi::Error::Success();
  return stream_->Copy(own, self_, peer, peer_device, static_cast<size_t>(n) * sizeof(float),
                       "ring: peer copy");
}

ffi::Error StreamDevice::SumInRingOrder(float*, const float* const*, int64_t, int64_t, float) {
  // The ring runs here (ReadsPeersInPlace() is false): peers' memory is not this device's.
  return ffi::Error::Internal(
      "coarse_jax: SumInRingOrder reads peers in place; a stream device runs the ring instead");
}

ffi::Error StreamDevice::SumPushesInRingOrder(float*, int64_t, int64_t,
                                              const std::vector<std::vector<const PushedRuns*>>&,
                                              float) {
  // Pushes are copied here (ReadsPeersInPlace() is false).
  return ffi::Error::Internal(
      "coarse_jax: SumPushesInRingOrder reads pushes in place; a stream device copies them");
}

ffi::Error StreamDevice::Scale(float* x, int64_t n, float scale) {
  const float* in[1] = {x};
  return stream_->Reduce(in, 1, x, n, scale);
}

ffi::Error StreamDevice::ZeroBytes(void* dst, size_t bytes) {
  if (bytes == 0) return ffi::Error::Success();
  return stream_->Memset(dst, bytes, "zeroing a result");
}

ffi::Error StreamDevice::CopyBytes(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return ffi::Error::Success();
  return stream_->Copy(dst, self_, src, self_, bytes, "copying a pass-through result");
}

ffi::Error StreamDevice::CopyToHost(void* host, const void* own, size_t bytes) {
  if (bytes == 0) return ffi::Error::Success();
  return stream_->Download(host, own, bytes, "copying to host memory");
}

ffi::Error StreamDevice::CopyFromHost(void* own, const void* host, size_t bytes) {
  if (bytes == 0) return ffi::Error::Success();
  return stream_->Upload(own, host, bytes, "copying from host memory");
}

ffi::Error StreamDevice::Publish() { return stream_->Record(res_.event(self_)); }

ffi::Error StreamDevice::Acquire(int64_t device) {
  // A proxy in host memory enqueues nothing (HostProxyDevice): what it
  // wrote is there once its counters or flags say so.
  if (device == self_ || res_.in_host_memory(device)) return ffi::Error::Success();
  return stream_->Wait(res_.event(device), device);
}

ffi::Error StreamDevice::ApplyOptimizer(const OptScalars& o, const OptBuffers& b, int64_t n) {
  return stream_->Optimizer(o, b, n);
}

// The two below block the host on the stream: they serve global-norm
// clipping and the params check, a few scalars per step on the proxies.
// The scratch is this device's scalars (StreamResources): the stream is in
// order and the host reads the result before it enqueues anything else, so
// one set per device serves every call.
ffi::ErrorOr<double> StreamDevice::SumSquares(const float* x, int64_t n) {
  double* scratch = res_.scalars(self_);
  double out = 0;
  ffi::Error e = stream_->SumSquares(x, n, scratch, scratch + kernels::kSumSquaresBlocks);
  if (e.success())
    e = stream_->Download(&out, scratch + kernels::kSumSquaresBlocks, sizeof out,
                          "copying the sum of squares");
  // The host reads `out` next: wait for the stream to have written it.
  if (e.success()) e = stream_->Synchronize("sum of squares");
  if (e.failure()) return ffi::Unexpected(e);
  return out;
}

ffi::ErrorOr<Mismatch> StreamDevice::FirstMismatch(const float* master, const LeafRun* runs,
                                                   int64_t num_runs, float* scratch,
                                                   int64_t scratch_device, int64_t scratch_len) {
  Mismatch m;
  if (num_runs == 0) return m;
  // Every run widened beside the master (Gather), then compared there; the
  // kernels share one result, the smallest buffer offset of a mismatch, so
  // the host reads it back once for all the runs.
  unsigned long long end = 0;
  for (int64_t r = 0; r < num_runs; ++r)
    end = std::max(end, static_cast<unsigned long long>(runs[r].buf_off + runs[r].len));
  auto* first = reinterpret_cast<unsigned long long*>(res_.scalars(self_) +
                                                      StreamResources::kScalarSlots - 1);
  unsigned long long host = end;
  ffi::Error e = stream_->Upload(first, &host, sizeof host, "params check");
  for (int64_t r = 0; r < num_runs && e.success(); ++r) {
    const LeafRun& run = runs[r];
    kernels::DType t;
    if (!ToKernelDType(run.dtype, &t))
      return ffi::Unexpected(ffi::Error::InvalidArgument("coarse_jax: unsupported params dtype"));
    e = Gather(&run, 1, scratch, scratch_device, scratch_len);
    if (e.success())
      e = stream_->FirstMismatch(master + run.buf_off, scratch + run.buf_off, run.len, t,
                                 static_cast<unsigned long long>(run.buf_off), first);
  }
  if (e.success()) e = stream_->Download(&host, first, sizeof host, "params check");
  // The host reads `host` next.
  if (e.success()) e = stream_->Synchronize("params check");
  if (e.failure()) return ffi::Unexpected(e);
  if (host >= end) return m;
  const int64_t at = static_cast<int64_t>(host);
  for (int64_t r = 0; r < num_runs && m.run < 0; ++r)
    if (runs[r].buf_off <= at && at < runs[r].buf_off + runs[r].len) m.run = r;
  if (m.run < 0)
    return ffi::Unexpected(
        ffi::Error::Internal("coarse_jax: the params check found a mismatch at buffer offset " +
                             std::to_string(at) + ", in none of its runs"));
  const LeafRun& run = runs[m.run];
  m.index = at - run.buf_off;
  kernels::DType t;
  ToKernelDType(run.dtype, &t);
  float values[2] = {0, 0};
  e = stream_->Download(&values[0], scratch + at, sizeof(float), "params check");
  if (e.success()) e = stream_->Download(&values[1], master + at, sizeof(float), "params check");
  if (e.success()) e = stream_->Synchronize("params check");
  if (e.failure()) return ffi::Unexpected(e);
  m.given = values[0];
  m.held = kernels::RoundTrip(values[1], t);  // the master's value as the params' dtype
  return m;
}

}  // namespace coarse
