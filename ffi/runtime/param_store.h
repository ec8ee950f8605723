// The proxies as parameter storage: the f32 master weights and optimizer
// state of one `coarse.value_and_update` site, in runtime-owned memory on the
// proxy devices (no XLA buffer: workers hold none of it).
//
// Ownership follows the ring: after a piece's reduce-scatter, proxy k holds
// the full mean gradient of one chunk per ring (chunk (position + 1) % q of
// each half, ring.h), or of the whole piece if it is its DENSE holder. It
// updates exactly those elements, so each of the q proxies stores 1/q of the master and
// state, and the ring's all-gather then circulates parameters, not gradients.
//
// Never silently wrong (docs/guides/parameter_storage.md):
//   * one session at a time holds the store (Enter); it is the next one to
//     update only after the previous one closed, committed or not;
//   * double-buffered: an update reads the committed buffer and writes the
//     other; the session's close commits (flips the buffers, counts the step)
//     only if every device finished the session and every proxy applied its
//     update, so a failed step leaves the previous version;
//   * the first step seeds the master from the params it is given; a later
//     step whose params differ from what the store returned is refused
//     (phases/update_pieces.cc), unless state was loaded (Load) or reset.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/optimizer_math.h"
#include "runtime/device.h"
#include "runtime/plan.h"
#include "runtime/session.h"
#include "runtime/status.h"
#include "runtime/storage.h"

namespace coarse {

struct Who;

// The optimizer of a value_and_update call, from its attributes.
struct OptimizerSpec {
  OptKind kind = OptKind::kSgd;
  float b1 = 0, b2 = 0, eps = 0, weight_decay = 0, momentum = 0;
  double one_minus_b1 = 1, one_minus_b2 = 1;  // as Python computes them
  bool nesterov = false;
  float clip_norm = 0;         // 0: no clipping
  int64_t snapshot_every = 0;  // Config.snapshot_every: 0 off
  // The one-step delayed update (value_and_update(delayed=True)): a call's
  // gradients are applied at the start of the next call's proxy job, while
  // its workers run forward and backward; the call returns the params of the
  // update before (phases/update_pieces.cc, ApplyPending).
  bool delayed = false;
  // Per plan leaf (sync order): bit 0 the leaf is a parameter the optimizer
  // updates (the loss is not), bit 1 weight decay applies to it.
  std::vector<uint8_t> leaf_flags;
  int32_t slots() const { return OptSlots(kind, momentum); }
  bool updated(int64_t leaf) const { return leaf_flags[leaf] & 1; }
  bool decayed(int64_t leaf) const { return leaf_flags[leaf] & 2; }
  // Whether piece `s` of `plan` holds parameters (pieces never mix groups).
  bool updates_piece(const Plan& plan, int64_t s) const {
    return updated(plan.segments[plan.piece_seg_begin[s]].leaf);
  }
};

// After a proxy's state: an update's lr, bc1, bc2 (OptScalars::step), which
// the worker setting the update up copies there from XLA's buffer; two sets,
// by the parity of the update's count (a delayed update reads the set of the
// call before while this call's worker writes the other).
constexpr int64_t kStepScalarFloats = 8;

// The floats a proxy's state takes for `owned` elements: the master and
// `slots` state values each, in two buffers (a failed step keeps the previous
// version), at least one element; with a delayed update also the pending
// gradient in two buffers and a scratch for the params check; then the
// update's scalars.
// In rows of max(1, owned) floats: [version][master, slots...], then, delayed,
// [version] pending gradient and the check's scratch (ParamStore::Row).
inline int64_t StateRows(int32_t slots, bool delayed) {
  return 2 * (1 + static_cast<int64_t>(slots)) + (delayed ? 3 : 0);
}
inline int64_t StateFloats(int32_t slots, int64_t owned, bool delayed = false) {
  return StateRows(slots, delayed) * (owned > 1 ? owned : 1) + kStepScalarFloats;
}

// Elements [lo, hi) of piece `piece`, stored at `off` in the owner's buffers.
struct OwnedRange {
  int64_t piece, lo, hi, off;
};

// The ranges of the update pieces proxy k owns (see the top of this file).
std::vector<OwnedRange> OwnedRanges(const Plan& plan, const OptimizerSpec& spec, int64_t k);
// The same for every piece (parameters or not): what proxy k hands to the
// sum over hosts between its reduce-scatter and all-gather
// (coarse_jax/_ffi/layout.py reads their sizes through plan_layout).
std::vector<OwnedRange> ExchangeRanges(const Plan& plan, int64_t k);

// State in host memory, per parameter leaf (sync order): what export returns
// and load takes. values[0] is the master, values[1..] the state slots.
struct HostState {
  int64_t count = 0;
  int32_t slots = 0;
  std::vector<int64_t> leaves;                          // plan leaf ids, sync order
  std::vector<std::vector<std::vector<float>>> values;  // [1 + slots][leaf][element]
};

class ParamStore : public SessionHold, public std::enable_shared_from_this<ParamStore> {
 public:
  ParamStore(int64_t id, std::string name) : id_(id), name_(std::move(name)) {}

