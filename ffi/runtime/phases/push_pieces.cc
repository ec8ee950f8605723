// PushPieces (coarse_push): a worker hands one bucket of gradient pieces to the proxies.
//
// Called from inside the backward pass as soon as the bucket's gradients
// exist. For every piece of the bucket it widens the values into the slot the
// routed proxy keeps for this client (the transfer: a loop on CPU, a pack
// kernel plus a peer copy on CUDA, or one pack for all the pieces where the
// proxy is on the worker's GPU); then it publishes them all at once, marks
// each piece pushed by this worker (Session::pushed: what a proxy's timeout
// names) and bumps that proxy's arrival counter for the piece; then it wakes each proxy it
// pushed to once, for the bucket (a proxy walks a bucket's pieces in order:
// woken per piece it would park and wake once per piece). It never waits for anyone,
// so pushes cannot deadlock whatever order XLA runs them in. Still, the Python side chains them by
// a token (each push takes the previous one's) so they are issued in the plan's order, the order
// every proxy walks: left to XLA, independent pushes run in any order and a proxy idles on a piece
// whose push was issued late.
//
// On CPU (PushesInPlace, phases.h) nothing is copied: the push records where
// each piece's values lie in the worker's gradient buffers, which the caller
// keeps alive until its pull and bumps the arrival counter; where it was a
// piece's last push it wakes every proxy (each owns a chunk of every piece),
// once for the bucket; the proxies read the values from there. Still no wait.
#include <algorithm>
#include <vector>

#include "runtime/faults.h"
#include "runtime/phases.h"
#include "runtime/trace.h"

namespace coarse {

namespace {

// Wakes every proxy once, if a push of this bucket completed a piece.
void NotifyProxies(Session& session, const Plan& plan, bool completed) {
  if (!completed) return;
  for (int64_t j = 0; j < plan.proxies; ++j) session.Notify(plan.workers + j);
}

}  // namespace

Status PushPieces(Call& call, Device& dev, int64_t first_piece, int64_t num_pieces,
                  const LeafResolver& leaf_of, bool in_place) {
  const Plan& plan = call.plan();
  const int64_t i = call.who.index;
  Session& session = *call.session;
  if (session.TakeDroppedPush(i)) return Status::Success();  // testing: a lost push
  TraceScope all(session, call.device(), "push");
  const bool fused = PushesInPlace(session, in_place);
  std::vector<LeafRun> runs;
  bool completed = false;  // fused: this push was the last of one of its pieces
  for (int64_t s = first_piece; s < first_piece + num_pieces; ++s) {
    TraceScope piece(session, call.device(), "push piece", s, plan.piece_nbytes[s]);
    const int64_t k = plan.dest(s, i);
    const auto& from = plan.contributors_of(k, s);
    int64_t j = 0;
    while (from[j] != i) ++j;
    RunsOfPiece(plan, s, leaf_of, runs);
    if (fused) {
      // The proxies read these runs in place (PushesInPlace, phases.h). Each
      // waits for every worker's push of the piece (it owns a chunk of all
      // of them), so only the last push wakes them, all at once and once
      // for its bucket (below): a wake-up per push, or per piece, would
      // switch 8 threads on a few cores for nothing.
      std::sort(runs.begin(), runs.end(),
                [](const LeafRun& a, const LeafRun& b) { return a.buf_off < b.buf_off; });
      session.pushed_runs(i, s) = runs;
      session.pushed(i, s).store(1, std::memory_order_relaxed);  // published by the bump below
      session.arrived(k, s).fetch_add(1, std::memory_order_acq_rel);
      const bool last =
          session.pushes_of(s).fetch_add(1, std::memory_order_acq_rel) + 1 == plan.workers;
      completed = completed || last;
      if (NotifiesPerPiece()) NotifyProxies(session, plan, last);  // testing: the old wake-ups
      continue;
    }
    Status e =
        dev.Gather(runs.data(), static_cast<int64_t>(runs.size()),
                   session.arena(k) + plan.slot(k, s, j), plan.workers + k, plan.piece_nelems[s]);
    if (e.failure()) return e;
    // The gather above is the transfer; on an emulated link the proxy books
    // it when it takes the piece (the push itself never waits).
    session.NotePushReady(i, s);
  }
  // After every bump of the bucket: a proxy woken here finds all of them.
  if (fused) {
    NotifyProxies(session, plan, completed);
    return Status::Success();
  }
  // One publication for the whole bucket (on a GPU: its pieces' packs merged
  // into one launch, Device::Flush, and one event record), then every piece
  // is announced: work per call, not per piece.
  Status e = dev.Publish();
  if (e.failure()) return e;
  std::vector<bool> to(plan.proxies, false);  // the proxies this bucket reached
  for (int64_t s = first_piece; s < first_piece + num_pieces; ++s) {
    const int64_t k = plan.dest(s, i);
    session.pushed(i, s).store(1, std::memory_order_relaxed);  // published by the bump below
    session.arrived(k, s).fetch_add(1, std::memory_order_acq_rel);
    to[k] = true;
    if (NotifiesPerPiece()) session.Notify(plan.workers + k);
  }
  // Each proxy once, after all the bucket's bumps (its wait re-checks the
  // piece it is at, and finds the rest there as it walks on).
  for (int64_t k = 0; k < plan.proxies; ++k)
    if (to[k]) session.Notify(plan.workers + k);
  return Status::Success();
}

}  // namespace coarse
