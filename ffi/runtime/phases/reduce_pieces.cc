// ReducePieces (coarse_proxy_ring): a proxy reduces every piece with the other proxies.
//
// Pieces are walked in the plan's one global order on every proxy, in the
// ring's groups (runtime/ring_groups.h: a push's pieces, stepped together:
// one copy and one launch per ring step per group). For each
// piece the proxy waits until all clients routed to it have pushed (one slot
// per client: a proxy is never blocked on one client's queue by another's;
// a timeout names the clients whose push is missing, Session::pushed),
// sums the slots in client order into its accumulator (zeros if nobody routes
// the piece here), then runs the two opposite rings with its peers.
//
// With the proxy optimizer (`update`, phases/update_pieces.cc) a parameter
// piece's ring stops after the reduce-scatter: the proxy turns the chunks it
// owns into new parameters, then the all-gather circulates those. With
// global-norm clipping every parameter piece is reduce-scattered first (the
// norm needs them all), then updated and gathered.
//
// Across hosts (HostsStage, phases.h) the call is split in two: the first
// reduce-scatters every piece and hands the owned chunks to XLA, which sums
// them over the hosts; the second takes the global chunks back, updates and
// all-gathers. Nothing is announced to the ring until the global values are
// in place.
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "runtime/phases.h"
#include "runtime/phases/exchange_owned.h"
#include "runtime/phases/pull_wakeups.h"
#include "runtime/phases/ring_group_member.h"
#include "runtime/ring.h"
#include "runtime/ring_groups.h"
#include "runtime/stream.h"
#include "runtime/trace.h"

namespace coarse {

namespace {

class PieceReducer {
 public:
  PieceReducer(Call& call, Device& dev, ProxyUpdate* update, bool in_place)
      : call_(call),
        dev_(dev),
        update_(update),
        session_(*call.session),
        plan_(call.plan()),
        w_(plan_.workers),
        q_(plan_.proxies),
        k_(call.who.index),
        gather_pull_(GatherPull(session_)),
        fused_(PushesInPlace(session_, in_place)),
        pulls_(plan_, k_, gather_pull_),
        // The ring's groups; a piece each where no ring steps (one-shot sums)
        // or the emulated links book every piece's transfer.
        groups_(RingGroups(plan_,
                           gather_pull_ || fused_ || session_.emulated() ? 0 : RingGroupFloats(),
                           [this](int64_t s) { return updates(s) ? 1 : 0; })) {}

  const std::vector<RingGroup>& groups() const { return groups_; }

  bool updates(int64_t s) const { return update_ && update_->spec->updates_piece(plan_, s); }
  bool copies_from_holder(int64_t s) const {
    return plan_.piece_holder[s] >= 0 && plan_.piece_holder[s] != k_;
  }

  // Waits for the pushes of piece s, sums them and runs the reduce-scatter
  // (DENSE holder: scales the sum). `announce`: let peers read the owned
  // chunks now (no update in between).
  // A group (RingGroup: its pieces' pushes, one sum and one ring for all).
  Status ReduceScatter(const RingGroup& g, bool announce) {
    const int64_t s = g.first;
    if (copies_from_holder(s)) return Status::Success();
    if (fused_) return FusedReduceScatter(s, announce);
    const auto& from = plan_.contributors_of(k_, s);
    Status err;
    {
      TraceScope wait(session_, w_ + k_, "wait for pushes", s);
      for (int64_t t = s; t < s + g.count && err.success(); ++t) err = AwaitPushes(call_, k_, t);
    }
    if (err.failure()) return err;
    for (int64_t t = s; t < s + g.count; ++t)
      for (int32_t w : plan_.contributors_of(k_, t)) {
        err = dev_.Acquire(w);  // once per publication: a push's pieces wait once
        if (err.failure()) return err;
      }
    if (session_.emulated()) {
      // A push is a transfer the worker started: it does not wait for this
      // proxy to be free, only for the link and ports.
      Clock::time_point arrival = Clock::time_point::min();
      for (int32_t w : from) {
        auto t = session_.ReserveInOrder(
            call_.who, w, w_ + k_, plan_.piece_nbytes[s], session_.PushReady(w, s), s,
            plan_.proxy_port_rank[s * w_ + w],
            "the push of worker " + std::to_string(w) + " of " + plan_.DescribePiece(s));
        if (t.has_error()) return t.error();
        arrival = std::max(arrival, t.value());
      }
      session_.AdvanceTo(w_ + k_, arrival);
    }
    const int64_t n = plan_.piece_nelems[s];
    float* own = Own(s);
    // DENSE: every client pushed here, so this sum is the mean (scaled in the
    // same pass).
    const bool dense = plan_.piece_holder[s] == k_;
    {
      TraceScope sum(session_, w_ + k_, "sum pushes", s);
      err =
          dev_.SumSlots(own, n, static_cast<int64_t>(from.size()), dense ? MeanScale(plan_) : 1.0f,
                        Rows{g.count, GroupPitch(plan_, k_, g), 0});
    }
    if (err.failure() || dense) return err;
    if (gather_pull_) return OneShotReduceScatter(s, announce);
    const RingMember m = GroupMember(session_, k_, g);
    TraceScope ring(session_, w_ + k_, "reduce-scatter", s, RingBytes(s) * g.count);
    return RingReduceScatter(session_, dev_, call_.who, n, MeanScale(plan_), m,
                             GroupStepWhat(plan_, k_, g), announce);
  }

