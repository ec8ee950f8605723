// GroupPitch, GroupMember, GroupStepWhat, AwaitPushes (ring_group_member.h).
#include "runtime/phases/ring_group_member.h"

#include <atomic>
#include <string>
#include <vector>

namespace coarse {

namespace {

std::string ListWorkers(const std::vector<int32_t>& ws) {
  std::string out;
  for (int32_t w : ws) out += (out.empty() ? "" : ", ") + std::to_string(w);
  return out;
}

}  // namespace

int64_t GroupPitch(const Plan& plan, int64_t j, const RingGroup& g) {
  return g.count > 1 ? plan.slot(j, g.first + 1, 0) - plan.slot(j, g.first, 0) : 0;
}

RingMember GroupMember(Session& session, int64_t k, const RingGroup& g) {
  const Plan& plan = session.plan();
  const int64_t s = g.first, w = plan.workers, q = plan.proxies;
  RingMember m;
  m.members = q;
  m.own = session.arena(k) + plan.slot(k, s, 0);
  m.rows = g.count;
  m.own_pitch = GroupPitch(plan, k, g);
  if (g.count > 1)  // the counters of consecutive pieces
    m.progress_stride = &session.proxy_progress(k, s + 1, 0) - &session.proxy_progress(k, s, 0);
  for (int r = 0; r < 2; ++r) {
    const int64_t pred = RingPredecessor(r, k, q);
    m.pred[r] = session.arena(pred) + plan.slot(pred, s, 0);
    m.pred_pitch[r] = GroupPitch(plan, pred, g);
    m.progress[r] = &session.proxy_progress(k, s, r);
    m.pred_progress[r] = &session.proxy_progress(pred, s, r);
    m.successor_device[r] = w + RingSuccessor(r, k, q);
    m.position[r] = RingPosition(r, k, q);
    m.pred_device[r] = w + pred;
    m.step_times[r] = g.count > 1 ? nullptr : session.proxy_step_times(k, s, r);
    m.pred_step_times[r] = g.count > 1 ? nullptr : session.proxy_step_times(pred, s, r);
  }
  m.self_device = w + k;
  const int64_t n = plan.piece_nelems[s];
  m.wire_bytes_per_elem = n ? static_cast<double>(plan.piece_nbytes[s]) / n : 0.0;
  return m;
}

std::function<std::string(int, int32_t)> GroupStepWhat(const Plan& plan, int64_t k,
                                                       const RingGroup& grp) {
  const int64_t q = plan.proxies;
  return [&plan, k, q, grp](int r, int32_t g) {
    const std::string also =
        grp.count > 1 ? " and the " + std::to_string(grp.count - 1) + " pieces after it" : "";
    return "proxy " + std::to_string(RingPredecessor(r, k, q)) + " to finish step " +
           std::to_string(g + 1) + "/" + std::to_string(RingSteps(q)) + " of ring " +
           std::to_string(r) + " for " + plan.DescribePiece(grp.first) + also;
  };
}

Status AwaitPushes(const Call& call, int64_t j, int64_t s, Session::Waits kind) {
  Session& session = *call.session;
  const Plan& plan = session.plan();
  const auto& from = plan.contributors_of(j, s);
  const int32_t expected = static_cast<int32_t>(from.size());
  return session.Wait(
      call.who, kind,
      [&] { return session.arrived(j, s).load(std::memory_order_acquire) >= expected; },
      [&] {
        // Exactly the clients whose push is missing (a shared proxy's
        // group minus those that pushed), not the whole group.
        std::vector<int32_t> missing;
        for (int32_t w : from)
          if (!session.pushed(w, s).load(std::memory_order_acquire)) missing.push_back(w);
        const std::string arrived =
            std::to_string(expected - static_cast<int32_t>(missing.size())) + " of " +
            std::to_string(expected) + " arrived";
        if (missing.empty())  // the last push landed just as the wait timed out
          return "worker(s) " + ListWorkers(from) + " to push " + plan.DescribePiece(s) + " (" +
                 arrived + " as the wait timed out)";
        return "worker(s) " + ListWorkers(missing) + " to push " + plan.DescribePiece(s) + " (" +
               arrived + ")";
      });
}

}  // namespace coarse