  // Holds the store for `session` (idempotent), after waiting for the
  // previous session to close; the wait has the session's deadline.
  Status Enter(const std::shared_ptr<Session>& session, const Who& who);
  // Ends `session`'s hold (no-op if it holds none): commits when `ok` and
  // every proxy applied its update (MarkApplied).
  void Close(const Session* session, bool ok) override;

  // Under the hold, by each proxy: lays the buffers out for the session's
  // plan and optimizer (once per session; a changed plan moves the state).
  Status Prepare(Session& session, const OptimizerSpec& spec);

  // How proxies fill the committed buffer before updating (decided by Prepare).
  enum class Seed { kNone, kFromParams, kFromHost };
  Seed seed() const { return seed_; }
  // Seed::kFromHost: copies proxy k's owned part of the host state into its
  // committed buffer (a blocking host-to-device copy; rare: after a load).
  Status SeedFromHost(int64_t k);
  // Updates applied so far (optax's count), as committed.
  int64_t count() const { return host_seed_ ? host_seed_->count : count_; }
  // The count of the update this session's gradients make (optax's count
  // before it): count(), or with a gradient pending (delayed, applied by this
  // session first) count() + 1.
  int64_t update_count() const { return count() + (has_pending_ ? 1 : 0); }
  // Delayed: whether this session starts by applying the previous call's
  // gradients (decided by Prepare).
  bool applies_pending() const { return applies_pending_; }

  const std::vector<OwnedRange>& owned(int64_t proxy) const { return owned_[proxy]; }
  int64_t owned_nelems(int64_t proxy) const { return owned_nelems_[proxy]; }
  // Proxy `proxy`'s buffer `which` (0 committed, 1 the one this step writes),
  // slot 0 the master, 1.. the optimizer state.
  float* buf(int64_t proxy, int which, int32_t slot);
  // Proxy `proxy`'s copy of the lr, bc1, bc2 of the update with count
  // `count`, in the same memory as its buffers.
  float* step_scalars(int64_t proxy, int64_t count);
  // Delayed: proxy `proxy`'s pending gradient (`which` 0: the previous
  // call's, committed; 1: this call's), and the params check's scratch.
  float* pending(int64_t proxy, int which);
  float* check_scratch(int64_t proxy);
  void MarkApplied();