  // With GatherPull (CPU): the reduce-scatter in one pass instead of p - 1
  // ring steps. Once every proxy holds its clients' sum of piece s, this
  // proxy sums the chunks it owns (the ring's: chunk (position + 1) % p of
  // each half) straight from every proxy's storage, in the order the ring
  // would add them, so the bits equal the ring's (GPU, emulated links). It
  // writes only its own chunks, which no peer reads.
  Status OneShotReduceScatter(int64_t s, bool announce) {
    float* own = Own(s);
    Status err = dev_.Publish();
    if (err.failure()) return err;
    for (int r = 0; r < 2; ++r)
      session_.proxy_progress(k_, s, r).store(0, std::memory_order_release);
    for (int64_t j = 0; j < q_; ++j)
      if (j != k_) session_.Notify(w_ + j);
    TraceScope span(session_, w_ + k_, "reduce-scatter", s, RingBytes(s));
    for (int64_t j = 0; j < q_; ++j) {
      err = session_.Wait(
          call_.who, Session::Waits::kPeer,
          [&] { return session_.proxy_progress(j, s, 0).load(std::memory_order_acquire) >= 0; },
          [&] {
            return "proxy " + std::to_string(j) + " to sum the pushes of " + plan_.DescribePiece(s);
          });
      if (err.failure()) return err;
      err = dev_.Acquire(w_ + j);
      if (err.failure()) return err;
    }
    std::vector<const float*> srcs(q_);
    return SumOwnedChunks(s, announce, [&](int64_t lo, int64_t hi, const int64_t* order) {
      for (int64_t t = 0; t < q_; ++t)
        srcs[t] = session_.arena(order[t]) + plan_.slot(order[t], s, 0) + lo;
      return session_.shared_memory()->SumInRingOrder(own + lo, srcs.data(), q_, hi - lo,
                                                      MeanScale(plan_));
    });
  }

  // PushesInPlace (phases.h): the reduce-scatter straight from the workers'
  // gradient buffers. Once every worker has pushed piece s, this proxy sums
  // the chunks it owns (a DENSE holder: the whole piece) from all of them:
  // each proxy's clients in client order, the proxies in the ring's order,
  // as OneShotReduceScatter sums the proxies' copies, so the bits are the
  // ring's.
  Status FusedReduceScatter(int64_t s, bool announce) {
    const int64_t n = plan_.piece_nelems[s];
    const bool dense = plan_.piece_holder[s] == k_;
    Status err;
    {
      TraceScope wait(session_, w_ + k_, "wait for pushes", s);
      // Its own clients' pushes first, and only those as a wait on a push:
      // a missing push then times out on the proxy it was routed to, which
      // names it, while the others wait a grace period longer (Waits).
      err = AwaitPushes(call_, k_, s);
      for (int64_t j = 0; j < q_ && err.success() && !dense; ++j)
        if (j != k_) err = AwaitPushes(call_, j, s, Session::Waits::kPeer);
    }
    if (err.failure()) return err;
    auto pushes_to = [&](int64_t j) {
      std::vector<const PushedRuns*> runs;
      for (int32_t w : plan_.contributors_of(j, s)) runs.push_back(&session_.pushed_runs(w, s));
      return runs;
    };
    for (int64_t w = 0; w < w_; ++w) {
      err = dev_.Acquire(w);
      if (err.failure()) return err;
    }
    TraceScope span(session_, w_ + k_, "reduce-scatter", s, RingBytes(s));
    float* own = Own(s);
    SharedMemory& sums = *session_.shared_memory();  // fused_: GatherPull, so there is one
    if (dense) return sums.SumPushesInRingOrder(own, 0, n, {pushes_to(k_)}, MeanScale(plan_));
    std::vector<std::vector<const PushedRuns*>> groups(q_);
    return SumOwnedChunks(s, announce, [&](int64_t lo, int64_t hi, const int64_t* order) {
      for (int64_t t = 0; t < q_; ++t) groups[t] = pushes_to(order[t]);
      return sums.SumPushesInRingOrder(own + lo, lo, hi, groups, MeanScale(plan_));
    });
  }

