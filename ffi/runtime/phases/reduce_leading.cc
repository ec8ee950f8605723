// ReduceLeading (coarse_worker_ring): the leading layers, reduced among the workers.
//
// "Dual synchronization": the gradients the next forward pass needs first
// skip the proxies. Each worker widens its leading leaves into its f32
// scratch, the workers run the same two-ring all-reduce the proxies use, and
// each worker then flags its local proxy, which reads the reduced values from
// that scratch (runtime-owned, so it outlives the worker's call) so both tiers
// end the step with every synced value.
#include <string>
#include <vector>

#include "runtime/phases.h"
#include "runtime/ring.h"
#include "runtime/trace.h"

namespace coarse {
namespace ffi = xla::ffi;

ffi::Error WorkerRingAllReduce(Session& session, Device& dev, const Who& who) {
  const Plan& plan = session.plan();
  const int64_t p = plan.workers, me = who.index;
  RingMember m;
  m.own = session.scratch(me);
  for (int r = 0; r < 2; ++r) {
    const int64_t pred = RingPredecessor(r, me, p);
    m.pred[r] = session.scratch(pred);
    m.progress[r] = &session.worker_progress(me, r);
    m.pred_progress[r] = &session.worker_progress(pred, r);
    m.successor_device[r] = RingSuccessor(r, me, p);
    m.position[r] = RingPosition(r, me, p);
    m.pred_device[r] = pred;
  }
  for (int r = 0; r < 2; ++r) {
    m.step_times[r] = session.worker_step_times(me, r);
    m.pred_step_times[r] = session.worker_step_times(RingPredecessor(r, me, p), r);
  }
  m.self_device = me;
  m.wire_bytes_per_elem =
      plan.leading_nelems ? static_cast<double>(plan.leading_nbytes) / plan.leading_nelems : 0.0;
  return RingAllReduce(
      session, dev, who, plan.leading_nelems, MeanScale(plan), m, [&](int r, int32_t g) {
        return "worker " + std::to_string(RingPredecessor(r, me, p)) + " to finish step " +
               std::to_string(g + 1) + "/" + std::to_string(RingSteps(p)) + " of ring " +
               std::to_string(r) + " for the leading layers (" +
               std::to_string(plan.leading_nelems) + " elements, first tensor '" +
               plan.leaf_names[plan.num_proxy_leaves] + "')";
      });
}

ffi::Error ReduceLeading(Call& call, Device& dev, const std::vector<LeafRun>& in_runs,
                         const std::vector<LeafRun>& out_runs) {
  TraceScope all(*call.session, call.device(), "worker ring", -1, call.plan().leading_nbytes);
  const Plan& plan = call.plan();
  Session& session = *call.session;
  const int64_t first = plan.num_proxy_leaves;
  const int64_t p = plan.workers, me = call.who.index;
  float* scratch = session.scratch(me);
  if (call.who.tier == kWorker) {
    ffi::Error err = dev.Gather(in_runs.data(), static_cast<int64_t>(in_runs.size()), scratch, me,
                                plan.leading_nelems);
    if (err.failure()) return err;
    err = WorkerRingAllReduce(session, dev, call.who);
    if (err.failure()) return err;
    session.NoteLeadingReady(me);
    session.leading_ready(me).store(1, std::memory_order_release);
    session.Notify(p + me);
  } else {
    ffi::Error err = session.Wait(
        call.who, Session::Waits::kPeer,
        [&] { return session.leading_ready(me).load(std::memory_order_acquire) != 0; },
        [&] {
          return "worker " + std::to_string(me) +
                 " to hand over the reduced leading layers (first tensor '" +
                 plan.leaf_names[first] + "')";
        });
    if (err.failure()) return err;
    err = dev.Acquire(me);
    if (err.failure()) return err;
    // The hand-over from the local worker is traffic of the dual-sync
    // design. With no proxy pieces at all (the AllReduce baseline) the
    // proxies are not part of the emulated system: not charged.
    // Like a push, the hand-over is the worker's transfer: booked from when
    // the worker had the values, whatever this proxy was doing.
    Clock::time_point arrival = session.LeadingReadyAt(me);
    if (plan.num_pieces() > 0 && session.emulated()) {
      auto t = session.ReserveInOrder(call.who, me, p + me, plan.leading_nbytes, arrival,
                                      plan.num_pieces(), plan.proxy_port_transfers[me],
                                      "the hand-over of the leading layers");
      if (t.has_error()) return t.error();
      arrival = t.value();
    }
    session.AdvanceTo(p + me, arrival);
  }
  // The ring already applied the 1/p scale; a proxy reads its worker's scratch.
  return dev.Scatter(scratch, me, plan.leading_nelems, out_runs.data(),
                     static_cast<int64_t>(out_runs.size()));
}

}  // namespace coarse