  // Snapshots (docs/guides/snapshots.md): a third copy of master and state per
  // proxy, of the committed version at a step boundary. A commit whose count
  // is a multiple of snapshot_every makes one due; each proxy copies its part
  // at the start of its next update (while the workers are still in their
  // backward pass), from the committed buffer, which that update only reads.
  // The snapshot counts once every proxy copied; until then (or if a failed
  // step stopped some proxy first) there is none, never a mixed one.
  // TakeSnapshotTurn: whether proxy `k`'s update must copy now.
  bool TakeSnapshotTurn(const Session& session);
  // The copy for proxy k (device-side, from BeginUpdate).
  Status CopySnapshot(Device& dev, int64_t k);
  void SnapshotCopied();
  // Between steps: copy the committed version now (no step may hold the store).
  Status SnapshotNow();
  // Completed snapshots so far (the writer thread polls it; 0 while none is
  // valid) and the newest's optimizer step count.
  int64_t snapshot_serial();
  int64_t snapshot_count();
  // Between steps: whether the next update copies a snapshot (a commit made
  // one due and it has not been taken). The writer's pacing reads it
  // (coarse_jax/api/snapshots.py: a snapshot is on disk before the next is taken).
  bool snapshot_due();
  // The newest snapshot, to the host (as Export), or nothing. `for_writer`:
  // the snapshot writer takes it (see AttachWriter).
  StatusOr<std::optional<HostState>> ExportSnapshot(bool for_writer = false);
  // A writer (Config.snapshot_dir) writes this store's snapshots to disk.
  // From now on an update never copies a due snapshot over one the writer
  // has not taken yet (ExportSnapshot(for_writer=true)): the copy is
  // deferred to a later update, which keeps it due. The loop's pacing
  // (coarse_jax/api/snapshots.py) waits for the writer before the update
  // that takes a snapshot, but cannot see a snapshot taken by a step still
  // in flight; this keeps that one from being lost.
  void AttachWriter();

  // Between steps (Python): export the committed state, load one, forget it.
  // Export returns nothing when no step has committed and nothing is loaded.
  StatusOr<std::optional<HostState>> Export();
  void Load(HostState state);
  void Reset();
  // Bytes on each proxy (both buffers), for coarse.diagnostics.memory_report.
  std::vector<int64_t> ProxyBytes();
  const std::string& name() const { return name_; }

 private:
  StatusOr<HostState> ExportLocked(bool snapshot);
  // Row `row` of proxy `proxy`'s buffer (StateRows' layout).
  float* Row(int64_t proxy, int64_t row);
  int Version(int which) const { return which == 0 ? front_ : 1 - front_; }
  bool EnsureSnapshotBuffersLocked(const std::vector<int64_t>& ordinals);

  const int64_t id_;
  const std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  const Session* held_by_ = nullptr;
  std::vector<std::pair<std::weak_ptr<Session>, int64_t>> waiters_;  // (session, device)
  int64_t applied_ = 0;  // proxies that applied their update in the held session
  const Session* prepared_session_ = nullptr;  // Prepare ran for it

  // Layout: for `plan_`, `slots_` state slots per element.
  std::shared_ptr<const Plan> plan_;
  int32_t slots_ = -1;
  OptimizerSpec spec_;
  std::vector<std::vector<OwnedRange>> owned_;
  std::vector<int64_t> owned_nelems_;
  std::vector<std::unique_ptr<StateBuffer>> buffers_;  // [proxy]: [which][slot][owned]
  int front_ = 0;
  int64_t count_ = 0;
  bool seeded_ = false;
  bool delayed_ = false;          // the layout has the pending gradient (OptimizerSpec::delayed)
  bool has_pending_ = false;      // a committed gradient waits for its update
  bool applies_pending_ = false;  // this session applies it (Prepare)
  std::optional<HostState> host_seed_;
  Seed seed_ = Seed::kNone;

  // Snapshots (see TakeSnapshotTurn).
  std::vector<int64_t> ordinals_;
  std::vector<std::unique_ptr<StateBuffer>> snap_;  // [proxy]: [slot][owned]
  bool snapshot_due_ = false, snap_valid_ = false;
  bool writer_attached_ = false, snap_taken_by_writer_ = true;
  const Session* snap_deferred_ = nullptr;  // the session that found the writer behind
  const Session* snap_session_ = nullptr;
  int64_t snap_copied_ = 0, snap_base_count_ = 0, snap_count_ = 0, snap_serial_ = 0;
};

// The store of `id` (created empty on first use; `name` names it in errors).
std::shared_ptr<ParamStore> GetParamStore(int64_t id, const std::string& name);
// An existing store, or null.
std::shared_ptr<ParamStore> FindParamStore(int64_t id);
void DropParamStore(int64_t id);

}  // namespace coarse
