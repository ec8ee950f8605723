// coarse_push: a worker hands one bucket of gradient leaves to the proxies.
//
// Called from inside the backward pass as soon as the bucket's gradients
// exist. For every piece of the bucket it widens the values into the slot the
// routed proxy keeps for this client (the transfer: a loop on CPU, a pack
// kernel plus a peer copy on CUDA), publishes it, then bumps that proxy's
// arrival counter for the piece and wakes it. It never waits for anyone, so
// pushes cannot deadlock whatever order XLA runs them in. Still, the Python
// side chains them by a token (each push takes the previous one's) so they
// are issued in the plan's order, the order every proxy walks: left to XLA,
// independent pushes run in any order and a proxy idles on a piece whose
// push was issued late. Outputs: the leaves themselves, aliased (attribute
// passthrough=1, for backward hooks), then the token.
#include <vector>

#include "call.h"

namespace coarse {
namespace ffi = xla::ffi;

ffi::Error PushPieces(Call& call, Device& dev, int64_t first_piece, int64_t num_pieces,
                      const LeafResolver& leaf_of) {
  const Plan& plan = call.plan();
  const int64_t i = call.who.index;
  if (TakeDroppedPush(i)) return ffi::Error::Success();  // testing: a lost push
  Session& session = *call.session;
  std::vector<LeafRun> runs;
  for (int64_t s = first_piece; s < first_piece + num_pieces; ++s) {
    const int64_t k = plan.dest(s, i);
    const auto& from = plan.contributors_of(k, s);
    int64_t j = 0;
    while (from[j] != i) ++j;
    runs.clear();
    for (int64_t g = plan.piece_seg_begin[s]; g < plan.piece_seg_begin[s + 1]; ++g) {
      const Segment& seg = plan.segments[g];
      const LeafRef leaf = leaf_of(seg.leaf);
      runs.push_back(LeafRun{ElementPtr(leaf.data, leaf.dtype, seg.leaf_off), leaf.dtype, seg.len,
                             seg.piece_off});
    }
    ffi::Error e = dev.Gather(runs.data(), static_cast<int64_t>(runs.size()),
                              session.arena(k) + plan.slot(k, s, j), plan.workers + k,
                              plan.piece_nelems[s]);
    if (e.failure()) return e;
    e = dev.Publish();
    if (e.failure()) return e;
    // The gather above is the transfer; on an emulated link the proxy books
    // it when it takes the piece (the push itself never waits).
    session.NotePushReady(i, s);
    session.arrived(k, s).fetch_add(1, std::memory_order_acq_rel);
    session.Notify(plan.workers + k);
  }
  return ffi::Error::Success();
}

ffi::Error PushBody(Call& call, Device& dev, ffi::RemainingArgs leaves, ffi::RemainingRets outs,
                    const ffi::Dictionary& attrs) {
  const Plan& plan = call.plan();
  auto first_leaf = attrs.get<int64_t>("first_leaf");
  auto first_piece = attrs.get<int64_t>("first_piece");
  auto num_pieces = attrs.get<int64_t>("num_pieces");
  if (first_leaf.has_error() || first_piece.has_error() || num_pieces.has_error())
    return ffi::Error::InvalidArgument("coarse_push: missing bucket attributes");
  auto passthrough_attr = attrs.get<int64_t>("passthrough");
  if (passthrough_attr.has_error()) return passthrough_attr.error();
  const bool passthrough = passthrough_attr.value() != 0;
  if (outs.size() != (passthrough ? leaves.size() : 0) + 1)
    return ffi::Error::InvalidArgument(
        "coarse_push: expected the leaves (passthrough) and then one token as results");
  for (size_t a = 0; a < leaves.size(); ++a) {
    auto in = leaves.get<ffi::AnyBuffer>(a);
    if (in.has_error()) return in.error();
    ffi::Error e = CheckLeaf(plan, first_leaf.value() + a, in.value().element_type(),
                             in.value().element_count(), "coarse_push");
    if (e.failure()) return e;
    if (!passthrough) continue;
    // Aliased to the input; copied only if XLA did not alias.
    ffi::Result<ffi::AnyBuffer> out = outs.get<ffi::AnyBuffer>(a).value();
    e = dev.CopyBytes(out->untyped_data(), in.value().untyped_data(), in.value().size_bytes());
    if (e.failure()) return e;
  }
  ffi::Result<ffi::AnyBuffer> token = outs.get<ffi::AnyBuffer>(outs.size() - 1).value();
  ffi::Error e = dev.ZeroBytes(token->untyped_data(), token->size_bytes());
  if (e.failure()) return e;
  if (call.who.tier != kWorker) return ffi::Error::Success();  // proxies push nothing
  return PushPieces(call, dev, first_piece.value(), num_pieces.value(), [&](int64_t leaf) {
    ffi::AnyBuffer b = leaves.get<ffi::AnyBuffer>(leaf - first_leaf.value()).value();
    return LeafRef{b.untyped_data(), b.element_type()};
  });
}

}  // namespace coarse
