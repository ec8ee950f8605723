// ReduceLeading (coarse_worker_ring): the leading layers, reduced among the workers.
//
// "Dual synchronization": the gradients the next forward pass needs first
// skip the proxies. Each worker widens its leading leaves into its f32
// scratch, the workers run the same two-ring all-reduce the proxies use, and
// each worker then flags its local proxy. The proxy half below (reading the
// reduced values from that scratch so both tiers end the step with every
// synced value) served the design where the proxies ran the workers'
// program; the proxies' service jobs (runtime/service.h) return nothing to
// XLA and skip it, so only sync_selftest (1:1 meshes) runs it now;
// coarse_jax.model counts no hand-over.
#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/leaf_runs.h"
#include "runtime/phases.h"
#include "runtime/ring.h"
#include "runtime/trace.h"

namespace coarse {
namespace ffi = xla::ffi;

namespace {

// Narrows elements [lo, hi) of `src` (storage of `src_device`) into the leaves.
ffi::Error ScatterRange(Device& dev, const float* src, int64_t src_device,
                        const std::vector<LeafRun>& out_runs, int64_t lo, int64_t hi) {
  const std::vector<LeafRun> runs = ClipRuns(out_runs, lo, hi, lo);
  if (runs.empty()) return ffi::Error::Success();
  return dev.Scatter(src + lo, src_device, hi - lo, runs.data(), static_cast<int64_t>(runs.size()));
}

}  // namespace

ffi::Error WorkerRingAllReduce(Session& session, Device& dev, const Who& who,
                               std::optional<Clock::time_point> values_ready,
                               const std::function<ffi::Error(int64_t, int64_t)>& on_final) {
  const Plan& plan = session.plan();
  const int64_t p = plan.workers, me = who.index;
  RingMember m;
  m.members = p;
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
  m.values_ready = values_ready;
  m.on_final = on_final;
  // The local proxy copies final chunks as they come (the self-test's 1:1
  // meshes only, see the top of this file).
  m.watcher_device = plan.proxies == p ? p + me : -1;
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
  const int64_t n = plan.leading_nelems;
  // Both tiers copy the result into their leaves chunk by chunk as the ring
  // finishes it (ring.h, RingChunk), inside the emulated transfer windows,
  // rather than all of it after the last step: on this CPU backend the copy
  // out of the runtime's scratch is host work a GPU ring (reducing in place)
  // would not do, and after the ring it added ~2% to the AllReduce
  // baseline's time on emulated links (benchmarks/test_emulated_v100.py).
  if (call.who.tier == kWorker) {
    // On a GPU the ring would read the leaves in place: the widening copy is
    // host work, so step 0 is booked from the call's start (values_ready).
    const Clock::time_point entered = session.Now(me);
    ffi::Error err = dev.Gather(in_runs.data(), static_cast<int64_t>(in_runs.size()), scratch, me,
                                plan.leading_nelems);
    if (err.failure()) return err;
    err = WorkerRingAllReduce(session, dev, call.who, entered, [&](int64_t lo, int64_t hi) {
      return ScatterRange(dev, scratch, me, out_runs, lo, hi);
    });
    if (err.failure()) return err;
    session.NoteLeadingReady(me);
    session.leading_ready(me).store(1, std::memory_order_release);
    if (plan.proxies == p) session.Notify(p + me);
    return ffi::Error::Success();
  }
  if (plan.proxies != p)
    return ffi::Error::Internal(
        "coarse_jax: the proxy half of coarse_worker_ring exists for the 1:1 self-test only");
  // The proxy follows its worker's ring and copies each final chunk.
  for (int32_t g = static_cast<int32_t>(p - 2); p > 1 && g < RingSteps(p); ++g) {
    for (int r = 0; r < 2; ++r) {
      ffi::Error err = session.Wait(
          call.who, Session::Waits::kPeer,
          [&] { return session.worker_progress(me, r).load(std::memory_order_acquire) > g; },
          [&] {
            return "worker " + std::to_string(me) + " to finish step " + std::to_string(g + 1) +
                   " of ring " + std::to_string(r) + " for the leading layers (first tensor '" +
                   plan.leaf_names[first] + "')";
          });
      if (err.failure()) return err;
      err = dev.Acquire(me);
      if (err.failure()) return err;
      int64_t lo, hi;
      RingChunk(r, g, RingPosition(r, me, p), p, n, &lo, &hi);
      err = ScatterRange(dev, scratch, me, out_runs, lo, hi);
      if (err.failure()) return err;
    }
  }
  ffi::Error err = session.Wait(
      call.who, Session::Waits::kPeer,
      [&] { return session.leading_ready(me).load(std::memory_order_acquire) != 0; },
      [&] {
        return "worker " + std::to_string(me) +
               " to hand over the reduced leading layers (first tensor '" + plan.leaf_names[first] +
               "')";
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
  if (p == 1) {  // no ring steps to follow
    err = ScatterRange(dev, scratch, me, out_runs, 0, n);
    if (err.failure()) return err;
  }
  session.AdvanceTo(p + me, arrival);
  return ffi::Error::Success();
}

}  // namespace coarse
