// The protocol's phases: what the four sync custom calls do, written once
// against the device backend (device.h) and free of XLA buffers. The handler
// files (ffi/xla/: push.cc, proxy_ring.cc, worker_ring.cc, pull.cc) translate XLA's
// operands into these calls on the workers, the service (service.h) runs the
// proxies' part; the self-test (lab/sync_selftest.h) drives both without XLA.
// One file each in runtime/phases/.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "runtime/call.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/param_store.h"
#include "runtime/session.h"
#include "runtime/shared_memory.h"
#include "runtime/status.h"

namespace coarse {

// The caller's buffer of a plan leaf.
struct LeafRef {
  void* data;
  DType dtype;
};
using LeafResolver = std::function<LeafRef(int64_t leaf)>;

// The runs of piece s's segments in the caller's leaves, each at its offset
// in the piece (buf_off), in segment order: what a push reads and a pull
// writes.
inline void RunsOfPiece(const Plan& plan, int64_t s, const LeafResolver& leaf_of,
                        std::vector<LeafRun>& runs) {
  runs.clear();
  for (int64_t g = plan.piece_seg_begin[s]; g < plan.piece_seg_begin[s + 1]; ++g) {
    const Segment& seg = plan.segments[g];
    const LeafRef leaf = leaf_of(seg.leaf);
    runs.push_back(LeafRun{ElementPtr(leaf.data, leaf.dtype, seg.leaf_off), leaf.dtype, seg.len,
                           seg.piece_off});
  }
}

// coarse_push: a worker pushes pieces [first_piece, first_piece + num_pieces)
// (phases/push_pieces.cc). `in_place`: the caller keeps the leaves alive
// until its pull (PushesInPlace).
Status PushPieces(Call& call, Device& dev, int64_t first_piece, int64_t num_pieces,
                  const LeafResolver& leaf_of, bool in_place = false);

// What a proxy needs to run the optimizer in its ring (coarse_proxy_ring of
// a value_and_update; phases/update_pieces.cc).
struct ProxyUpdate {
  std::shared_ptr<ParamStore> store;
  const OptimizerSpec* spec;
  float lr, bc1, bc2;   // this step's, when no XLA buffer holds them (the self-test)
  LeafResolver params;  // the proxy's copy of the step's params (plan leaf ids)
  // Worker k: XLA's f32[3] (lr, bc1, bc2) of this step, in its device's
  // memory, which BeginUpdateForProxy copies beside proxy k's state
  // (ParamStore::step_scalars) for the kernels to read (OptScalars::step):
  // no host reads them. Proxy k: `step` points at that copy.
  const float* scalars_in = nullptr;
  const float* step = nullptr;
  // Whether BeginUpdate compares the params with the master (a step whose
  // caller vouches they are what the store returned skips it: on a GPU the
  // check's result is a read the host waits for).
  bool check_params = true;
  float norm = 1.0f;  // global gradient norm (clip_norm > 0 only)
  bool clip = false;  // clipping applies this step
  // Where norm and clip lie in the proxy's device memory instead, for the
  // kernels to read (OptScalars::clip_at): clipping kept on the device.
  const float* clip_at = nullptr;
  // The proxy runs as a service (runtime/service.h): its local worker ran
  // BeginUpdate for it and posts lr, bc1, bc2 (Session::PostUpdateInputs);
  // `params` is unset. AwaitUpdateInputs fills them (or `step`) in.
  bool from_worker = false;
  bool inputs = false;  // from_worker: the worker's inputs have arrived
};

// Across hosts (coarse_jax/api/_hosts.py), the proxy ring of a
// value_and_update runs as two calls with an XLA collective in between:
// kToHosts reduce-scatters every piece and writes the chunks this proxy
// owns (ExchangeRanges, param_store.h) into `chunks`; XLA sums them over the
// hosts; kFromHosts reads the global chunks back from `chunks`, updates and
// all-gathers. kWhole is the ring of one host.
struct HostsStage {
  enum Kind { kWhole, kToHosts, kFromHosts } kind = kWhole;
  float* chunks = nullptr;  // f32[width], an XLA buffer of this device
  int64_t width = 0;
};

// coarse_proxy_ring: a proxy reduces every piece with the other proxies
// (phases/reduce_pieces.cc); with `update`, runs the optimizer on the
// parameter chunks it owns between reduce-scatter and all-gather.
Status ReducePieces(Call& call, Device& dev, ProxyUpdate* update, const HostsStage& hosts = {},
                    bool in_place = false);

// The proxy optimizer's parts of ReducePieces (phases/update_pieces.cc).
// Holds the store, lays it out and seeds it, or checks the given params
// against it.
Status BeginUpdate(Call& call, Device& dev, ProxyUpdate& update);
// Turns the mean gradient in `own` (piece s's accumulator) into new
// parameters on the ranges this proxy owns, updating its master and state;
// with `half` 0 or 1 only the range of ring `half`'s half of the piece (a
// ring group updates one half of all its pieces, then the other: rows of one
// launch each, StreamDevice::ApplyOptimizer).
Status ApplyOptimizer(Call& call, Device& dev, const ProxyUpdate& update, int64_t s, float* own,
                      int half = -1);
// The one-step delayed update (OptimizerSpec::delayed), proxy k's parts:
// ApplyPending, first in its job (while the workers run forward and
// backward): holds and lays out the store, then, with a gradient pending,
// applies it (the previous call's scalars). TakePending, per piece in place of
// ApplyOptimizer: keeps the owned chunks of this call's gradient as the new
// pending one and puts the weights to hand out in their place. KeepUnapplied,
// at the end of a call that applied nothing: the version it commits is the
// committed one.
Status ApplyPending(Call& call, Device& dev, ProxyUpdate& update);
Status TakePending(Call& call, Device& dev, const ProxyUpdate& update, int64_t s, float* own);
Status KeepUnapplied(Call& call, Device& dev, const ProxyUpdate& update);
// Every proxy posts the squares of the gradient chunks it owns; once all
// have, sets update.clip_at (NormOnDevice: the sums and the clip scalars stay
// on the devices, no host synchronization) or, for proxies in host memory,
// update.norm / update.clip.
Status ClipByGlobalNorm(Call& call, Device& dev, ProxyUpdate& update);

// With ProxyUpdate::from_worker: waits until proxy k's local worker has set
// the store up and posted this step's scalars, and takes them (once); then
// the proxy's device waits for that worker's work (Device::Acquire): on a
// device with streams the worker's writes to the store (the seeded master,
// the snapshot copy) are still in its stream when the scalars are posted.
Status AwaitUpdateInputs(Call& call, Device& dev, ProxyUpdate& update);
// Worker k's part of proxy k's update (coarse_proxy_ring on a worker, the
// proxies being a service): BeginUpdate as proxy k with the params the step
// got, then Session::PostUpdateInputs.
Status BeginUpdateForProxy(Call& call, Device& dev, ProxyUpdate& update);

// coarse_opt_count: the step count the next update of a store is (the
// caller, worker k, holds the store for proxy k: it waits for the previous
// update to close; phases/update_pieces.cc).
StatusOr<int64_t> OptimizerCount(Call& call, ParamStore& store);

// coarse_worker_ring: a worker gathers `in_runs` (the leading leaves) into
// its scratch, ring-reduces it with the other workers, and scatters the
// result into `out_runs` chunk by chunk as the ring finishes it
// (phases/reduce_leading.cc).
Status ReduceLeading(Call& call, Device& dev, const std::vector<LeafRun>& in_runs,
                     const std::vector<LeafRun>& out_runs);
// Worker `who` runs both rings over the workers' scratch. `values_ready`:
// when its starting values existed (RingMember); `on_final(lo, hi)`: called
// as each range of the scratch becomes final.
Status WorkerRingAllReduce(Session& session, Device& dev, const Who& who,
                           std::optional<Clock::time_point> values_ready,
                           const std::function<Status(int64_t, int64_t)>& on_final);

// The shared-memory strategy's shortcuts (runtime/shared_memory.h), each
// taken for a whole session or not at all, as Session::shared_memory was
// chosen when the session was created.
//
// GatherPull: the session skips the proxies' all-gather. After the
// reduce-scatter every proxy owns its chunks of each piece (ring.h), and
// every device's pull reads them in place from all the proxies, straight
// into its outputs: the all-gather's copies into the proxies' storage,
// 2(p-1)/p of every piece per proxy, are not made. DENSE pieces are read
// from their holder alike. (Not with emulated links, whose schedule is the
// paper's: all-gather on the proxy links, then each worker pulls from its
// proxy; the session then has no strategy.)
inline bool GatherPull(const Session& session) { return session.shared_memory() != nullptr; }

// OneShotLeading: the workers reduce their leading layers in one pass
// instead of the ring (phases/reduce_leading.cc). Each worker publishes
// where its leading leaves lie, sums the ring's chunks it would own straight
// from every worker's leaves, in the ring's order (the ring's bits), and
// once all have, narrows every owner's chunks into its outputs. p R + p W of
// widening and 3(p - 1) R + 2(p - 1) W of ring steps become p R + 1 W of
// sums (in units of the leading layers' f32 bytes; the pulls' p R + p W
// stay).
inline bool OneShotLeading(const Session& session) {
  return session.plan().workers > 1 && GatherPull(session);
}

// PushesInPlace: the proxies read the workers' pushes in place instead of a
// copy (the fused push), when the three calls of the sync say `in_place`
// (attribute push_in_place), which the Python side sets only when the pull
// takes every pushed leaf as an operand, so each push's buffers stay alive
// (and unwritten) until the worker's pull. A push then only publishes its
// runs (Session::pushed_runs) and never waits; each proxy sums the chunks it
// owns straight from all the workers' buffers, in the ring's order
// (SharedMemory::SumPushesInRingOrder); a worker's pull overwrites a piece
// (its outputs may alias the pushed leaves) only once every proxy has
// reduced it. The copy of every gradient into the proxies' storage, p·n
// written per step, is not made.
inline bool PushesInPlace(const Session& session, bool in_place) {
  return in_place && GatherPull(session);
}

// The most floats of consecutive pieces that a pull waits for as one group
// (4 MiB of f32): a proxy in host memory's flags are waited for on the
// stream once per group (phases/pull_pieces.cc), and a pull waiting on the
// host is woken once per group and proxy (phases/reduce_pieces.cc). Smaller
// pieces make more pieces per group, not more groups, so halving
// shard_bytes changes neither count; a larger step still pulls group by
// group as the proxies make them final.
inline constexpr int64_t kPullGroupFloats = int64_t{1} << 20;

// The plan's pieces in such groups: consecutive pieces in the plan's order,
// a new group where the next piece would pass kPullGroupFloats.
struct PullGroupsOf {
  std::vector<int64_t> of;    // per piece: its group
  std::vector<int64_t> size;  // per group: its pieces
};
inline PullGroupsOf PullGroups(const Plan& plan) {
  PullGroupsOf g;
  int64_t floats = 0;
  for (int64_t s = 0; s < plan.num_pieces(); ++s) {
    if (g.size.empty() || floats + plan.piece_nelems[s] > kPullGroupFloats) {
      g.size.push_back(0);
      floats = 0;
    }
    floats += plan.piece_nelems[s];
    ++g.size.back();
    g.of.push_back(static_cast<int64_t>(g.size.size()) - 1);
  }
  return g;
}

// coarse_pull: a worker writes the reduced proxy pieces into its leaves
// (phases/pull_pieces.cc). With `pushed` (in-place pushes, PushesInPlace) a
// worker first checks that its pushed leaves are where it pushed them from.
Status PullPieces(Call& call, Device& dev, const LeafResolver& leaf_of,
                  const LeafResolver* pushed = nullptr);

}  // namespace coarse
