// ReduceLeading (coarse_worker_ring): the leading layers, reduced among the workers.
//
// "Dual synchronization": the gradients the next forward pass needs first
// skip the proxies. Each worker widens its leading leaves into its f32
// scratch, the workers run the same two-ring all-reduce the proxies use, and
// each narrows the result into its leaves as the ring finishes each chunk.
// The proxies take no part: their service jobs (runtime/service.h) return
// nothing to XLA, so the reduced leading layers stay with the workers
// (coarse_jax.model counts no hand-over to the proxies either).
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

namespace {

// Narrows elements [lo, hi) of `src` (storage of `src_device`) into the leaves.
Status ScatterRange(Device& dev, const float* src, int64_t src_device,
                    const std::vector<LeafRun>& out_runs, int64_t lo, int64_t hi) {
  const std::vector<LeafRun> runs = ClipRuns(out_runs, lo, hi, lo);
  if (runs.empty()) return Status::Success();
  return dev.Scatter(src + lo, src_device, hi - lo, runs.data(), static_cast<int64_t>(runs.size()));
}

// OneShotLeading (phases.h): the workers' reduction in one pass over
// shared memory. worker_progress(w, 0) is the protocol: 0 once worker w has
// published its leaves, 1 once it has summed its chunks into its scratch.
// No worker writes its outputs (which may alias its leaves, which the
// others read) before every worker has summed.
Status OneShotReduceLeading(Call& call, Device& dev, const std::vector<LeafRun>& in_runs,
                            const std::vector<LeafRun>& out_runs) {
  Session& session = *call.session;
  const Plan& plan = call.plan();
  const int64_t p = plan.workers, me = call.who.index, n = plan.leading_nelems;
  PushedRuns& mine = session.leading_runs(me);
  mine = in_runs;
  std::sort(mine.begin(), mine.end(),
            [](const LeafRun& a, const LeafRun& b) { return a.buf_off < b.buf_off; });
  auto reach = [&](int32_t stage, const char* doing) {
    session.worker_progress(me, 0).store(stage, std::memory_order_release);
    for (int64_t w = 0; w < p; ++w)
      if (w != me) session.Notify(w);
    for (int64_t w = 0; w < p; ++w) {
      Status err = session.Wait(
          call.who, Session::Waits::kPeer,
          [&] { return session.worker_progress(w, 0).load(std::memory_order_acquire) >= stage; },
          [&] {
            return "worker " + std::to_string(w) + " to " + doing + " its leading layers (" +
                   std::to_string(n) + " elements, first tensor '" +
                   plan.leaf_names[plan.num_proxy_leaves] + "')";
          });
      if (err.failure()) return err;
      err = dev.Acquire(w);
      if (err.failure()) return err;
    }
    return Status::Success();
  };
  Status err = reach(0, "publish");
  if (err.failure()) return err;
  float* scratch = session.scratch(me);
  std::vector<int64_t> order(p);
  std::vector<std::vector<const PushedRuns*>> groups(p);
  for (int r = 0; r < 2; ++r) {
    int64_t lo, hi;
    const int64_t c = OwnedChunk(r, me, p, n, &lo, &hi);
    if (hi <= lo) continue;
    RingAddOrder(r, c, p, order.data());
    for (int64_t t = 0; t < p; ++t) groups[t] = {&session.leading_runs(order[t])};
    err = session.shared_memory()->SumPushesInRingOrder(scratch + lo, lo, hi, groups,
                                                        MeanScale(plan));
    if (err.failure()) return err;
  }
  err = dev.Publish();
  if (err.failure()) return err;
  err = reach(1, "sum its chunks of");
  if (err.failure()) return err;
  for (int64_t w = 0; w < p; ++w)
    for (int r = 0; r < 2; ++r) {
      int64_t lo, hi;
      OwnedChunk(r, w, p, n, &lo, &hi);
      if (hi <= lo) continue;
      err = ScatterRange(dev, session.scratch(w), w, out_runs, lo, hi);
      if (err.failure()) return err;
    }
  return Status::Success();
}

}  // namespace

Status WorkerRingAllReduce(Session& session, Device& dev, const Who& who,
                           std::optional<Clock::time_point> values_ready,
                           const std::function<Status(int64_t, int64_t)>& on_final) {
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

Status ReduceLeading(Call& call, Device& dev, const std::vector<LeafRun>& in_runs,
                     const std::vector<LeafRun>& out_runs) {
  TraceScope all(*call.session, call.device(), "worker ring", -1, call.plan().leading_nbytes);
  if (OneShotLeading(*call.session)) return OneShotReduceLeading(call, dev, in_runs, out_runs);
  const Plan& plan = call.plan();
  Session& session = *call.session;
  const int64_t me = call.who.index;
  float* scratch = session.scratch(me);
  // The result goes into the leaves chunk by chunk as the ring finishes it
  // (ring.h, RingChunk), inside the emulated transfer windows, rather than
  // all of it after the last step: on the CPU backend the copy out of the
  // runtime's scratch is host work a GPU ring (reducing in place) would not
  // do, and after the ring it added ~2% to the AllReduce baseline's time on
  // emulated links (benchmarks/test_emulated_v100.py).
  // On a GPU the ring would read the leaves in place: the widening copy is
  // host work, so step 0 is booked from the call's start (values_ready).
  const Clock::time_point entered = session.Now(me);
  Status err = dev.Gather(in_runs.data(), static_cast<int64_t>(in_runs.size()), scratch, me,
                          plan.leading_nelems);
  if (err.failure()) return err;
  return WorkerRingAllReduce(session, dev, call.who, entered, [&](int64_t lo, int64_t hi) {
    return ScatterRange(dev, scratch, me, out_runs, lo, hi);
  });
}

}  // namespace coarse
