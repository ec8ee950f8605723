// ParamStore (see param_store.h): layout, hold and commit, export and load.
#include "runtime/param_store.h"

#include <algorithm>
#include <map>

#include "runtime/ring.h"
#include "runtime/session.h"

namespace coarse {

namespace {

// The chunks proxy k holds fully reduced after the reduce-scatter, of the
// pieces `include` accepts, laid end to end.
template <typename Include>
std::vector<OwnedRange> RangesAfterReduceScatter(const Plan& plan, int64_t k, Include&& include) {
  const int64_t q = plan.proxies;
  std::vector<OwnedRange> out;
  int64_t off = 0;
  auto add = [&](int64_t s, int64_t lo, int64_t hi) {
    if (hi <= lo) return;
    out.push_back(OwnedRange{s, lo, hi, off});
    off += hi - lo;
  };
  for (int64_t s = 0; s < plan.num_pieces(); ++s) {
    if (!include(s)) continue;
    const int64_t n = plan.piece_nelems[s];
    if (plan.piece_holder[s] >= 0) {
      if (plan.piece_holder[s] == k) add(s, 0, n);
      continue;
    }
    for (int r = 0; r < 2; ++r) {
      int64_t lo, hi;
      OwnedChunk(r, k, q, n, &lo, &hi);
      add(s, lo, hi);
    }
  }
  return out;
}

}  // namespace

std::vector<OwnedRange> OwnedRanges(const Plan& plan, const OptimizerSpec& spec, int64_t k) {
  return RangesAfterReduceScatter(plan, k, [&](int64_t s) { return spec.updates_piece(plan, s); });
}

std::vector<OwnedRange> ExchangeRanges(const Plan& plan, int64_t k) {
  return RangesAfterReduceScatter(plan, k, [](int64_t) { return true; });
}

Status ParamStore::Enter(const std::shared_ptr<Session>& session, const Who& who) {
  auto take = [&] {  // mu_ held
    if (held_by_ != nullptr && held_by_ != session.get()) return false;
    if (held_by_ == nullptr) {
      held_by_ = session.get();
      applied_ = 0;
      session->set_store(shared_from_this());
    }
    return true;
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (take()) return Status::Success();
    waiters_.emplace_back(session, who.device(session->p()));
  }
  return session->Wait(
      who, Session::Waits::kPeer,
      [&] {
        std::lock_guard<std::mutex> lock(mu_);
        return take();
      },
      [&] {
        return "the previous step's optimizer update of '" + name_ +
               "' to finish on every device (the proxies update one step at a time)";
      });
}

void ParamStore::Close(const Session* session, bool ok) {
  std::vector<std::pair<std::weak_ptr<Session>, int64_t>> wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (held_by_ != session) return;
    if (ok && prepared_session_ == session && plan_ && applied_ == plan_->proxies) {
      front_ ^= 1;
      // A delayed store's first call (or first after a load or reset)
      // applies nothing: it only leaves its gradient pending.
      count_ = count() + (!spec_.delayed || applies_pending_ ? 1 : 0);
      has_pending_ = spec_.delayed;
      seeded_ = true;
      host_seed_.reset();
      if (spec_.snapshot_every > 0 && count_ % spec_.snapshot_every == 0) snapshot_due_ = true;
    }
    snap_session_ = nullptr;  // an unfinished copy stays due; snap_valid_ says what exists
    snap_deferred_ = nullptr;
    held_by_ = nullptr;
    prepared_session_ = nullptr;
    applied_ = 0;
    wake.swap(waiters_);
  }
  for (auto& [weak, device] : wake)
    if (auto s = weak.lock()) s->Notify(device);
}

void ParamStore::MarkApplied() {
  std::lock_guard<std::mutex> lock(mu_);
  ++applied_;
}

float* ParamStore::Row(int64_t proxy, int64_t row) {
  return buffers_[proxy]->data() + row * std::max<int64_t>(1, owned_nelems_[proxy]);
}

