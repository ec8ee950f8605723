// PullPieces (coarse_pull): a worker writes the reduced proxy-synced leaves.
//
// A worker waits, piece by piece in global order, until the proxy it routed
// the piece to has finished both rings for it (on CPU, GatherPull in
// phases.h: until every proxy has reduced its chunks, read from each in place), then narrows the
// f32 sum into its output leaves (the ring already applied the 1/p scale), reassembling shards and
// unbatching small tensors in the same pass (on CUDA: a peer copy of the piece, then one unpack
// kernel). Same code, same f32 input: every worker ends bitwise equal.
#include <algorithm>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/leaf_runs.h"
#include "runtime/phases.h"
#include "runtime/ring.h"
#include "runtime/trace.h"

namespace coarse {

namespace {

// GatherPull (phases.h): piece s straight from the chunks each proxy owns
// after its reduce-scatter (chunk (position + 1) % p of each half, ring.h).
Status PullOwnedChunks(Call& call, Device& dev, int64_t s, const LeafResolver& leaf_of,
                       std::vector<LeafRun>& runs) {
  const Plan& plan = call.plan();
  Session& session = *call.session;
  const int64_t p = plan.workers, q = plan.proxies, n = plan.piece_nelems[s];
  const int32_t owned = static_cast<int32_t>(q - 1);  // ring progress once the chunks are final
  Status err;
  {
    TraceScope wait(session, call.device(), "wait for the reduced piece", s);
    for (int64_t j = 0; j < q && err.success(); ++j)
      err = session.Wait(
          call.who, Session::Waits::kPeer,
          [&] {
            return session.proxy_progress(j, s, 0).load(std::memory_order_acquire) >= owned &&
                   session.proxy_progress(j, s, 1).load(std::memory_order_acquire) >= owned;
          },
          [&] {
            return "proxy " + std::to_string(j) + " to reduce its chunks of " +
                   plan.DescribePiece(s);
          });
  }
  if (err.failure()) return err;
  RunsOfPiece(plan, s, leaf_of, runs);
  for (int64_t j = 0; j < q; ++j) {
    err = dev.Acquire(p + j);
    if (err.failure()) return err;
    for (int r = 0; r < 2; ++r) {
      int64_t lo, hi;
      OwnedChunk(r, j, q, n, &lo, &hi);
      const std::vector<LeafRun> mine = ClipRuns(runs, lo, hi, 0);
      if (mine.empty()) continue;
      err = dev.Scatter(session.arena(j) + plan.slot(j, s, 0), p + j, n, mine.data(),
                        static_cast<int64_t>(mine.size()));
      if (err.failure()) return err;
    }
  }
  return Status::Success();
}

// PushesInPlace: the proxies read this worker's pushes through the pointers
// its pushes published. XLA must not have moved a pushed leaf since (a copy
// would leave the proxies reading a dead buffer): `pushed` resolves the
// leaves this pull holds, which must be where they were pushed from. A
// mismatch fails the step on every device rather than pull what may be
// stale values.
Status CheckPushedInPlace(Call& call, const LeafResolver& pushed) {
  const Plan& plan = call.plan();
  Session& session = *call.session;
  const int64_t me = call.who.index;
  for (int64_t s = 0; s < plan.num_pieces(); ++s) {
    const PushedRuns& runs = session.pushed_runs(me, s);
    // Not pushed (a lost push): the proxies wait for it and name it.
    if (runs.empty()) continue;
    for (int64_t g = plan.piece_seg_begin[s]; g < plan.piece_seg_begin[s + 1]; ++g) {
      const Segment& seg = plan.segments[g];
      const LeafRef leaf = pushed(seg.leaf);
      const void* at = ElementPtr(leaf.data, leaf.dtype, seg.leaf_off);
      // The runs are sorted by buf_off (PushPieces).
      auto it = std::lower_bound(runs.begin(), runs.end(), seg.piece_off,
                                 [](const LeafRun& r, int64_t off) { return r.buf_off < off; });
      bool found = false;
      for (; it != runs.end() && it->buf_off == seg.piece_off && !found; ++it)
        found = it->leaf == at;
      if (found) continue;
      const std::string msg =
          "coarse_jax: " + call.who.Describe() + ": leaf " + std::to_string(seg.leaf) + " of " +
          plan.DescribePiece(s) +
          " is not in the buffer it was pushed from (XLA moved or copied it between the push "
          "and the pull), so the proxies, which read pushes in place, may have read stale "
          "values; the step was abandoned on every device. This is a coarse_jax bug: please "
          "report it with the step's code.";
      session.Poison(msg);
      return Status::Internal(msg);
    }
  }
  return Status::Success();
}

}  // namespace

Status PullPieces(Call& call, Device& dev, const LeafResolver& leaf_of,
                  const LeafResolver* pushed) {
  const Plan& plan = call.plan();
  Session& session = *call.session;
  const int64_t p = plan.workers, me = call.who.index;
  const bool gather = GatherPull(session);
  if (pushed) {
    Status err = CheckPushedInPlace(call, *pushed);
    if (err.failure()) return err;
  }
  std::vector<LeafRun> runs, piece_runs;  // reused: no allocation per piece
  TraceScope all(session, call.device(), "pull");
  // Until proxy k has reduced piece s (and enqueued the work that did it).
  auto reduced = [&](int64_t k, int64_t s) {
    TraceScope wait(session, call.device(), "wait for the reduced piece", s);
    return session.Wait(
        call.who, Session::Waits::kPeer, [&] { return session.IsReduced(k, s); },
        [&] { return "proxy " + std::to_string(k) + " to reduce " + plan.DescribePiece(s); });
  };
  // A device with streams (no emulated links, no in-place pull) waits on the
  // host for every piece first, then orders its stream after each proxy once
  // (Acquire) and unpacks them all in one launch (Device::Flush): work per
  // call, not per piece. Pieces a proxy in host memory makes final are each
  // waited for on the stream instead (its ready flags, below).
  const bool per_call = !gather && !session.emulated();
  for (int64_t s = 0; s < plan.num_pieces() && per_call; ++s) {
    const int64_t k = plan.dest(s, me);
    if (session.ready_flag(k, s) != nullptr) continue;
    Status err = reduced(k, s);
    if (err.failure()) return err;
  }
  for (int64_t s = 0; s < plan.num_pieces(); ++s) {
    TraceScope piece(session, call.device(), "pull piece", s, plan.piece_nbytes[s]);
    if (gather && plan.piece_holder[s] < 0) {
      Status err = PullOwnedChunks(call, dev, s, leaf_of, runs);
      if (err.failure()) return err;
      continue;
    }
    // Without the all-gather (GatherPull) a DENSE piece is only on its holder.
    const int64_t k = gather ? plan.piece_holder[s] : plan.dest(s, me);
    Status err;
    if (!gather && session.ready_flag(k, s) != nullptr) {
      // A proxy in host memory with device streams (Storage::ready_flags):
      // this device's stream waits for the proxy's flag, then copies the
      // pieces in (Scatter: an UploadPinned); this thread goes on at once.
      // A group of the next pieces from proxy k, up to kPullGroupFloats, is
      // one wait, for its last piece's flag (the proxy makes its pieces final
      // in ascending order, each flag written after the ones before), and one
      // copy where their slots lie side by side (p = 1): a pull's waits and
      // copies per group of bytes, not per piece, still pipelined behind the
      // host optimizer group by group.
      const int64_t first = s;
      int64_t floats = plan.piece_nelems[s];
      while (s + 1 < plan.num_pieces() && plan.dest(s + 1, me) == k &&
             floats + plan.piece_nelems[s + 1] <= kPullGroupFloats) {
        floats += plan.piece_nelems[s + 1];
        ++s;
      }
      err = dev.WaitFlag(session.ready_flag(k, s), session.ready_value(), session.PeerWaitLimit(),
                         "coarse_jax: " + call.who.Describe() + session.DescribeStep() +
                             ": the pull's wait for proxy " + std::to_string(k) +
                             " (in host memory) to make " + plan.DescribePiece(s) + " final");
      for (int64_t t = first; t <= s && err.success();) {
        // [t, u]: slots side by side in proxy k's arena, copied and unpacked as one.
        const int64_t base = plan.slot(k, t, 0);
        runs.clear();
        int64_t u = t, len = 0;
        for (;; ++u) {
          RunsOfPiece(plan, u, leaf_of, piece_runs);
          for (LeafRun& r : piece_runs) r.buf_off += len;
          runs.insert(runs.end(), piece_runs.begin(), piece_runs.end());
          len += plan.piece_nelems[u];
          if (u == s || plan.slot(k, u + 1, 0) != base + len) break;
        }
        err = dev.Scatter(session.arena(k) + base, p + k, len, runs.data(),
                          static_cast<int64_t>(runs.size()));
        t = u + 1;
      }
      if (err.failure()) return err;
      continue;
    }
    if (!per_call) err = reduced(k, s);
    if (err.failure()) return err;
    err = dev.Acquire(p + k);
    if (err.failure()) return err;
    // The pull is booked from the moment the piece was reduced, not from
    // when the worker got here: pulls are pipelined like pushes (the link
    // and the ports still serialize them). The copy below happens inside the
    // transfer window.
    const Clock::time_point reduced = session.ReducedAt(k, s);
    Clock::time_point arrival = reduced;
    if (session.emulated()) {
      auto t = session.ReserveInOrder(call.who, p + k, me, plan.piece_nbytes[s], reduced,
                                      plan.proxy_port_rank[s * p + me], s,
                                      "the pull of " + plan.DescribePiece(s));
      if (t.has_error()) return t.error();
      arrival = t.value();
    }
    RunsOfPiece(plan, s, leaf_of, runs);
    // Already scaled by the ring.
    err = dev.Scatter(session.arena(k) + plan.slot(k, s, 0), p + k, plan.piece_nelems[s],
                      runs.data(), static_cast<int64_t>(runs.size()));
    if (err.failure()) return err;
    session.AdvanceTo(me, arrival);
  }
  return Status::Success();
}

}  // namespace coarse
