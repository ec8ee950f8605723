// coarse_push: a worker hands one bucket of gradient leaves to the proxies.
//
// Called from inside the backward pass as soon as the bucket's gradients
// exist. For every piece of the bucket it widens the values into the slot the
// routed proxy keeps for this client (the transfer), then bumps that proxy's
// arrival counter for the piece and wakes it. It never waits for anyone, so
// pushes cannot deadlock whatever order XLA runs them in. Still, the Python
// side chains them by a token (each push takes the previous one's) so they
// are issued in the plan's order, the order every proxy walks: left to XLA,
// independent pushes run in any order and a proxy idles on a piece whose
// push was issued late. Outputs: the leaves themselves, aliased (attribute
// passthrough=1, for backward hooks), then the token.
#include <cstring>

#include "call.h"

namespace coarse {
namespace ffi = xla::ffi;

static ffi::Error PushImpl(ffi::RunId run_id, ffi::AnyBuffer who, ffi::AnyBuffer after,
                           ffi::RemainingArgs leaves, ffi::RemainingRets outs,
                           ffi::Dictionary attrs) {
  (void)after;  // orders this push after the previous one
  auto begun = BeginCall(run_id, who, attrs);
  if (begun.has_error()) return begun.error();
  Call call = std::move(begun.value());
  const Plan& plan = call.plan();
  auto status = [&]() -> ffi::Error {
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
      if (out->untyped_data() != in.value().untyped_data())
        std::memcpy(out->untyped_data(), in.value().untyped_data(), in.value().size_bytes());
    }
    ffi::Result<ffi::AnyBuffer> token = outs.get<ffi::AnyBuffer>(outs.size() - 1).value();
    std::memset(token->untyped_data(), 0, token->size_bytes());
    if (call.who.tier != kWorker) return ffi::Error::Success();  // proxies push nothing
    const int64_t i = call.who.index;
    if (TakeDroppedPush(i)) return ffi::Error::Success();  // testing: a lost push
    Session& session = *call.session;
    for (int64_t s = first_piece.value(); s < first_piece.value() + num_pieces.value(); ++s) {
      const int64_t k = plan.dest(s, i);
      const auto& from = plan.contributors_of(k, s);
      int64_t j = 0;
      while (from[j] != i) ++j;
      float* slot = session.arena(k) + plan.slot(k, s, j);
      for (int64_t g = plan.piece_seg_begin[s]; g < plan.piece_seg_begin[s + 1]; ++g) {
        const Segment& seg = plan.segments[g];
        ffi::AnyBuffer leaf = leaves.get<ffi::AnyBuffer>(seg.leaf - first_leaf.value()).value();
        cpu::WidenToF32(leaf.element_type(),
                        ElementPtr(leaf.untyped_data(), leaf.element_type(), seg.leaf_off),
                        slot + seg.piece_off, seg.len);
      }
      // The copy above is the transfer; on an emulated link the proxy books
      // it when it takes the piece (the push itself never waits).
      session.NotePushReady(i, s, Clock::now());
      session.arrived(k, s).fetch_add(1, std::memory_order_acq_rel);
      session.Notify(plan.workers + k);
    }
    return ffi::Error::Success();
  }();
  return EndCall(call, std::move(status), attrs);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(Push, PushImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::RunId>()       // rendezvous key: one execution
                                  .Arg<ffi::AnyBuffer>()   // int32[2] (tier, data index)
                                  .Arg<ffi::AnyBuffer>()   // token of the previous push (ordering)
                                  .RemainingArgs()         // the bucket's gradient leaves
                                  .RemainingRets()         // [the same leaves, aliased,] token
                                  .Attrs<ffi::Dictionary>());  // plan + bucket range, passthrough

}  // namespace coarse