float* ParamStore::buf(int64_t proxy, int which, int32_t slot) {
  return Row(proxy, static_cast<int64_t>(Version(which)) * (1 + slots_) + slot);
}

float* ParamStore::pending(int64_t proxy, int which) {
  return Row(proxy, StateRows(slots_, false) + Version(which));
}

float* ParamStore::check_scratch(int64_t proxy) { return Row(proxy, StateRows(slots_, false) + 2); }

float* ParamStore::step_scalars(int64_t proxy, int64_t count) {
  return Row(proxy, StateRows(slots_, delayed_)) + 4 * (count & 1);
}

Status ParamStore::Prepare(Session& session, const OptimizerSpec& spec) {
  std::lock_guard<std::mutex> lock(mu_);
  if (prepared_session_ == &session) return Status::Success();
  const Plan& plan = session.plan();
  const int64_t p = plan.workers, q = plan.proxies;
  if (host_seed_ && host_seed_->slots != spec.slots())
    return Status::InvalidArgument(
        "coarse_jax: the optimizer state loaded into '" + name_ + "' has " +
        std::to_string(host_seed_->slots) + " state slot(s) per parameter, this optimizer uses " +
        std::to_string(spec.slots()) +
        ". Fix: load the state of the same optimizer (step.load_optimizer_state), or "
        "step.reset_optimizer() to start it from the params.");
  const bool relayout = !plan_ || plan_->key != plan.key || slots_ != spec.slots() ||
                        delayed_ != spec.delayed || static_cast<int64_t>(buffers_.size()) != q;
  if (relayout && has_pending_)
    return Status(
        StatusCode::kFailedPrecondition,
        "coarse_jax: '" + name_ +
            "' holds a delayed update's pending gradient, which cannot move to another "
            "plan or optimizer (a re-plan: reprofile_every, another Config). Fix: keep the "
            "Config of a value_and_update(delayed=True) step fixed, or step.reset_optimizer() "
            "first.");
  if (relayout) {
    if (seeded_ && !host_seed_) {
      if (slots_ != spec.slots())
        return Status::InvalidArgument(
            "coarse_jax: '" + name_ + "' holds the state of an optimizer with " +
            std::to_string(slots_) + " state slot(s) per parameter; this step's optimizer uses " +
            std::to_string(spec.slots()) +
            ". Fix: step.reset_optimizer() to start the new optimizer from the params.");
      // The plan changed (a re-plan, a recompile with other routes): move
      // the state through the host into the new layout.
      auto state = ExportLocked(false);
      if (state.has_error()) return state.error();
      host_seed_ = std::move(state.value());
    }
    buffers_.clear();
    owned_.assign(q, {});
    owned_nelems_.assign(q, 0);
    for (int64_t k = 0; k < q; ++k) {
      owned_[k] = OwnedRanges(plan, spec, k);
      for (const OwnedRange& r : owned_[k]) owned_nelems_[k] += r.hi - r.lo;
      const int64_t floats = StateFloats(spec.slots(), owned_nelems_[k], spec.delayed);
      auto b = TheStoragePool().NewStateBuffer(session.ordinals(), p + k, floats);
      if (!b) {
        buffers_.clear();
        plan_.reset();
        return Status(StatusCode::kResourceExhausted,
                      "coarse_jax: could not allocate " + std::to_string(floats * 4) +
                          " bytes of optimizer state for '" + name_ + "' on proxy " +
                          std::to_string(k));
      }
      buffers_.push_back(std::move(b));
    }
    plan_ = session.shared_plan();
    slots_ = spec.slots();
    delayed_ = spec.delayed;
    front_ = 0;
    seeded_ = false;
    snap_.clear();  // laid out for the old plan: the in-memory snapshot is gone
    snap_valid_ = false;
  }
  ordinals_ = session.ordinals();
  if (host_seed_) {
    // Check the loaded state against this plan's parameters.
    std::vector<int64_t> want;
    for (int64_t leaf = 0; leaf < plan.num_proxy_leaves; ++leaf)
      if (spec.updated(leaf)) want.push_back(leaf);
    if (host_seed_->leaves != want)
      return Status::InvalidArgument("coarse_jax: the state loaded into '" + name_ + "' has " +
                                     std::to_string(host_seed_->leaves.size()) +
                                     " parameter tensors, the params have " +
                                     std::to_string(want.size()));
    for (size_t j = 0; j < want.size(); ++j)
      for (const auto& slot : host_seed_->values)
        if (static_cast<int64_t>(slot[j].size()) != plan.leaf_nelems[want[j]])
          return Status::InvalidArgument("coarse_jax: the state loaded into '" + name_ + "' has " +
                                         std::to_string(slot[j].size()) + " elements for tensor '" +
                                         plan.leaf_names[want[j]] + "', the params have " +
                                         std::to_string(plan.leaf_nelems[want[j]]));
  }
  seed_ = host_seed_ ? Seed::kFromHost : (seeded_ ? Seed::kNone : Seed::kFromParams);
  applies_pending_ = spec.delayed && has_pending_ && seed_ == Seed::kNone;
  spec_ = spec;
  prepared_session_ = &session;
  return Status::Success();
}

