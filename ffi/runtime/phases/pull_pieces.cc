// PullPieces (coarse_pull): every device writes the reduced proxy-synced leaves.
//
// A worker waits, piece by piece in global order, until the proxy it routed
// the piece to has finished both rings for it, then narrows the f32 sum into
// its output leaves (the ring already applied the 1/p scale), reassembling
// shards and unbatching small tensors in the same pass (on CUDA: a peer copy
// of the piece, then one unpack kernel). A proxy does the same from its own
// storage. Same code, same f32 input: both tiers end bitwise equal.
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/phases.h"
#include "runtime/trace.h"

namespace coarse {
namespace ffi = xla::ffi;

ffi::Error PullPieces(Call& call, Device& dev, const LeafResolver& leaf_of) {
  const Plan& plan = call.plan();
  Session& session = *call.session;
  const int64_t p = plan.workers, me = call.who.index;
  std::vector<LeafRun> runs;
  TraceScope all(session, call.device(), "pull");
  for (int64_t s = 0; s < plan.num_pieces(); ++s) {
    TraceScope piece(session, call.device(), "pull piece", s,
                     call.who.tier == kWorker ? plan.piece_nbytes[s] : 0);
    const int64_t k = call.who.tier == kWorker ? plan.dest(s, me) : me;
    ffi::Error err;
    {
      TraceScope wait(session, call.device(), "wait for the reduced piece", s);
      err = session.Wait(
          call.who, Session::Waits::kPeer, [&] { return session.IsReduced(k, s); },
          [&] { return "proxy " + std::to_string(k) + " to reduce " + plan.DescribePiece(s); });
    }
    if (err.failure()) return err;
    err = dev.Acquire(p + k);
    if (err.failure()) return err;
    // A proxy reads its own storage: no transfer. A worker's pull is booked
    // from the moment the piece was reduced, not from when the worker got
    // here: pulls are pipelined like pushes (the link and the ports still
    // serialize them). The copy below happens inside the transfer window.
    const int64_t self = call.who.device(p);
    const Clock::time_point reduced = session.ReducedAt(k, s);
    Clock::time_point arrival = reduced;
    if (call.who.tier == kWorker && session.emulated()) {
      auto t = session.ReserveInOrder(call.who, p + k, me, plan.piece_nbytes[s], reduced,
                                      plan.proxy_port_rank[s * p + me], s,
                                      "the pull of " + plan.DescribePiece(s));
      if (t.has_error()) return t.error();
      arrival = t.value();
    }
    runs.clear();
    for (int64_t g = plan.piece_seg_begin[s]; g < plan.piece_seg_begin[s + 1]; ++g) {
      const Segment& seg = plan.segments[g];
      const LeafRef out = leaf_of(seg.leaf);
      runs.push_back(LeafRun{ElementPtr(out.data, out.dtype, seg.leaf_off), out.dtype, seg.len,
                             seg.piece_off});
    }
    // Already scaled by the ring.
    err = dev.Scatter(session.arena(k) + plan.slot(k, s, 0), p + k, plan.piece_nelems[s],
                      runs.data(), static_cast<int64_t>(runs.size()));
    if (err.failure()) return err;
    session.AdvanceTo(self, arrival);
  }
  return ffi::Error::Success();
}

}  // namespace coarse