  // The one-pass reduce-scatters' common part: `sum(lo, hi, order)` for each
  // chunk [lo, hi) of piece s this proxy owns (the ring's: chunk (position +
  // 1) % p of each half), `order` the proxies in the order the ring adds the
  // chunk (from position c onwards: c, c + 1, ..., c - 1, this proxy). Then
  // publishes, and with `announce` tells every device the chunks are final.
  Status SumOwnedChunks(int64_t s, bool announce,
                        const std::function<Status(int64_t, int64_t, const int64_t*)>& sum) {
    const int64_t n = plan_.piece_nelems[s];
    std::vector<int64_t> order(q_);
    for (int r = 0; r < 2; ++r) {
      int64_t lo, hi;
      const int64_t c = OwnedChunk(r, k_, q_, n, &lo, &hi);
      if (hi <= lo) continue;
      RingAddOrder(r, c, q_, order.data());
      Status err = sum(lo, hi, order.data());
      if (err.failure()) return err;
    }
    Status err = dev_.Publish();
    if (err.failure() || !announce) return err;
    const int32_t last = static_cast<int32_t>(q_ - 1);  // what the ring's last step leaves
    for (int r = 0; r < 2; ++r)
      session_.proxy_progress(k_, s, r).store(last, std::memory_order_release);
    return Status::Success();
  }

  // After ReduceScatter: the optimizer on the owned chunks (parameter
  // pieces), then the all-gather (or, for a DENSE piece, the copy from its
  // holder / the holder's announcement). `announce`: the reduce-scatter did
  // not announce the owned chunks (they changed since, or were replaced).
  // Then, for a proxy in host memory, its ready flag of s: the piece is
  // final here, and the workers' streams that wait for it may copy it back.
  // `batch`: a DENSE piece this proxy holds is announced with the next
  // one (the caller finishes that next, with no wait: NextIsHere).
  Status Finish(const RingGroup& g, bool update, bool announce, bool batch = false) {
    Status err = FinishPiece(g, update, announce);
    if (err.success() && !batch) err = AnnounceHeld();
    if (err.failure()) return err;
    for (int64_t t = g.first; t < g.first + g.count; ++t) FlagInOrder(t);
    return err;
  }

  // A proxy in host memory's ready flags are written in ascending piece
  // order, each once every piece before it is final too (with clipping the
  // pieces not updated finish before the global norm, ahead of updated ones
  // before them): a pull waits once, for the last flag of a group of pieces
  // (pull_pieces.cc).
  void FlagInOrder(int64_t s) {
    if (session_.ready_flag(k_, s) == nullptr) return;
    if (final_.empty()) final_.assign(plan_.num_pieces(), false);
    final_[s] = true;
    for (; flagged_ < plan_.num_pieces() && final_[flagged_]; ++flagged_)
      WriteFlag(session_.ready_flag(k_, flagged_), session_.ready_value());
  }