// For each owned range of proxy k: which leaf elements it covers.
template <typename F>
static void ForEachOwnedSegment(const Plan& plan, const std::vector<OwnedRange>& owned, F&& f) {
  for (const OwnedRange& r : owned) {
    for (int64_t g = plan.piece_seg_begin[r.piece]; g < plan.piece_seg_begin[r.piece + 1]; ++g) {
      const Segment& seg = plan.segments[g];
      const int64_t lo = std::max(r.lo, seg.piece_off),
                    hi = std::min(r.hi, seg.piece_off + seg.len);
      if (hi <= lo) continue;
      // (leaf, element offset in the leaf, offset in the owner's buffer, length)
      f(seg.leaf, seg.leaf_off + (lo - seg.piece_off), r.off + (lo - r.lo), hi - lo);
    }
  }
}

StatusOr<HostState> ParamStore::ExportLocked(bool snapshot) {
  const Plan& plan = *plan_;
  HostState out;
  out.count = snapshot ? snap_count_ : count_;
  out.slots = slots_;
  std::map<int64_t, int64_t> index;  // plan leaf -> position in out.leaves
  for (int64_t leaf = 0; leaf < plan.num_proxy_leaves; ++leaf)
    if (spec_.updated(leaf)) {
      index[leaf] = static_cast<int64_t>(out.leaves.size());
      out.leaves.push_back(leaf);
    }
  out.values.assign(1 + slots_, std::vector<std::vector<float>>(out.leaves.size()));
  for (auto& slot : out.values)
    for (size_t j = 0; j < out.leaves.size(); ++j) slot[j].resize(plan.leaf_nelems[out.leaves[j]]);
  std::vector<float> host;
  for (int64_t k = 0; k < plan.proxies; ++k) {
    const int64_t n = owned_nelems_[k];
    for (int32_t slot = 0; slot <= slots_; ++slot) {
      host.resize(n);
      StateBuffer& src = snapshot ? *snap_[k] : *buffers_[k];
      const int64_t off = snapshot ? slot * n : buf(k, 0, slot) - buffers_[k]->data();
      if (n > 0 && !src.ToHost(host.data(), off, n))
        return Status::Internal("coarse_jax: copying the optimizer state of '" + name_ +
                                "' to the host failed");
      ForEachOwnedSegment(plan, owned_[k],
                          [&](int64_t leaf, int64_t leaf_off, int64_t buf_off, int64_t len) {
                            std::copy_n(host.data() + buf_off, len,
                                        out.values[slot][index[leaf]].data() + leaf_off);
                          });
    }
  }
  return out;
}

