// StreamDevice's two operations that block the host (see stream_device.h):
// the sum of squares (global-norm clipping, where a testing fault asks for
// it) and the params check, a few scalars per step whose results the host
// reads; and global-norm clipping kept on the device (NormOnDevice).
#include <algorithm>
#include <string>

#include "kernels/element_math.h"
#include "runtime/dtype.h"
#include "runtime/stream_device.h"
#include "runtime/traffic.h"

namespace coarse {

namespace {
constexpr int64_t kF32 = sizeof(float);
}  // namespace

// The two below block the host on the stream: they serve global-norm
// clipping and the params check, a few scalars per step on the proxies.
// The scratch is this device's scalars (StreamResources): the stream is in
// order and the host reads the result before it enqueues anything else, so
// one set per device serves every call.
StatusOr<double> StreamDevice::SumSquares(const float* x, int64_t n) {
  if (Status held = Flush(); held.failure()) return held;
  CountTraffic(TrafficOp::kCheck, n * kF32, 0);
  double* scratch = res_.scalars(self_);
  double out = 0;
  Status e = Enqueue()->SumSquares(x, n, scratch, scratch + kernels::kSumSquaresBlocks);
  if (e.success())
    e = Enqueue()->Download(&out, scratch + kernels::kSumSquaresBlocks, sizeof out,
                            "copying the sum of squares");
  // The host reads `out` next: wait for the stream to have written it.
  if (e.success()) e = Enqueue()->Synchronize("sum of squares");
  if (e.failure()) return e;
  return out;
}

// Global-norm clipping on the device (NormOnDevice): nothing is read back.
// The ranges go to one launch per span table (at most max_runs() runs each,
// the launches after the first adding to the part), a table a resident slot
// holds uploading nothing; the part lives in this device's scalars, where
// the peers copy it from (ClipScalars), and the next session's sum comes
// after this one's readers: it waits for the storage's previous user.
Status StreamDevice::SumSquaresPart(const float* const* xs, const int64_t* ns, int64_t num,
                                    int64_t part) {
  if (part < 0 || part >= StreamResources::kMaxNormParts)
    return Status::InvalidArgument("coarse_jax: global-norm clipping on the device takes at most " +
                                   std::to_string(StreamResources::kMaxNormParts) +
                                   " proxies (this one is proxy " + std::to_string(part) +
                                   "). Fix: fewer proxies, or clip_norm=None");
  if (Status held = Flush(); held.failure()) return held;
  double* scratch = res_.scalars(self_);
  double* out = scratch + StreamResources::kNormPartsSlot + part;
  const int64_t chunk = res_.max_runs();
  int64_t lo = 0;
  do {
    const int64_t hi = std::min(num, lo + chunk);
    norm_spans_.clear();
    for (int64_t r = lo; r < hi; ++r) {
      kernels::Span span{};
      span.leaf = const_cast<float*>(xs[r]);
      span.len = ns[r];
      span.leaf_dtype = kernels::DType::kF32;
      norm_spans_.push_back(span);
      CountTraffic(TrafficOp::kCheck, ns[r] * kF32, 0);
    }
    const int64_t total = kernels::SetBegins(norm_spans_.data(), hi - lo);
    const kernels::Span* table = nullptr;
    Status e = Table(norm_spans_.data(), hi - lo, &table);
    if (e.success())
      e = Enqueue()->SumSquaresSpans(table, hi - lo, total, scratch, out, /*accumulate=*/lo > 0);
    if (e.failure()) return e;
    lo = hi;
  } while (lo < num);
  return Status::Success();
}

StatusOr<const float*> StreamDevice::ClipScalars(int64_t own, const int64_t* devices, int64_t q,
                                                 float clip_norm) {
  if (Status held = Flush(); held.failure()) return held;
  double* parts = res_.scalars(self_) + StreamResources::kNormPartsSlot;
  for (int64_t j = 0; j < q; ++j) {
    if (j == own) continue;
    // A double as two floats: the copy moves its bits.
    const double* theirs = res_.scalars(devices[j]) + StreamResources::kNormPartsSlot + j;
    Status e =
        PeerCopy(reinterpret_cast<float*>(parts + j), self_, reinterpret_cast<const float*>(theirs),
                 devices[j], 2, "copying a proxy's share of the global norm");
    if (e.failure()) return e;
  }
  auto* clip = reinterpret_cast<float*>(res_.scalars(self_) + StreamResources::kClipSlot);
  Status e = Enqueue()->ClipScalars(parts, q, clip_norm, clip);
  if (e.failure()) return e;
  return clip;
}

StatusOr<Mismatch> StreamDevice::FirstMismatch(const float* master, const LeafRun* runs,
                                               int64_t num_runs, float* scratch,
                                               int64_t scratch_device, int64_t scratch_len) {
  Mismatch m;
  if (num_runs == 0) return m;
  // The kernels share one result, the smallest buffer offset of a mismatch,
  // so the host reads it back once for all the runs.
  unsigned long long end = 0;
  for (int64_t r = 0; r < num_runs; ++r)
    end = std::max(end, static_cast<unsigned long long>(runs[r].buf_off + runs[r].len));
  auto* first = reinterpret_cast<unsigned long long*>(res_.scalars(self_) +
                                                      StreamResources::kScalarSlots - 1);
  unsigned long long host = end;
  Status e = Flush();
  if (e.success()) e = Enqueue()->Upload(first, &host, sizeof host, "params check");
  // Where this device's kernels address the master's memory, the params are
  // compared where they are, in their dtype; else each run is widened beside
  // the master first (Gather), then compared there.
  const bool in_place = Addressable(scratch_device);
  if (!in_place) {
    for (int64_t r = 0; r < num_runs && e.success(); ++r)
      e = Gather(&runs[r], 1, scratch, scratch_device, scratch_len);
    if (e.success()) e = Flush();
    // Scratch in host memory (a host proxy's) is written by copies down on
    // the copy stream: the compare below reads it on this one.
    if (e.success()) e = JoinCopies();
  }
  for (int64_t r = 0; r < num_runs && e.success(); ++r) {
    const LeafRun& run = runs[r];
    const DType t = run.dtype;
    e = in_place ? Enqueue()->FirstMismatch(master + run.buf_off, t, run.leaf, t, run.len,
                                            static_cast<unsigned long long>(run.buf_off), first)
                 : Enqueue()->FirstMismatch(master + run.buf_off, t, scratch + run.buf_off,
                                            kernels::DType::kF32, run.len,
                                            static_cast<unsigned long long>(run.buf_off), first);
  }
  if (e.success()) e = Enqueue()->Download(&host, first, sizeof host, "params check");
  // The host reads `host` next.
  if (e.success()) e = Enqueue()->Synchronize("params check");
  if (e.failure()) return e;
  CountCheck(runs, num_runs, host);
  if (host >= end) return m;
  const int64_t at = static_cast<int64_t>(host);
  for (int64_t r = 0; r < num_runs && m.run < 0; ++r)
    if (runs[r].buf_off <= at && at < runs[r].buf_off + runs[r].len) m.run = r;
  if (m.run < 0)
    return Status::Internal("coarse_jax: the params check found a mismatch at buffer offset " +
                            std::to_string(at) + ", in none of its runs");
  const LeafRun& run = runs[m.run];
  m.index = at - run.buf_off;
  const DType t = run.dtype;
  // The params' element (read where it is, in its dtype, or its widened
  // copy) and the master's, read back together.
  float held = 0;
  uint32_t given = 0;  // room for one element of any supported dtype
  const kernels::DType given_dtype = in_place ? t : kernels::DType::kF32;
  const void* given_at =
      in_place ? ElementPtr(run.leaf, run.dtype, m.index) : static_cast<const void*>(scratch + at);
  e = Enqueue()->Download(&held, master + at, sizeof(float), "params check");
  if (e.success())
    e = Enqueue()->Download(&given, given_at, in_place ? ByteWidth(run.dtype) : kF32,
                            "params check");
  if (e.success()) e = Enqueue()->Synchronize("params check");
  if (e.failure()) return e;
  m.given = kernels::WidenAt(&given, given_dtype, 0);
  m.held = kernels::RoundTrip(held, t);  // the master's value as the params' dtype
  return m;
}

}  // namespace coarse
