// coarse_pull: every device writes the reduced proxy-synced leaves.
//
// A worker waits, piece by piece in global order, until the proxy it routed
// the piece to has finished both rings for it, then narrows the f32 sum into
// its output leaves (the ring already applied the 1/p scale), reassembling
// shards and unbatching small tensors in the same pass. A proxy does the same from its
// own storage. Same code, same f32 input: both tiers end bitwise equal.
#include "call.h"

namespace coarse {
namespace ffi = xla::ffi;

static ffi::Error PullImpl(ffi::RunId run_id, ffi::AnyBuffer who, ffi::AnyBuffer token,
                           ffi::RemainingArgs deps, ffi::RemainingRets outs,
                           ffi::Dictionary attrs) {
  (void)token;
  (void)deps;  // outputs alias these; every element is overwritten below
  auto begun = BeginCall(run_id, who, attrs);
  if (begun.has_error()) return begun.error();
  Call call = std::move(begun.value());
  const Plan& plan = call.plan();
  Session& session = *call.session;
  auto status = [&]() -> ffi::Error {
    if (static_cast<int64_t>(outs.size()) != plan.num_proxy_leaves)
      return ffi::Error::InvalidArgument("coarse_pull: expected one result per proxy leaf");
    for (size_t a = 0; a < outs.size(); ++a) {
      auto out = outs.get<ffi::AnyBuffer>(a);
      if (out.has_error()) return out.error();
      ffi::Error e = CheckLeaf(plan, a, out.value()->element_type(),
                               out.value()->element_count(), "coarse_pull");
      if (e.failure()) return e;
    }
    const int64_t p = plan.workers, me = call.who.index;
    for (int64_t s = 0; s < plan.num_pieces(); ++s) {
      const int64_t k = call.who.tier == kWorker ? plan.dest(s, me) : me;
      ffi::Error err = session.Wait(
          call.who, Session::Waits::kPeer,
          [&] { return session.IsReduced(k, s); },
          [&] { return "proxy " + std::to_string(k) + " to reduce " + plan.DescribePiece(s); });
      if (err.failure()) return err;
      // A proxy reads its own storage: no transfer. A worker's copy below
      // happens inside the emulated transfer window.
      const Clock::time_point arrival = call.who.tier == kWorker
                                            ? session.Reserve(p + k, me, plan.piece_nbytes[s])
                                            : Clock::time_point::min();
      const float* sum = session.arena(k) + plan.slot(k, s, 0);  // already scaled by the ring
      for (int64_t g = plan.piece_seg_begin[s]; g < plan.piece_seg_begin[s + 1]; ++g) {
        const Segment& seg = plan.segments[g];
        ffi::Result<ffi::AnyBuffer> out = outs.get<ffi::AnyBuffer>(seg.leaf).value();
        cpu::NarrowFromF32(out->element_type(), sum + seg.piece_off,
                           ElementPtr(out->untyped_data(), out->element_type(), seg.leaf_off),
                           seg.len);
      }
      Session::SleepUntil(arrival);
    }
    return ffi::Error::Success();
  }();
  return EndCall(call, std::move(status), attrs);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(Pull, PullImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::RunId>()       // rendezvous key: one execution
                                  .Arg<ffi::AnyBuffer>()   // int32[2] (tier, data index)
                                  .Arg<ffi::AnyBuffer>()   // token: after proxy/worker ring
                                  .RemainingArgs()         // proxy leaves (aliased to results)
                                  .RemainingRets()         // the reduced proxy leaves
                                  .Attrs<ffi::Dictionary>());  // plan

}  // namespace coarse