StatusOr<std::optional<HostState>> ParamStore::Export() {
  std::lock_guard<std::mutex> lock(mu_);
  if (host_seed_) return std::optional<HostState>(*host_seed_);
  if (!seeded_) return std::optional<HostState>();
  auto state = ExportLocked(false);
  if (state.has_error()) return state.error();
  return std::optional<HostState>(std::move(state.value()));
}

void ParamStore::Load(HostState state) {
  std::lock_guard<std::mutex> lock(mu_);
  host_seed_ = std::move(state);
  has_pending_ = false;  // the loaded state is where the next update starts
  // A snapshot due from a commit before the load is of a version the load
  // replaced: the next one is due from a commit of the loaded count's line
  // (a restore to step 3 took one at step 4, snapshot_every=5, before).
  snapshot_due_ = false;
}

void ParamStore::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  host_seed_.reset();
  seeded_ = false;
  has_pending_ = false;
  count_ = 0;
  snapshot_due_ = false;
}

std::vector<int64_t> ParamStore::ProxyBytes() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> out;
  for (size_t k = 0; k < buffers_.size(); ++k) {
    int64_t n = buffers_[k]->nelems();
    if (k < snap_.size()) n += snap_[k]->nelems();
    out.push_back(n * static_cast<int64_t>(sizeof(float)));
  }
  return out;
}

bool ParamStore::EnsureSnapshotBuffersLocked(const std::vector<int64_t>& ordinals) {
  if (!plan_) return false;
  const int64_t p = plan_->workers, q = plan_->proxies;
  if (static_cast<int64_t>(snap_.size()) == q) return true;
  snap_.clear();
  for (int64_t k = 0; k < q; ++k) {
    const int64_t floats = (1 + slots_) * std::max<int64_t>(1, owned_nelems_[k]);
    auto b = TheStoragePool().NewStateBuffer(ordinals, p + k, floats);
    if (!b) {
      snap_.clear();
      return false;
    }
    snap_.push_back(std::move(b));
  }
  return true;
}

bool ParamStore::TakeSnapshotTurn(const Session& session) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!snapshot_due_ || !seeded_ || host_seed_) return false;
  if (snap_session_ == &session) return true;
  // Every proxy of a session decides alike: the writer may take the old
  // snapshot between two proxies' turns.
  if (snap_deferred_ == &session) return false;
  if (writer_attached_ && snap_valid_ && !snap_taken_by_writer_) {
    snap_deferred_ = &session;  // stays due: a later update copies it
    return false;
  }
  if (!EnsureSnapshotBuffersLocked(ordinals_)) return false;  // no memory: none taken
  snap_session_ = &session;
  snap_copied_ = 0;
  snap_valid_ = false;
  snap_base_count_ = count_;
  return true;
}

Status ParamStore::CopySnapshot(Device& dev, int64_t k) {
  const int64_t p = plan_->workers, n = owned_nelems_[k];
  for (int32_t slot = 0; slot <= slots_; ++slot) {
    Status e = dev.CopyFrom(snap_[k]->data() + slot * n, buf(k, 0, slot), p + k, n);
    if (e.failure()) return e;
  }
  return dev.Publish();
}

void ParamStore::SnapshotCopied() {
  std::lock_guard<std::mutex> lock(mu_);
  if (++snap_copied_ != plan_->proxies) return;
  snap_valid_ = true;
  snap_taken_by_writer_ = false;
  snap_count_ = snap_base_count_;
  snapshot_due_ = false;
  ++snap_serial_;
}

void ParamStore::AttachWriter() {
  std::lock_guard<std::mutex> lock(mu_);
  writer_attached_ = true;
}

