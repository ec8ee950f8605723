// ReducePieces (coarse_proxy_ring): a proxy reduces every piece with the other proxies.
//
// Pieces are walked in the plan's one global order on every proxy. For each
// piece the proxy waits until all clients routed to it have pushed (one slot
// per client: a proxy is never blocked on one client's queue by another's),
// sums the slots in client order into its accumulator (zeros if nobody routes
// the piece here), then runs the two opposite rings with its peers.
#include <algorithm>
#include <string>
#include <vector>

#include "runtime/phases.h"
#include "runtime/ring.h"

namespace coarse {
namespace ffi = xla::ffi;

static std::string ListWorkers(const std::vector<int32_t>& ws) {
  std::string out;
  for (int32_t w : ws) out += (out.empty() ? "" : ", ") + std::to_string(w);
  return out;
}

ffi::Error ReducePieces(Call& call, Device& dev) {
  Session& session = *call.session;
  const Plan& plan = call.plan();
  const int64_t p = plan.workers, k = call.who.index;
  for (int64_t s = 0; s < plan.num_pieces(); ++s) {
    const int32_t holder = plan.piece_holder[s];
    if (holder >= 0 && holder != k) {
      // Not part of the emulated system: this copy only keeps every device's
      // outputs identical, so it is not charged to any link.
      ffi::Error err = session.Wait(
          call.who, Session::Waits::kPeer, [&] { return session.IsReduced(holder, s); },
          [&] {
            return "proxy " + std::to_string(holder) + " to reduce " + plan.DescribePiece(s);
          });
      if (err.failure()) return err;
      session.AdvanceTo(p + k, session.ReducedAt(holder, s));
      err = dev.Acquire(p + holder);
      if (err.failure()) return err;
      err = dev.CopyFrom(session.arena(k) + plan.slot(k, s, 0),
                         session.arena(holder) + plan.slot(holder, s, 0), p + holder,
                         plan.piece_nelems[s]);
      if (err.failure()) return err;
      err = dev.Publish();
      if (err.failure()) return err;
      session.MarkReduced(k, s);
      continue;
    }
    const auto& from = plan.contributors_of(k, s);
    const int32_t expected = static_cast<int32_t>(from.size());
    ffi::Error err = session.Wait(
        call.who, Session::Waits::kPush,
        [&] { return session.arrived(k, s).load(std::memory_order_acquire) >= expected; },
        [&] {
          return "worker(s) " + ListWorkers(from) + " to push " + plan.DescribePiece(s) + " (" +
                 std::to_string(session.arrived(k, s).load()) + " of " + std::to_string(expected) +
                 " arrived)";
        });
    if (err.failure()) return err;
    for (int32_t w : from) {
      err = dev.Acquire(w);
      if (err.failure()) return err;
    }
    if (session.emulated()) {
      // A push is a transfer the worker started: it does not wait for this
      // proxy to be free, only for the link and ports.
      Clock::time_point arrival = Clock::time_point::min();
      for (int32_t w : from) {
        auto t = session.ReserveInOrder(
            call.who, w, p + k, plan.piece_nbytes[s], session.PushReady(w, s), s,
            plan.proxy_port_rank[s * p + w],
            "the push of worker " + std::to_string(w) + " of " + plan.DescribePiece(s));
        if (t.has_error()) return t.error();
        arrival = std::max(arrival, t.value());
      }
      session.AdvanceTo(p + k, arrival);
    }
    const int64_t n = plan.piece_nelems[s];
    float* own = session.arena(k) + plan.slot(k, s, 0);
    err = dev.SumSlots(own, n, static_cast<int64_t>(from.size()));
    if (err.failure()) return err;
    if (plan.piece_holder[s] == k) {  // DENSE: every client pushed here, the sum is done
      if (MeanScale(plan) != 1.0f) err = dev.Scale(own, n, MeanScale(plan));
      if (err.success()) err = dev.Publish();
      if (err.failure()) return err;
      session.MarkReduced(k, s);
      continue;
    }

    RingMember m;
    m.own = own;
    for (int r = 0; r < 2; ++r) {
      const int64_t pred = RingPredecessor(r, k, p);
      m.pred[r] = session.arena(pred) + plan.slot(pred, s, 0);
      m.progress[r] = &session.proxy_progress(k, s, r);
      m.pred_progress[r] = &session.proxy_progress(pred, s, r);
      m.successor_device[r] = p + RingSuccessor(r, k, p);
      m.position[r] = RingPosition(r, k, p);
      m.pred_device[r] = p + pred;
    }
    for (int r = 0; r < 2; ++r) {
      m.step_times[r] = session.proxy_step_times(k, s, r);
      m.pred_step_times[r] = session.proxy_step_times(RingPredecessor(r, k, p), s, r);
    }
    m.self_device = p + k;
    m.wire_bytes_per_elem = n ? static_cast<double>(plan.piece_nbytes[s]) / n : 0.0;
    err = RingAllReduce(session, dev, call.who, n, MeanScale(plan), m, [&](int r, int32_t g) {
      return "proxy " + std::to_string(RingPredecessor(r, k, p)) + " to finish step " +
             std::to_string(g + 1) + "/" + std::to_string(RingSteps(p)) + " of ring " +
             std::to_string(r) + " for " + plan.DescribePiece(s);
    });
    if (err.failure()) return err;
    for (int32_t w : from) session.Notify(w);  // their pull may be waiting on this piece
  }
  return ffi::Error::Success();
}

}  // namespace coarse