  Status FinishPiece(const RingGroup& g, bool update, bool announce) {
    const int64_t s = g.first;
    const int64_t n = plan_.piece_nelems[s];
    // Every pull reads the holder's copy in place: nothing to copy.
    if (copies_from_holder(s) && gather_pull_) return FinalGroup(g);
    if (copies_from_holder(s)) {
      TraceScope copy(session_, w_ + k_, "copy from the holder", s);
      const int32_t holder = plan_.piece_holder[s];
      // Not part of the emulated system: this copy only keeps every device's
      // outputs identical, so it is not charged to any link.
      Status err = session_.Wait(
          call_.who, Session::Waits::kPeer, [&] { return session_.IsReduced(holder, s); },
          [&] {
            return "proxy " + std::to_string(holder) + " to reduce " + plan_.DescribePiece(s);
          });
      if (err.failure()) return err;
      session_.AdvanceTo(w_ + k_, session_.ReducedAt(holder, s));
      err = dev_.Acquire(w_ + holder);
      if (err.failure()) return err;
      err =
          dev_.CopyFrom(Own(s), session_.arena(holder) + plan_.slot(holder, s, 0), w_ + holder, n);
      if (err.failure()) return err;
      err = dev_.Publish();
      if (err.failure()) return err;
      session_.MarkReduced(k_, s);
      return FinalGroup(g);
    }
    if (update) {
      Status err = AwaitUpdateInputs(call_, dev_, *update_);
      if (err.failure()) return err;
      TraceScope opt(session_, w_ + k_, "optimizer", s);
      // A group's pieces half by half: each half's chunks are rows of one
      // launch (StreamDevice::ApplyOptimizer); the same arithmetic per element.
      const bool delayed = update_->spec->delayed;
      for (int half = delayed || g.count == 1 ? -1 : 0; half < 2 && err.success();
           half = half < 0 ? 2 : half + 1)
        for (int64_t t = s; t < s + g.count && err.success(); ++t)
          err = delayed ? TakePending(call_, dev_, *update_, t, Own(t))
                        : ApplyOptimizer(call_, dev_, *update_, t, Own(t), half);
      if (err.failure()) return err;
    }
    if (plan_.piece_holder[s] == k_) {
      // Announced with the pieces after it that are already here (work per
      // push, not per piece: one publication, and on a GPU one optimizer
      // launch for all of them, StreamDevice::ApplyOptimizer).
      held_.push_back(s);
      return Status::Success();
    } else {
      const RingMember m = GroupMember(session_, k_, g);
      if (announce) {
        Status err = RingAnnounceOwned(session_, dev_, m);
        if (err.failure()) return err;
      }
      // Every worker pulls this proxy's owned chunks of s (PullWakeups).
      if (gather_pull_) return FinalGroup(g);
      TraceScope ring(session_, w_ + k_, "all-gather", s, RingBytes(s) * g.count);
      Status err = RingAllGather(session_, dev_, call_.who, n, m, GroupStepWhat(plan_, k_, g));
      if (err.failure()) return err;
    }
    return FinalGroup(g);
  }

  // The group's pieces are final here for the pulls that read them: the
  // pulls are woken once their pull group is (PullWakeups).
  Status FinalGroup(const RingGroup& g) {
    for (int64_t t = g.first; t < g.first + g.count; ++t) pulls_.Final(session_, t);
    return Status::Success();
  }

  // Publishes the pieces this proxy holds (DENSE) and finished but has not
  // announced yet, then marks them reduced and wakes their clients.
  Status AnnounceHeld() {
    if (held_.empty()) return Status::Success();
    Status err = dev_.Publish();
    if (err.failure()) return err;
    for (int64_t s : held_) session_.MarkReduced(k_, s);
    for (int64_t s : held_) pulls_.Final(session_, s);
    held_.clear();
    return Status::Success();
  }

  // Across hosts (exchange_owned.h).
  Status Exchange(const HostsStage& hosts, bool to_hosts) {
    return ExchangeOwned(session_, dev_, k_, hosts, to_hosts);
  }

  // Whether piece s + 1 is one this proxy holds whose pushes have all
  // arrived, so finishing it now costs no wait: s's announcement can go
  // with it. Not on emulated links, whose schedule books each piece when it
  // is reduced.
  bool NextIsHere(int64_t s) const {
    const int64_t t = s + 1;
    if (session_.emulated() || t >= plan_.num_pieces() || plan_.piece_holder[t] != k_) return false;
    const auto expected = static_cast<int32_t>(plan_.contributors_of(k_, t).size());
    return session_.arrived(k_, t).load(std::memory_order_acquire) >= expected;
  }

 private:
  float* Own(int64_t s) { return session_.arena(k_) + plan_.slot(k_, s, 0); }

  // Bytes one member receives in one half of a ring all-reduce of piece s
  // (p - 1 chunks of n / p elements, on the wire in the leaves' dtypes).
  int64_t RingBytes(int64_t s) const { return q_ > 1 ? plan_.piece_nbytes[s] * (q_ - 1) / q_ : 0; }

