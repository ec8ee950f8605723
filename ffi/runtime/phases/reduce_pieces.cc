// ReducePieces (coarse_proxy_ring): a proxy reduces every piece with the other proxies.
//
// Pieces are walked in the plan's one global order on every proxy. For each
// piece the proxy waits until all clients routed to it have pushed (one slot
// per client: a proxy is never blocked on one client's queue by another's),
// sums the slots in client order into its accumulator (zeros if nobody routes
// the piece here), then runs the two opposite rings with its peers.
//
// With the proxy optimizer (`update`, phases/update_pieces.cc) a parameter
// piece's ring stops after the reduce-scatter: the proxy turns the chunks it
// owns into new parameters, then the all-gather circulates those. With
// global-norm clipping every parameter piece is reduce-scattered first (the
// norm needs them all), then updated and gathered.
#include <algorithm>
#include <string>
#include <vector>

#include "runtime/phases.h"
#include "runtime/ring.h"
#include "runtime/trace.h"

namespace coarse {
namespace ffi = xla::ffi;

namespace {

std::string ListWorkers(const std::vector<int32_t>& ws) {
  std::string out;
  for (int32_t w : ws) out += (out.empty() ? "" : ", ") + std::to_string(w);
  return out;
}

class PieceReducer {
 public:
  PieceReducer(Call& call, Device& dev, ProxyUpdate* update)
      : call_(call),
        dev_(dev),
        update_(update),
        session_(*call.session),
        plan_(call.plan()),
        p_(plan_.workers),
        k_(call.who.index) {}

  bool updates(int64_t s) const { return update_ && update_->spec->updates_piece(plan_, s); }
  bool copies_from_holder(int64_t s) const {
    return plan_.piece_holder[s] >= 0 && plan_.piece_holder[s] != k_;
  }

  // Waits for the pushes of piece s, sums them and runs the reduce-scatter
  // (DENSE holder: scales the sum). `announce`: let peers read the owned
  // chunks now (no update in between).
  ffi::Error ReduceScatter(int64_t s, bool announce) {
    if (copies_from_holder(s)) return ffi::Error::Success();
    const auto& from = plan_.contributors_of(k_, s);
    const int32_t expected = static_cast<int32_t>(from.size());
    ffi::Error err;
    {
      TraceScope wait(session_, p_ + k_, "wait for pushes", s);
      err = session_.Wait(
          call_.who, Session::Waits::kPush,
          [&] { return session_.arrived(k_, s).load(std::memory_order_acquire) >= expected; },
          [&] {
            return "worker(s) " + ListWorkers(from) + " to push " + plan_.DescribePiece(s) + " (" +
                   std::to_string(session_.arrived(k_, s).load()) + " of " +
                   std::to_string(expected) + " arrived)";
          });
    }
    if (err.failure()) return err;
    for (int32_t w : from) {
      err = dev_.Acquire(w);
      if (err.failure()) return err;
    }
    if (session_.emulated()) {
      // A push is a transfer the worker started: it does not wait for this
      // proxy to be free, only for the link and ports.
      Clock::time_point arrival = Clock::time_point::min();
      for (int32_t w : from) {
        auto t = session_.ReserveInOrder(
            call_.who, w, p_ + k_, plan_.piece_nbytes[s], session_.PushReady(w, s), s,
            plan_.proxy_port_rank[s * p_ + w],
            "the push of worker " + std::to_string(w) + " of " + plan_.DescribePiece(s));
        if (t.has_error()) return t.error();
        arrival = std::max(arrival, t.value());
      }
      session_.AdvanceTo(p_ + k_, arrival);
    }
    const int64_t n = plan_.piece_nelems[s];
    float* own = Own(s);
    {
      TraceScope sum(session_, p_ + k_, "sum pushes", s);
      err = dev_.SumSlots(own, n, static_cast<int64_t>(from.size()));
    }
    if (err.failure()) return err;
    if (plan_.piece_holder[s] == k_) {  // DENSE: every client pushed here, the sum is done
      if (MeanScale(plan_) != 1.0f) err = dev_.Scale(own, n, MeanScale(plan_));
      return err;
    }
    const RingMember m = Member(s);
    TraceScope ring(session_, p_ + k_, "reduce-scatter", s, RingBytes(s));
    return RingReduceScatter(session_, dev_, call_.who, n, MeanScale(plan_), m, What(s), announce);
  }

