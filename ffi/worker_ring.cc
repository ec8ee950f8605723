// coarse_worker_ring: the leading layers, reduced among the workers.
//
// "Dual synchronization": the gradients the next forward pass needs first
// skip the proxies. Each worker widens its leading leaves into its f32
// scratch, the workers run the same two-ring all-reduce the proxies use, and
// each worker then flags its local proxy, which reads the reduced values from
// that scratch (runtime-owned, so it outlives the worker's call) so both tiers
// end the step with every synced value.
#include <cstring>

#include "call.h"
#include "runtime/ring.h"

namespace coarse {
namespace ffi = xla::ffi;

static ffi::Error WorkerRingImpl(ffi::RunId run_id, ffi::AnyBuffer who, ffi::AnyBuffer token_in,
                                 ffi::RemainingArgs leaves, ffi::RemainingRets outs,
                                 ffi::Dictionary attrs) {
  (void)token_in;
  auto begun = BeginCall(run_id, who, attrs);
  if (begun.has_error()) return begun.error();
  Call call = std::move(begun.value());
  const Plan& plan = call.plan();
  Session& session = *call.session;
  auto status = [&]() -> ffi::Error {
    const int64_t first = plan.num_proxy_leaves;
    const int64_t L = static_cast<int64_t>(plan.leaf_nelems.size()) - first;
    if (static_cast<int64_t>(leaves.size()) != L || static_cast<int64_t>(outs.size()) != L + 1)
      return ffi::Error::InvalidArgument(
          "coarse_worker_ring: expected one operand per leading leaf and a token result");
    const int64_t p = plan.workers, me = call.who.index;
    float* scratch = session.scratch(me);
    if (call.who.tier == kWorker) {
      int64_t off = 0;
      for (int64_t a = 0; a < L; ++a) {
        ffi::AnyBuffer in = leaves.get<ffi::AnyBuffer>(a).value();
        ffi::Error e = CheckLeaf(plan, first + a, in.element_type(), in.element_count(),
                                 "coarse_worker_ring");
        if (e.failure()) return e;
        cpu::WidenToF32(in.element_type(), in.untyped_data(), scratch + off, in.element_count());
        off += in.element_count();
      }
      RingMember m;
      m.own = scratch;
      for (int r = 0; r < 2; ++r) {
        const int64_t pred = RingPredecessor(r, me, p);
        m.pred[r] = session.scratch(pred);
        m.progress[r] = &session.worker_progress(me, r);
        m.pred_progress[r] = &session.worker_progress(pred, r);
        m.successor_device[r] = RingSuccessor(r, me, p);
        m.position[r] = RingPosition(r, me, p);
        m.pred_device[r] = pred;
      }
      m.self_device = me;
      m.wire_bytes_per_elem = plan.leading_nelems
                                  ? static_cast<double>(plan.leading_nbytes) / plan.leading_nelems
                                  : 0.0;
      ffi::Error err = RingAllReduce(
          session, call.who, plan.leading_nelems, MeanScale(plan), m, [&](int r, int32_t g) {
        return "worker " + std::to_string(RingPredecessor(r, me, p)) + " to finish step " +
               std::to_string(g + 1) + "/" + std::to_string(RingSteps(p)) + " of ring " +
               std::to_string(r) + " for the leading layers (" +
               std::to_string(plan.leading_nelems) + " elements, first tensor '" +
               plan.leaf_names[first] + "')";
      });
      if (err.failure()) return err;
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
      // The hand-over from the local worker is traffic of the dual-sync
      // design. With no proxy pieces at all (the AllReduce baseline) the
      // proxies are not part of the emulated system: not charged.
      if (plan.num_pieces() > 0)
        Session::SleepUntil(session.Reserve(me, p + me, plan.leading_nbytes));
    }
    int64_t off = 0;  // the ring already applied the 1/p scale
    for (int64_t a = 0; a < L; ++a) {
      ffi::Result<ffi::AnyBuffer> out = outs.get<ffi::AnyBuffer>(a).value();
      ffi::Error e = CheckLeaf(plan, first + a, out->element_type(), out->element_count(),
                               "coarse_worker_ring");
      if (e.failure()) return e;
      cpu::NarrowFromF32(out->element_type(), scratch + off, out->untyped_data(),
                         out->element_count());
      off += out->element_count();
    }
    ffi::Result<ffi::AnyBuffer> token = outs.get<ffi::AnyBuffer>(L).value();
    std::memset(token->untyped_data(), 0, token->size_bytes());
    return ffi::Error::Success();
  }();
  return EndCall(call, std::move(status), attrs);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(WorkerRing, WorkerRingImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::RunId>()       // rendezvous key: one execution
                                  .Arg<ffi::AnyBuffer>()   // int32[2] (tier, data index)
                                  .Arg<ffi::AnyBuffer>()   // token: after the proxy ring
                                  .RemainingArgs()         // leading leaves
                                  .RemainingRets()         // reduced leading leaves, then token
                                  .Attrs<ffi::Dictionary>());  // plan

}  // namespace coarse