  Call& call_;
  Device& dev_;
  ProxyUpdate* update_;
  Session& session_;
  const Plan& plan_;
  const int64_t w_, q_, k_;              // workers (proxy k is device w_ + k), proxies, this proxy
  const bool gather_pull_;               // no all-gather: the pulls read owned chunks (phases.h)
  const bool fused_;                     // the pushes are read in place (PushesInPlace, phases.h)
  PullWakeups pulls_;                    // when the pulls reading this proxy are woken
  std::vector<int64_t> held_;            // finished DENSE pieces not announced yet (AnnounceHeld)
  const std::vector<RingGroup> groups_;  // the ring's groups of pieces (ring_groups.h)
  std::vector<bool> final_;              // FlagInOrder: the pieces final here
  int64_t flagged_ = 0;                  // FlagInOrder: flags written for pieces [0, flagged_)
};

}  // namespace

Status ReducePieces(Call& call, Device& dev, ProxyUpdate* update, const HostsStage& hosts,
                    bool in_place) {
  TraceScope all(*call.session, call.device(), "proxy ring");
  PieceReducer r(call, dev, update, in_place);
  if (update && !update->from_worker && hosts.kind != HostsStage::kFromHosts) {
    TraceScope begin(*call.session, call.device(), "optimizer setup");
    Status err = BeginUpdate(call, dev, *update);
    if (err.failure()) return err;
  }
  const bool clip = update && update->spec->clip_norm > 0;
  if (update && update->spec->delayed) {
    if (clip || hosts.kind != HostsStage::kWhole)
      return Status::InvalidArgument(
          "coarse_jax: a delayed update runs on one host without global-norm clipping");
    Status err = ApplyPending(call, dev, *update);  // overlaps the workers' forward
    if (err.failure()) return err;
  }
  auto global_norm = [&] {
    Status err = AwaitUpdateInputs(call, dev, *update);
    if (err.failure()) return err;
    TraceScope norm(*call.session, call.device(), "global norm");
    return ClipByGlobalNorm(call, dev, *update);
  };
  switch (hosts.kind) {
    case HostsStage::kToHosts:
      for (const RingGroup& g : r.groups()) {
        Status err = r.ReduceScatter(g, /*announce=*/false);
        if (err.failure()) return err;
      }
      return r.Exchange(hosts, /*to_hosts=*/true);
    case HostsStage::kFromHosts: {
      Status err = r.Exchange(hosts, /*to_hosts=*/false);
      if (err.success() && clip) err = global_norm();
      for (size_t i = 0; i < r.groups().size() && err.success(); ++i)
        err = r.Finish(r.groups()[i], r.updates(r.groups()[i].first), true);
      if (err.failure()) return err;
      break;
    }
    case HostsStage::kWhole: {
      for (const RingGroup& g : r.groups()) {
        const bool upd = r.updates(g.first);  // the same for every piece of g
        Status err = r.ReduceScatter(g, !upd);
        if (err.failure()) return err;
        if (clip && upd) continue;  // finished below, once the global norm is known
        err = r.Finish(g, upd, upd, /*batch=*/!clip && r.NextIsHere(g.first + g.count - 1));
        if (err.failure()) return err;
      }
      if (clip) {
        Status err = global_norm();
        // All here now: the held pieces announced once, with the last (batch).
        const auto& gs = r.groups();
        int64_t last = static_cast<int64_t>(gs.size()) - 1;
        while (last >= 0 && !r.updates(gs[last].first)) --last;
        for (int64_t i = 0; i < static_cast<int64_t>(gs.size()) && err.success(); ++i)
          if (r.updates(gs[i].first)) err = r.Finish(gs[i], true, true, /*batch=*/i < last);
        if (err.failure()) return err;
      }
      break;
    }
  }
  if (update) {
    // A proxy that owns nothing to update never waited for its worker's
    // setup: wait now, so the store is held by this session (Enter, by
    // worker k) before it counts as applied in it.
    Status err = AwaitUpdateInputs(call, dev, *update);
    if (err.success()) err = KeepUnapplied(call, dev, *update);
    if (err.failure()) return err;
    update->store->MarkApplied();
  }
  return Status::Success();
}

}  // namespace coarse
