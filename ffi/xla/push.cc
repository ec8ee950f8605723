// coarse_push's XLA translation: checks the bucket's leaves against the plan,
// copies them to the aliased outputs (attribute passthrough=1, for backward
// hooks) unless XLA aliased them, zeroes the token result unless it aliases
// the previous token, and runs
// PushPieces (runtime/phases/push_pieces.cc) over the bucket. Operands:
// the bucket's leaves; results: [the same leaves,] then the token; attributes
// first_leaf, first_piece, num_pieces, passthrough (PushAttrs, xla/sync_ops.h)
// besides every call's.
#include <string>

#include "runtime/phases.h"
#include "runtime/wakeups.h"
#include "xla/sync_ops.h"

namespace coarse {
namespace ffi = xla::ffi;

ffi::Error PushBody(Call& call, Device& dev, const void* after, ffi::RemainingArgs leaves,
                    ffi::RemainingRets outs, const PushAttrs& bucket, bool push_in_place) {
  const Plan& plan = call.plan();
  const bool passthrough = bucket.passthrough;
  // The bucket must lie inside the plan: its leaves among the proxy leaves,
  // its pieces among the plan's, and every segment of its pieces in one of
  // its leaves (PushPieces reads them through the operands).
  const int64_t nleaves = static_cast<int64_t>(leaves.size());
  const int64_t fl = bucket.first_leaf, fp = bucket.first_piece, np = bucket.num_pieces;
  if (fl < 0 || fl > plan.num_proxy_leaves - nleaves)
    return ffi::Error::InvalidArgument("coarse_push: attribute first_leaf=" + std::to_string(fl) +
                                       " with " + std::to_string(nleaves) +
                                       " leaves is outside the plan's " +
                                       std::to_string(plan.num_proxy_leaves) + " proxy leaves");
  if (fp < 0 || np < 0 || fp > plan.num_pieces() - np)
    return ffi::Error::InvalidArgument("coarse_push: attributes first_piece=" + std::to_string(fp) +
                                       ", num_pieces=" + std::to_string(np) +
                                       " are outside the plan's " +
                                       std::to_string(plan.num_pieces()) + " pieces");
  for (int64_t g = plan.piece_seg_begin[fp]; g < plan.piece_seg_begin[fp + np]; ++g)
    if (plan.segments[g].leaf < fl || plan.segments[g].leaf >= fl + nleaves)
      return ffi::Error::InvalidArgument(
          "coarse_push: piece " + std::to_string(plan.segments[g].piece) + " holds leaf " +
          std::to_string(plan.segments[g].leaf) + ", which is not among the bucket's leaves [" +
          std::to_string(fl) + ", " + std::to_string(fl + nleaves) +
          ") (attributes first_leaf, first_piece, num_pieces)");
  for (size_t a = 0; a < leaves.size(); ++a) {
    auto in = leaves.get<ffi::AnyBuffer>(a);
    if (in.has_error()) return in.error();
    ffi::Error e = ToXlaError(CheckLeaf(plan, fl + a, AsDType(in.value().element_type()),
                                        in.value().element_count(), "coarse_push"));
    if (e.failure()) return e;
    if (!passthrough) continue;
    // Aliased to the input; copied only if XLA did not alias.
    ffi::Result<ffi::AnyBuffer> out = outs.get<ffi::AnyBuffer>(a).value();
    e = ToXlaError(
        dev.CopyBytes(out->untyped_data(), in.value().untyped_data(), in.value().size_bytes()));
    if (e.failure()) return e;
  }
  // Nothing of the sync ran on any worker before this push (no
  // coarse_begin): its proxies' jobs could not be ready for it.
  if (call.started_proxies) CountWakeup(Wakeup::kJobQueuedAtPush, call.session->q());
  // The token result aliases the previous token (coarse_jax/_ffi/calls.py),
  // which coarse_begin zeroed: a memset only where XLA did not alias.
  ffi::Result<ffi::AnyBuffer> token = outs.get<ffi::AnyBuffer>(outs.size() - 1).value();
  if (token->untyped_data() != after) {
    ffi::Error e = ToXlaError(dev.ZeroBytes(token->untyped_data(), token->size_bytes()));
    if (e.failure()) return e;
  }
  return ToXlaError(PushPieces(
      call, dev, fp, np,
      [&](int64_t leaf) {
        ffi::AnyBuffer b = leaves.get<ffi::AnyBuffer>(leaf - fl).value();
        return LeafRef{b.untyped_data(), *AsDType(b.element_type())};  // checked above
      },
      push_in_place));
}

}  // namespace coarse
