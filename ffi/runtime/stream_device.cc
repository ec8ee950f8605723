// StreamDevice (see stream_device.h): each Device operation as stream work.
// Moved from the CUDA backend, whose orchestration it was; what changed is
// only that it speaks the stream API instead of CUDA.
#include "runtime/stream_device.h"

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/element_math.h"
#include "runtime/stream_ops.h"
#include "runtime/traffic.h"

namespace coarse {

namespace {
constexpr int64_t kF32 = sizeof(float);
}  // namespace

StagingSizes StagingSizesOf(const Plan& plan) {
  int64_t max_piece = 0, max_segs = 0;
  for (int64_t s = 0; s < plan.num_pieces(); ++s) {
    max_piece = std::max(max_piece, plan.piece_nelems[s]);
    max_segs = std::max(max_segs, plan.piece_seg_begin[s + 1] - plan.piece_seg_begin[s]);
  }
  const int64_t leading_leaves =
      static_cast<int64_t>(plan.leaf_nelems.size()) - plan.num_proxy_leaves;
  // Pieces to or from a peer's memory are staged side by side, so a call's
  // pieces through a peer take one pack or unpack (StreamDevice::Stage): room
  // for all of them, up to kMergeFloats (past it, one launch per that many).
  int64_t all_pieces = 0;
  for (int64_t s = 0; s < plan.num_pieces(); ++s) all_pieces += plan.piece_nelems[s];
  StagingSizes out;
  out.staging_len =
      std::max<int64_t>({max_piece, plan.leading_nelems, std::min(all_pieces, kMergeFloats), 1});
  // A merged pack or unpack (StreamDevice::Queue) holds every segment of a
  // call: at most all of the plan's.
  const int64_t all_segs = static_cast<int64_t>(plan.segments.size());
  out.max_runs = std::max<int64_t>({max_segs, all_segs, leading_leaves, 1});
  return out;
}

namespace {

// `run` as a span at its buf_off (begin unset).
void SpanOf(const LeafRun& run, kernels::Span* span) {
  *span = kernels::Span{};
  span->leaf = run.leaf;
  span->len = run.len;
  span->buf_off = run.buf_off;
  span->leaf_dtype = run.dtype;
}

}  // namespace

Status SpansOf(const LeafRun* runs, int64_t num_runs, std::vector<kernels::Span>* spans,
               int64_t* total) {
  spans->resize(num_runs);
  for (int64_t r = 0; r < num_runs; ++r) SpanOf(runs[r], &(*spans)[r]);
  *total = kernels::SetBegins(spans->data(), num_runs);
  return Status::Success();
}

StreamDevice::StreamDevice(std::unique_ptr<Stream> stream, int64_t self, StreamResources& resources,
                           std::unique_ptr<Stream> copies, std::unique_ptr<Stream> ups)
    : stream_(Counted(std::move(stream), resources)),
      holds_(!stream_->DoneWhenEnqueued()),
      self_(self),
      res_(resources) {
  if (copies != nullptr) marks_ = resources.copy_marks(self);
  if (marks_ != nullptr) copies_ = Counted(std::move(copies), resources);
  if (marks_ != nullptr && ups != nullptr) ups_ = Counted(std::move(ups), resources);
}

void StreamDevice::BeginCall() {
  queued_.kind = Queued::Kind::kNone;
  queued_.spans.clear();
  queued_.at.clear();
  outbound_.clear();
  inbound_.clear();
  staged_ = 0;
  acquired_.Forget();
  dirty_ = true;
  marked_ = false;
  ups_started_ = false;
  staged_down_ = staged_up_ = false;
  ups_unjoined_ = false;
}

Stream* StreamDevice::Enqueue() {
  dirty_ = true;
  marked_ = false;
  return stream_.get();
}

Status StreamDevice::QueueRuns(Queued::Kind kind, const LeafRun* runs, int64_t num_runs, float* buf,
                               int64_t buf_len, int64_t lo) {
  if (num_runs > res_.max_runs())
    return Status::Internal("coarse_jax: " + std::to_string(num_runs) +
                            " runs exceed the span table (" + std::to_string(res_.max_runs()) +
                            ")");
  // (Nothing held: nothing to flush; staging claimed for these runs stays claimed.)
  const bool other = queued_.kind != Queued::Kind::kNone && queued_.kind != kind;
  if (other || static_cast<int64_t>(queued_.spans.size()) + num_runs > res_.max_runs()) {
    Status e = Flush();
    if (e.failure()) return e;
  }
  queued_.kind = kind;
  for (int64_t r = 0; r < num_runs; ++r) {
    const int64_t off = runs[r].buf_off - lo;
    if (off < 0 || off + runs[r].len > buf_len)
      return Status::Internal("coarse_jax: a run falls outside its buffer");
    kernels::Span span;  // its buf_off set by Flush, from `at`
    SpanOf(runs[r], &span);
    queued_.spans.push_back(span);
    queued_.at.push_back(buf + off);
  }
  return holds_ ? Status::Success() : Flush();
}

Status StreamDevice::Table(const kernels::Span* spans, int64_t num, const kernels::Span** table) {
  // A stream whose work is done when enqueued reads the table where it is,
  // in host memory. Else a table a slot already holds is launched on as it
  // is (SpanTables); another is uploaded into the least recently used slot,
  // behind every launch that read it in stream order.
  *table = spans;
  if (!holds_) return Status::Success();
  SpanTables& tables = res_.span_tables(self_);
  int slot = tables.Find(spans, num);
  Status e;
  if (slot < 0) {
    slot = tables.Claim(spans, num);
    e = Enqueue()->Upload(res_.spans(self_) + slot * res_.max_runs(), spans,
                          num * sizeof(kernels::Span), "uploading a span table");
    if (e.failure()) tables.Forget(slot);
    CountStreamOp(StreamOp::kTableUploads);
  }
  *table = res_.spans(self_) + slot * res_.max_runs();
  return e;
}

Status StreamDevice::Flush() {
  const Queued::Kind kind = queued_.kind;
  if (kind == Queued::Kind::kNone) return Status::Success();
  // What is held may read what the copy-up stream copied.
  if (Status e = JoinUps(); e.failure()) return e;
  queued_.kind = Queued::Kind::kNone;
  // Whatever is held is enqueued below: staging written after it comes later
  // in stream order, so all of it is free again.
  staged_ = 0;
  if (kind == Queued::Kind::kOptimizer)
    return queued_.rows == 1
               ? Enqueue()->Optimizer(queued_.o, queued_.b, queued_.n)
               : Enqueue()->OptimizerRows(queued_.o, queued_.b, queued_.n, queued_.rows,
                                          queued_.grad_pitch, queued_.buf_pitch);
  // One span table for every run held: offsets from the lowest address, so
  // runs into several pieces (of one arena, or of the staging buffer) share
  // one launch.
  std::vector<kernels::Span>& spans = queued_.spans;
  float* base = *std::min_element(queued_.at.begin(), queued_.at.end());
  for (size_t r = 0; r < spans.size(); ++r) spans[r].buf_off = queued_.at[r] - base;
  const int64_t num = static_cast<int64_t>(spans.size());
  const int64_t total = kernels::SetBegins(spans.data(), num);
  const kernels::Span* table = nullptr;
  Status e = Table(spans.data(), num, &table);
  // A pull's copies into staging, before the unpack that reads them.
  if (e.success() && kind == Queued::Kind::kUnpack)
    e = IssueCopies(inbound_, "pull: peer copy from the proxy");
  inbound_.clear();
  if (e.success())
    e = kind == Queued::Kind::kPack ? Enqueue()->Pack(table, num, total, base)
                                    : Enqueue()->Unpack(base, table, num, total);
  spans.clear();
  queued_.at.clear();
  // The pack's copies out of staging, one per range contiguous at both ends
  // (a push's pieces to one proxy lie side by side in its arena at p = 1),
  // or per run of rows at fixed pitches (IssueCopies).
  // (Neither CopyDown nor Transfer flushes, so nothing is added meanwhile.)
  if (e.success()) e = IssueCopies(outbound_, "push: peer copy to the proxy");
  outbound_.clear();
  return e;
}

Status StreamDevice::IssueCopies(const std::vector<Outbound>& out, const char* what) {
  auto src_of = [&](const Outbound& o) { return o.src_device < 0 ? self_ : o.src_device; };
  auto same_ends = [&](const Outbound& a, const Outbound& b) {
    return a.dst_device == b.dst_device && src_of(a) == src_of(b);
  };
  for (size_t i = 0; i < out.size();) {
    Outbound o = out[i++];
    const int64_t src_device = src_of(o);
    if (copies_ != nullptr && res_.in_host_memory(o.dst_device)) {
      while (i < out.size() && same_ends(out[i], o) && out[i].dst == o.dst + o.n &&
             out[i].src == o.src + o.n)
        o.n += out[i++].n;
      if (Status e = CopyDown(o); e.failure()) return e;
      continue;
    }
    // Between devices: ranges contiguous at both ends in one copy, else rows of
    // equal length at fixed pitches at both ends (a k:1 proxy's slots of
    // consecutive pieces are k pieces apart; a pull's pieces of a group lie a
    // piece's slots apart at the proxy) in one copy too (Stream::CopyRows).
    if (i < out.size() && same_ends(out[i], o) && out[i].dst == o.dst + o.n &&
        out[i].src == o.src + o.n) {
      while (i < out.size() && same_ends(out[i], o) && out[i].dst == o.dst + o.n &&
             out[i].src == o.src + o.n)
        o.n += out[i++].n;
    } else if (i < out.size() && same_ends(out[i], o) && out[i].n == o.n &&
               !res_.in_host_memory(o.dst_device) && !res_.in_host_memory(src_device)) {
      const int64_t dst_pitch = out[i].dst - o.dst, src_pitch = out[i].src - o.src;
      int64_t rows = 1;
      while (dst_pitch >= o.n && src_pitch >= o.n && i < out.size() && same_ends(out[i], o) &&
             out[i].n == o.n && out[i].dst == o.dst + rows * dst_pitch &&
             out[i].src == o.src + rows * src_pitch) {
        ++rows;
        ++i;
      }
      if (rows > 1) {
        Status e = Enqueue()->CopyRows(o.dst, o.dst_device, dst_pitch * kF32, o.src, src_device,
                                       src_pitch * kF32, o.n * kF32, rows, what);
        if (e.failure()) return e;
        continue;
      }
    }
    if (Status e = Transfer(o.dst, o.dst_device, o.src, src_device, o.n, what); e.failure())
      return e;
  }
  return Status::Success();
}

StatusOr<float*> StreamDevice::Stage(Queued::Kind kind, int64_t n, int64_t num_runs) {
  if (n > res_.staging_len())
    return Status::Internal("coarse_jax: a transfer of " + std::to_string(n) +
                            " elements exceeds the staging buffer (" +
                            std::to_string(res_.staging_len()) + ")");
  // Without a copy stream staging is free again once nothing held claims
  // it (stream order); with one, each direction's ring is handed out from
  // its cursor in the storage on (CopyMarks), and taken back only when the
  // cursor wraps: a push's once the copy stream is joined, a pull's once
  // the copy-up stream has waited for this stream (StartUps, at the next
  // copy up), past every unpack that read it.
  const bool up = kind == Queued::Kind::kUnpack;
  int64_t& next = marks_ == nullptr ? staged_ : up ? marks_->up_cursor : marks_->cursor;
  const int64_t len = marks_ == nullptr ? res_.staging_len() : CopyRing(res_.staging_len());
  // The ring's cursor outlives the call (the storage set keeps it): a value
  // outside the ring is state no call of this set left, never a place to write.
  if (next < 0 || next > len)
    return Status::Internal(
        "coarse_jax: stale state in a storage set: worker " + std::to_string(self_) + "'s " +
        (up ? "pulls'" : "pushes'") + " staging ring cursor is " + std::to_string(next) +
        ", outside its ring of " + std::to_string(len) +
        " floats. This is a coarse_jax bug: please report it with the steps the process ran.");
  const bool room =
      next + n <= len && static_cast<int64_t>(queued_.spans.size()) + num_runs <= res_.max_runs();
  if (queued_.kind != kind || !room) {
    Status e = Flush();
    if (e.failure()) return e;
  }
  if (marks_ == nullptr) {
    if (queued_.kind == Queued::Kind::kNone) staged_ = 0;
    float* at = res_.staging(self_) + staged_;
    staged_ += n;
    return at;
  }
  // A call's first transfer this way wraps where less than a call's worth
  // is left, so the call's pieces stay side by side (one launch, one copy).
  bool& begun = up ? staged_up_ : staged_down_;
  const bool wrap = next + n > len || (!begun && next + res_.staging_len() > len);
  begun = true;
  if (wrap) {
    if (up) {
      ups_started_ = false;
    } else if (Status e = JoinCopies(); e.failure()) {
      return e;
    }
    next = 0;
  }
  float* at = (up ? marks_->up_staging : res_.staging(self_)) + next;
  next += n;
  return at;
}

Status StreamDevice::PeerCopy(float* dst, int64_t dst_device, const float* src, int64_t src_device,
                              int64_t n, const char* what) {
  if (n <= 0) return Status::Success();
  Status e = Flush();
  if (e.failure()) return e;
  return Transfer(dst, dst_device, src, src_device, n, what);
}

Status StreamDevice::Transfer(float* dst, int64_t dst_device, const float* src, int64_t src_device,
                              int64_t n, const char* what) {
  if (n <= 0) return Status::Success();
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  if (res_.in_host_memory(dst_device)) return Enqueue()->Download(dst, src, bytes, what);
  if (res_.in_host_memory(src_device)) {
    if (ups_ == nullptr) return Enqueue()->UploadPinned(dst, src, bytes, what);
    Status e = StartUps();
    if (e.success()) e = ups_->UploadPinned(dst, src, bytes, what);
    if (e.success()) ups_unjoined_ = true;
    return e;
  }
  return Enqueue()->Copy(dst, dst_device, src, src_device, bytes, what);
}

Status StreamDevice::Gather(const LeafRun* runs, int64_t num_runs, float* dst, int64_t dst_device,
                            int64_t dst_len) {
  if (num_runs == 0 || dst_len == 0) return Status::Success();
  CountGather(runs, num_runs);
  // Its own memory, or a peer's it addresses (one GPU's, the host's): packed
  // in place, merged with the call's other packs (a push of a bucket is one
  // launch).
  if (Addressable(dst_device)) return QueueRuns(Queued::Kind::kPack, runs, num_runs, dst, dst_len);
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
  if (lo < 0 || hi > dst_len) return Status::Internal("coarse_jax: a run falls outside its buffer");
  if (covered != hi - lo)
    return Status::Internal(
        "coarse_jax: runs gathered into a peer's buffer must tile one range without gaps or "
        "overlaps (got " +
        std::to_string(covered) + " elements over a range of " + std::to_string(hi - lo) + ")");
  // Packed beside the call's other pieces in staging (one launch for them
  // all), copied out once the pack is launched (Flush: Outbound).
  StatusOr<float*> at = Stage(Queued::Kind::kPack, hi - lo, num_runs);
  if (at.has_error()) return at.error();
  Status e = QueueRuns(Queued::Kind::kPack, runs, num_runs, at.value(), hi - lo, lo);
  if (e.success()) outbound_.push_back({dst + lo, dst_device, at.value(), hi - lo});
  return e;
}

Status StreamDevice::Scatter(const float* src, int64_t src_device, int64_t src_len,
                             const LeafRun* runs, int64_t num_runs) {
  if (num_runs == 0 || src_len == 0) return Status::Success();
  CountScatter(runs, num_runs);
  float* from = const_cast<float*>(src);  // read only: an unpack's source
  if (!Addressable(src_device)) {
    // A peer's storage: copied into staging beside the call's other pieces
    // (the held unpack reads none of that room), then unpacked with them.
    StatusOr<float*> at = Stage(Queued::Kind::kUnpack, src_len, num_runs);
    if (at.has_error()) return at.error();
    if (res_.in_host_memory(src_device)) {
      Status e =
          Transfer(at.value(), self_, src, src_device, src_len, "pull: peer copy from the proxy");
      if (e.failure()) return e;
    } else {
      // Another GPU's: copied by the Flush that launches the unpack, with
      // the call's other pieces from there, as rows (IssueCopies). The
      // waits for the proxy (Acquire) are already on the stream.
      inbound_.push_back({at.value(), self_, src, src_len, src_device});
    }
    from = at.value();
  }
  // Merged with the call's other unpacks (a pull is one launch).
  return QueueRuns(Queued::Kind::kUnpack, runs, num_runs, from, src_len);
}

Status StreamDevice::ZeroBytes(void* dst, size_t bytes) {
  if (Status held = Flush(); held.failure()) return held;
  if (bytes == 0) return Status::Success();
  CountTraffic(TrafficOp::kBytes, 0, static_cast<int64_t>(bytes));
  return Enqueue()->Memset(dst, bytes, "zeroing a result");
}

Status StreamDevice::CopyBytes(void* dst, const void* src, size_t bytes) {
  if (Status held = Flush(); held.failure()) return held;
  if (bytes == 0 || dst == src) return Status::Success();
  CountTraffic(TrafficOp::kBytes, static_cast<int64_t>(bytes), static_cast<int64_t>(bytes));
  return Enqueue()->Copy(dst, self_, src, self_, bytes, "copying a pass-through result");
}

Status StreamDevice::CopyToHost(void* host, const void* own, size_t bytes) {
  if (Status held = Flush(); held.failure()) return held;
  if (bytes == 0) return Status::Success();
  CountTraffic(TrafficOp::kBytes, static_cast<int64_t>(bytes), static_cast<int64_t>(bytes));
  return Enqueue()->Download(host, own, bytes, "copying to host memory");
}

Status StreamDevice::CopyFromHost(void* own, const void* host, size_t bytes) {
  if (Status held = Flush(); held.failure()) return held;
  if (bytes == 0) return Status::Success();
  CountTraffic(TrafficOp::kBytes, static_cast<int64_t>(bytes), static_cast<int64_t>(bytes));
  return Enqueue()->Upload(own, host, bytes, "copying from host memory");
}

Status StreamDevice::Publish() {
  Status e = Flush();
  if (e.success()) e = JoinUps();
  if (e.success() && marks_ != nullptr && marks_->unjoined) {
    // The copy stream has work this stream has not waited for: the event
    // is recorded there, after it waits for everything enqueued here.
    e = MarkForCopies();
    if (e.success()) e = copies_->Record(res_.event(self_));
    if (e.success()) {
      res_.published(self_).fetch_add(1, std::memory_order_acq_rel);
      dirty_ = false;
    }
    return e;
  }
  // Nothing enqueued since this device's last record (a wait counts): that
  // record still marks everything, and its count stays.
  if (e.failure() || !dirty_) return e;
  e = stream_->Record(res_.event(self_));
  // After the record: whoever sees the new count (through a counter bumped
  // after this) waits for an event that covers this work.
  if (e.success()) {
    res_.published(self_).fetch_add(1, std::memory_order_acq_rel);
    dirty_ = false;
  }
  return e;
}

Status StreamDevice::Acquire(int64_t device) {
  // A proxy in host memory enqueues nothing (HostProxyDevice): what it
  // wrote is there once its counters or flags say so.
  if (device == self_ || res_.in_host_memory(device)) return Status::Success();
  // Nothing held back is flushed: it may run after the wait. Once per
  // publication (a pull's pieces of one proxy, a proxy's pieces of one push).
  return acquired_.WaitOnce(res_, device,
                            [&] { return Enqueue()->Wait(res_.event(device), device); });
}

}  // namespace coarse
