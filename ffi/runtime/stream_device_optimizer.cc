// StreamDevice::ApplyOptimizer (see stream_device.h): the proxy optimizer's
// updates as stream work, consecutive ones merged into one launch (a
// proxy's segments, its pieces, a ring group's owned chunks as rows).
#include "runtime/stream_device.h"
#include "runtime/traffic.h"

namespace coarse {

namespace {

bool SameScalars(const OptScalars& a, const OptScalars& b) {
  return a.kind == b.kind && a.nesterov == b.nesterov && a.decay == b.decay && a.clip == b.clip &&
         a.lr == b.lr && a.bc1 == b.bc1 && a.bc2 == b.bc2 && a.b1 == b.b1 &&
         a.one_minus_b1 == b.one_minus_b1 && a.b2 == b.b2 && a.one_minus_b2 == b.one_minus_b2 &&
         a.eps == b.eps && a.weight_decay == b.weight_decay && a.momentum == b.momentum &&
         a.norm == b.norm && a.clip_norm == b.clip_norm && a.step == b.step &&
         a.clip_at == b.clip_at;
}

// Whether `b` continues `a` (n elements) in every buffer the update touches.
bool Continues(const OptBuffers& a, int64_t n, const OptBuffers& b, int32_t slots) {
  bool yes = b.grad_io == a.grad_io + n && b.w_in == a.w_in + n && b.w_out == a.w_out + n;
  for (int32_t j = 0; j < slots && yes; ++j)
    yes = b.s_in[j] == a.s_in[j] + n && b.s_out[j] == a.s_out[j] + n;
  return yes;
}

// Whether `b` is row i of rows starting at `a`, the gradient `gp` floats on
// per row, the store's buffers `bp` (a ring group's owned chunks).
bool IsRow(const OptBuffers& a, int64_t i, int64_t gp, int64_t bp, const OptBuffers& b,
           int32_t slots) {
  bool yes =
      b.grad_io == a.grad_io + i * gp && b.w_in == a.w_in + i * bp && b.w_out == a.w_out + i * bp;
  for (int32_t j = 0; j < slots && yes; ++j)
    yes = b.s_in[j] == a.s_in[j] + i * bp && b.s_out[j] == a.s_out[j] + i * bp;
  return yes;
}

}  // namespace

Status StreamDevice::ApplyOptimizer(const OptScalars& o, const OptBuffers& b, int64_t n) {
  if (n <= 0) return Status::Success();
  CountOptimizer(o, n);
  // Consecutive updates of consecutive elements with the same scalars (a
  // proxy's segments, its pieces) are one launch: the same arithmetic per
  // element. So are updates of equal length at fixed pitches (a ring
  // group's owned chunks of one half, one per piece: OptimizerRows).
  const int32_t slots = OptSlots(o.kind, o.momentum);
  if (queued_.kind == Queued::Kind::kOptimizer && SameScalars(queued_.o, o)) {
    if (queued_.rows == 1 && Continues(queued_.b, queued_.n, b, slots)) {
      queued_.n += n;
      return Status::Success();
    }
    if (n == queued_.n) {
      const int64_t gp = queued_.rows > 1 ? queued_.grad_pitch : b.grad_io - queued_.b.grad_io;
      const int64_t bp = queued_.rows > 1 ? queued_.buf_pitch : b.w_in - queued_.b.w_in;
      if (gp >= n && bp >= n && IsRow(queued_.b, queued_.rows, gp, bp, b, slots)) {
        queued_.grad_pitch = gp;
        queued_.buf_pitch = bp;
        ++queued_.rows;
        return Status::Success();
      }
    }
  }
  Status e = Flush();
  if (e.failure()) return e;
  queued_.kind = Queued::Kind::kOptimizer;
  queued_.o = o;
  queued_.b = b;
  queued_.n = n;
  queued_.rows = 1;
  return holds_ ? Status::Success() : Flush();
}

}  // namespace coarse
