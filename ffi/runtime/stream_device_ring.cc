// StreamDevice's sums and ring steps (see stream_device.h): SumSlots,
// AddFrom, CopyFrom and Scale as stream work. With Rows (device.h) a
// group of pieces' chunks, spread at fixed pitches, is one copy and one
// launch (Stream::CopyRows, Stream::ReduceRows): the proxies' ring steps a
// group at once (runtime/ring.h), not piece by piece.
#include <cstdint>

#include "runtime/stream_device.h"
#include "runtime/traffic.h"

namespace coarse {

namespace {
constexpr int64_t kF32 = sizeof(float);
}  // namespace

Status SumSlotsOn(Stream& stream, float* own, int64_t n, int64_t slots, float scale,
                  const Rows& rows) {
  // One slot, unscaled: the sum is already there.
  if (n == 0 || rows.count <= 0 || (slots == 1 && scale == 1.0f)) return Status::Success();
  const int64_t elems = n * rows.count;  // counted as the rows' passes would be one by one
  if (slots <= 1) CountSumSlots(elems, slots, scale);
  if (slots == 0) {
    for (int64_t i = 0; i < rows.count; ++i)
      if (Status e = stream.Memset(own + i * rows.own_pitch, n * sizeof(float), "zeroing a slot");
          e.failure())
        return e;
    return Status::Success();
  }
  RowPitches pitches;
  pitches.count = rows.count;
  pitches.out = rows.own_pitch;
  for (int64_t& p : pitches.in) p = rows.own_pitch;
  // Slot order: ((s0 + s1) + s2) + ..., in launches of up to 8 inputs; the
  // last launch scales.
  for (int64_t j = 1; j < slots || slots == 1;) {
    const float* in[kernels::kMaxReduceInputs] = {own};
    int count = 1;
    for (; count < kernels::kMaxReduceInputs && j < slots; ++count, ++j) in[count] = own + j * n;
    if (count > 1) CountSumSlots(elems, count, 1.0f);  // one pass over `count` slots
    const float s = j >= slots ? scale : 1.0f;
    Status e = rows.count == 1 ? stream.Reduce(in, count, own, n, s)
                               : stream.ReduceRows(in, count, own, n, s, pitches);
    if (e.failure() || j >= slots) return e;
  }
  return Status::Success();
}

Status StreamDevice::SumSlots(float* own, int64_t n, int64_t slots, float scale, const Rows& rows) {
  // (Nothing to enqueue: nothing held back need go first.)
  if (n == 0 || (slots == 1 && scale == 1.0f)) return Status::Success();
  if (Status held = Flush(); held.failure()) return held;
  return SumSlotsOn(*Enqueue(), own, n, slots, scale, rows);
}

Status StreamDevice::AddFrom(float* own, const float* peer, int64_t peer_device, int64_t n,
                             float scale, const Rows& rows) {
  if (Status held = Flush(); held.failure()) return held;
  if (n == 0 || rows.count <= 0) return Status::Success();
  CountTraffic(TrafficOp::kRingStep, 2 * n * rows.count * kF32, n * rows.count * kF32);
  if (rows.count > 1) {
    // A group's chunks: received side by side in staging by one copy, then
    // added by one launch (or read where they are, as below).
    RowPitches pitches;
    pitches.count = rows.count;
    pitches.out = rows.own_pitch;
    pitches.in[0] = rows.own_pitch;
    const float* in[2] = {own, peer};
    pitches.in[1] = rows.peer_pitch;
    if (!Addressable(peer_device)) {
      if (n * rows.count > res_.staging_len())
        return Status::Internal("coarse_jax: a ring group's chunks exceed the staging buffer");
      float* recv = res_.staging(self_);
      Status e = JoinCopies();  // staging is written next
      if (e.success())
        e = Enqueue()->CopyRows(recv, self_, n * kF32, peer, peer_device, rows.peer_pitch * kF32,
                                n * kF32, rows.count, "ring: peer copy of a group's chunks");
      if (e.failure()) return e;
      in[1] = recv;
      pitches.in[1] = n;
    }
    return Enqueue()->ReduceRows(in, 2, own, n, scale, pitches);
  }
  // A peer's memory this device's kernels address (one GPU's, the host's)
  // is read where it is; any other's is copied into staging first.
  const float* x = peer;
  if (!Addressable(peer_device)) {
    // Received at the accumulator's own 16-byte offset, so the reduce kernel
    // peels the same head from both and runs the rest vectorized.
    const int64_t shift = (reinterpret_cast<uintptr_t>(own) / sizeof(float)) % 4;
    if (n + shift > res_.staging_len() + 4)
      return Status::Internal("coarse_jax: a ring chunk exceeds the staging buffer");
    float* recv = res_.staging(self_) + shift;
    Status e = JoinCopies();  // staging is written next
    if (e.success()) e = PeerCopy(recv, self_, peer, peer_device, n, "ring: peer copy");
    if (e.failure()) return e;
    x = recv;
  }
  const float* in[2] = {own, x};
  return Enqueue()->Reduce(in, 2, own, n, scale);
}

Status StreamDevice::CopyFrom(float* own, const float* peer, int64_t peer_device, int64_t n,
                              const Rows& rows) {
  if (Status held = Flush(); held.failure()) return held;
  // Not PeerCopy: besides the workers' ring, worker k copies proxy k's store
  // into its snapshot (ParamStore::CopySnapshot), both in the proxy's memory,
  // with `own` not this device's: for a proxy in host memory a host-to-host
  // copy on this stream (on CUDA with UVA, as host memory is mapped).
  if (n <= 0 || rows.count <= 0) return Status::Success();
  CountTraffic(TrafficOp::kRingStep, n * rows.count * kF32, n * rows.count * kF32);
  if (rows.count > 1)
    return Enqueue()->CopyRows(own, self_, rows.own_pitch * kF32, peer, peer_device,
                               rows.peer_pitch * kF32, n * kF32, rows.count,
                               "ring: peer copy of a group's chunks");
  return Enqueue()->Copy(own, self_, peer, peer_device, static_cast<size_t>(n) * sizeof(float),
                         "ring: peer copy");
}

Status StreamDevice::Scale(float* x, int64_t n, float scale) {
  if (Status held = Flush(); held.failure()) return held;
  CountTraffic(TrafficOp::kScale, n * kF32, n * kF32);
  const float* in[1] = {x};
  return Enqueue()->Reduce(in, 1, x, n, scale);
}

}  // namespace coarse