  // After ReduceScatter: the optimizer on the owned chunks (parameter
  // pieces), then the all-gather (or, for a DENSE piece, the copy from its
  // holder / the holder's announcement).
  ffi::Error Finish(int64_t s, bool update) {
    const int64_t n = plan_.piece_nelems[s];
    if (copies_from_holder(s)) {
      TraceScope copy(session_, p_ + k_, "copy from the holder", s);
      const int32_t holder = plan_.piece_holder[s];
      // Not part of the emulated system: this copy only keeps every device's
      // outputs identical, so it is not charged to any link.
      ffi::Error err = session_.Wait(
          call_.who, Session::Waits::kPeer, [&] { return session_.IsReduced(holder, s); },
          [&] {
            return "proxy " + std::to_string(holder) + " to reduce " + plan_.DescribePiece(s);
          });
      if (err.failure()) return err;
      session_.AdvanceTo(p_ + k_, session_.ReducedAt(holder, s));
      err = dev_.Acquire(p_ + holder);
      if (err.failure()) return err;
      err =
          dev_.CopyFrom(Own(s), session_.arena(holder) + plan_.slot(holder, s, 0), p_ + holder, n);
      if (err.failure()) return err;
      err = dev_.Publish();
      if (err.failure()) return err;
      session_.MarkReduced(k_, s);
      return ffi::Error::Success();
    }
    if (update) {
      TraceScope opt(session_, p_ + k_, "optimizer", s);
      ffi::Error err = ApplyOptimizer(call_, dev_, *update_, s, Own(s));
      if (err.failure()) return err;
    }
    if (plan_.piece_holder[s] == k_) {
      ffi::Error err = dev_.Publish();
      if (err.failure()) return err;
      session_.MarkReduced(k_, s);
    } else {
      const RingMember m = Member(s);
      if (update) {
        ffi::Error err = RingAnnounceOwned(session_, dev_, m);
        if (err.failure()) return err;
      }
      TraceScope ring(session_, p_ + k_, "all-gather", s, RingBytes(s));
      ffi::Error err = RingAllGather(session_, dev_, call_.who, n, m, What(s));
      if (err.failure()) return err;
    }
    for (int32_t w : plan_.contributors_of(k_, s)) session_.Notify(w);  // their pull may wait
    return ffi::Error::Success();
  }

 private:
  float* Own(int64_t s) { return session_.arena(k_) + plan_.slot(k_, s, 0); }

  // Bytes one member receives in one half of a ring all-reduce of piece s
  // (p - 1 chunks of n / p elements, on the wire in the leaves' dtypes).
  int64_t RingBytes(int64_t s) const { return p_ > 1 ? plan_.piece_nbytes[s] * (p_ - 1) / p_ : 0; }

  RingMember Member(int64_t s) {
    RingMember m;
    m.own = Own(s);
    for (int r = 0; r < 2; ++r) {
      const int64_t pred = RingPredecessor(r, k_, p_);
      m.pred[r] = session_.arena(pred) + plan_.slot(pred, s, 0);
      m.progress[r] = &session_.proxy_progress(k_, s, r);
      m.pred_progress[r] = &session_.proxy_progress(pred, s, r);
      m.successor_device[r] = p_ + RingSuccessor(r, k_, p_);
      m.position[r] = RingPosition(r, k_, p_);
      m.pred_device[r] = p_ + pred;
      m.step_times[r] = session_.proxy_step_times(k_, s, r);
      m.pred_step_times[r] = session_.proxy_step_times(pred, s, r);
    }
    m.self_device = p_ + k_;
    const int64_t n = plan_.piece_nelems[s];
    m.wire_bytes_per_elem = n ? static_cast<double>(plan_.piece_nbytes[s]) / n : 0.0;
    return m;
  }

  std::function<std::string(int, int32_t)> What(int64_t s) {
    return [this, s](int r, int32_t g) {
      return "proxy " + std::to_string(RingPredecessor(r, k_, p_)) + " to finish step " +
             std::to_string(g + 1) + "/" + std::to_string(RingSteps(p_)) + " of ring " +
             std::to_string(r) + " for " + plan_.DescribePiece(s);
    };
  }

  Call& call_;
  Device& dev_;
  ProxyUpdate* update_;
  Session& session_;
  const Plan& plan_;
  const int64_t p_, k_;
};

}  // namespace

ffi::Error ReducePieces(Call& call, Device& dev, ProxyUpdate* update) {
  TraceScope all(*call.session, call.device(), "proxy ring");
  PieceReducer r(call, dev, update);
  const Plan& plan = call.plan();
  if (update) {
    TraceScope begin(*call.session, call.device(), "optimizer setup");
    ffi::Error err = BeginUpdate(call, dev, *update);
    if (err.failure()) return err;
  }
  const bool clip = update && update->spec->clip_norm > 0;
  for (int64_t s = 0; s < plan.num_pieces(); ++s) {
    const bool upd = r.updates(s);
    ffi::Error err = r.ReduceScatter(s, !upd);
    if (err.failure()) return err;
    if (clip && upd) continue;  // finished below, once the global norm is known
    err = r.Finish(s, upd);
    if (err.failure()) return err;
  }
  if (clip) {
    ffi::Error err;
    {
      TraceScope norm(*call.session, call.device(), "global norm");
      err = ClipByGlobalNorm(call, dev, *update);
    }
    if (err.failure()) return err;
    for (int64_t s = 0; s < plan.num_pieces(); ++s) {
      if (!r.updates(s)) continue;
      err = r.Finish(s, true);
      if (err.failure()) return err;
    }
  }
  if (update) update->store->MarkApplied();
  return ffi::Error::Success();
}

}  // namespace coarse