Status ParamStore::SnapshotNow() {
  std::lock_guard<std::mutex> lock(mu_);
  if (held_by_ != nullptr)
    return Status(StatusCode::kFailedPrecondition,
                  "coarse_jax: '" + name_ + "': a step is updating it; snapshot between steps");
  if (!seeded_ || host_seed_)
    return Status(StatusCode::kFailedPrecondition,
                  "coarse_jax: '" + name_ + "' holds no committed state yet: run a step first");
  if (!EnsureSnapshotBuffersLocked(ordinals_))
    return Status(StatusCode::kResourceExhausted,
                  "coarse_jax: no memory for a snapshot of '" + name_ + "'");
  snap_valid_ = false;
  for (size_t k = 0; k < snap_.size(); ++k) {
    const int64_t n = owned_nelems_[k];
    for (int32_t slot = 0; slot <= slots_; ++slot)
      if (n > 0 &&
          !snap_[k]->CopyWithin(*buffers_[k], buf(k, 0, slot) - buffers_[k]->data(), slot * n, n))
        return Status::Internal("coarse_jax: copying a snapshot of '" + name_ + "' failed");
  }
  snap_valid_ = true;
  snap_taken_by_writer_ = false;
  snap_count_ = count_;
  snapshot_due_ = false;
  ++snap_serial_;
  return Status::Success();
}

int64_t ParamStore::snapshot_serial() {
  std::lock_guard<std::mutex> lock(mu_);
  return snap_valid_ ? snap_serial_ : 0;
}

bool ParamStore::snapshot_due() {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_due_ && seeded_ && !host_seed_;
}

int64_t ParamStore::snapshot_count() {
  std::lock_guard<std::mutex> lock(mu_);
  return snap_count_;
}

StatusOr<std::optional<HostState>> ParamStore::ExportSnapshot(bool for_writer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!snap_valid_) return std::optional<HostState>();
  auto state = ExportLocked(true);
  if (state.has_error()) return state.error();
  if (for_writer) snap_taken_by_writer_ = true;
  return std::optional<HostState>(std::move(state.value()));
}

Status ParamStore::SeedFromHost(int64_t k) {
  std::lock_guard<std::mutex> lock(mu_);
  const HostState& h = *host_seed_;
  std::map<int64_t, int64_t> index;
  for (size_t j = 0; j < h.leaves.size(); ++j) index[h.leaves[j]] = static_cast<int64_t>(j);
  const int64_t n = owned_nelems_[k];
  std::vector<float> host(n);
  for (int32_t slot = 0; slot <= h.slots; ++slot) {
    ForEachOwnedSegment(
        *plan_, owned_[k], [&](int64_t leaf, int64_t leaf_off, int64_t buf_off, int64_t len) {
          std::copy_n(h.values[slot][index[leaf]].data() + leaf_off, len, host.data() + buf_off);
        });
    const int64_t off = buf(k, 0, slot) - buffers_[k]->data();
    if (n > 0 && !buffers_[k]->FromHost(host.data(), off, n))
      return Status::Internal("coarse_jax: copying the loaded optimizer state of '" + name_ +
                              "' to proxy " + std::to_string(k) + " failed");
  }
  return Status::Success();
}

namespace {
std::mutex g_stores_mu;
std::map<int64_t, std::shared_ptr<ParamStore>>& Stores() {
  static auto* stores = new std::map<int64_t, std::shared_ptr<ParamStore>>;
  return *stores;
}
}  // namespace

std::shared_ptr<ParamStore> GetParamStore(int64_t id, const std::string& name) {
  std::lock_guard<std::mutex> lock(g_stores_mu);
  auto& slot = Stores()[id];
  if (!slot) slot = std::make_shared<ParamStore>(id, name);
  return slot;
}

std::shared_ptr<ParamStore> FindParamStore(int64_t id) {
  std::lock_guard<std::mutex> lock(g_stores_mu);
  auto it = Stores().find(id);
  return it == Stores().end() ? nullptr : it->second;
}

void DropParamStore(int64_t id) {
  std::shared_ptr<ParamStore> dropped;
  {
    std::lock_guard<std::mutex> lock(g_stores_mu);
    auto it = Stores().find(id);
    if (it == Stores().end()) return;
    dropped = std::move(it->second);
    Stores().erase(it);
  }
}

}  // namespace coarse
