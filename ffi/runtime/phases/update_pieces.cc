// The proxy optimizer inside a proxy's ring (see phases.h, param_store.h).
//
// BeginUpdate: hold the store (one update at a time), lay it out for this
// plan, then either seed the committed buffer (first step: from the params;
// after a load or a re-plan: from the host) or check that the params the
// step got are the ones the store returned last time, so the master and the
// workers' copy never silently part ways.
// ApplyOptimizer: per owned range, per leaf segment (weight-decay masks are
// per leaf), one Device::ApplyOptimizer that reads the committed buffer and
// writes the other; the session's close commits (ParamStore::Close).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/faults.h"
#include "runtime/host_memory.h"
#include "runtime/phases.h"
#include "runtime/trace.h"

namespace coarse {

namespace {

// Calls f(leaf, leaf_off, piece_off, len) for the parts of piece r.piece's
// segments inside [r.lo, r.hi).
template <typename F>
Status ForSegments(const Plan& plan, const OwnedRange& r, F&& f) {
  for (int64_t g = plan.piece_seg_begin[r.piece]; g < plan.piece_seg_begin[r.piece + 1]; ++g) {
    const Segment& seg = plan.segments[g];
    const int64_t lo = std::max(r.lo, seg.piece_off), hi = std::min(r.hi, seg.piece_off + seg.len);
    if (hi <= lo) continue;
    Status e = f(seg.leaf, seg.leaf_off + (lo - seg.piece_off), lo, hi - lo);
    if (e.failure()) return e;
  }
  return Status::Success();
}

std::string FloatText(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace

StatusOr<int64_t> OptimizerCount(Call& call, ParamStore& store) {
  // Every worker holds the store for this session (the proxies are a
  // service): the count is the one the previous update committed, on every
  // worker.
  Status err = store.Enter(call.session, call.who);
  if (err.failure()) return err;
  return store.update_count();
}

Status BeginUpdateForProxy(Call& call, Device& dev, ProxyUpdate& update) {
  // Traced on the worker, whose thread runs it.
  // Proxy j's setup is its group leader's (Plan::group_leader): the other
  // workers of a shared proxy's group have none to do.
  const int64_t j = call.plan().led_proxy(call.who.index);
  if (j < 0) return Status::Success();
  TraceScope setup(*call.session, call.device(), "optimizer setup");
  Call proxy{call.session, call.session->proxy(j)};
  Status err = BeginUpdate(proxy, dev, update);
  if (err.failure()) return err;
  const float scalars[3] = {update.lr, update.bc1, update.bc2};
  float* step = nullptr;
  if (update.scalars_in != nullptr) {
    // XLA's buffer dies with this call; the proxy's kernels run later: a
    // copy of the three floats beside its state, in stream order, published
    // with the store's setup (AwaitUpdateInputs acquires it).
    step = update.store->step_scalars(j, update.store->update_count());
    const LeafRun run{const_cast<float*>(update.scalars_in), DType::kF32, 3, 0};
    err = dev.Gather(&run, 1, step, call.plan().workers + j, 3);
    if (err.success()) err = dev.Publish();
    if (err.failure()) return err;
  }
  call.session->PostUpdateInputs(j, scalars, step);
  return Status::Success();
}

Status AwaitUpdateInputs(Call& call, Device& dev, ProxyUpdate& u) {
  if (!u.from_worker || u.inputs) return Status::Success();
  Session& session = *call.session;
  const int64_t k = call.who.index;
  Status err = session.Wait(
      call.who, Session::Waits::kPeer, [&] { return session.UpdateInputsPosted(k); },
      [&] {
        return "worker " + std::to_string(call.plan().group_leader(k)) +
               " to hand over this step's optimizer inputs (its coarse_proxy_ring call)";
      });
  if (err.failure()) return err;
  const float* sc = session.UpdateScalars(k);
  u.lr = sc[0];
  u.bc1 = sc[1];
  u.bc2 = sc[2];
  u.step = session.UpdateStep(k);
  u.inputs = true;
  // The worker's BeginUpdate enqueued the store's seeding and snapshot copy
  // and published them before posting: order this device's work after them.
  return dev.Acquire(call.plan().group_leader(k));
}

Status BeginUpdate(Call& call, Device& dev, ProxyUpdate& u) {
  Session& session = *call.session;
  const Plan& plan = call.plan();
  const int64_t k = call.who.index, p = plan.workers;
  ParamStore& store = *u.store;
  Status err = store.Enter(call.session, call.who);
  if (err.success()) err = store.Prepare(session, *u.spec);
  if (err.failure()) return err;
  const int64_t n = store.owned_nelems(k);
  const int32_t slots = u.spec->slots();
  if (store.TakeSnapshotTurn(session)) {  // the committed version, before it can change
    err = store.CopySnapshot(dev, k);
    if (err.failure()) return err;
    store.SnapshotCopied();
  }
  switch (store.seed()) {
    case ParamStore::Seed::kFromHost: return store.SeedFromHost(k);
    case ParamStore::Seed::kFromParams: {
      // The state slots start at zero. Where they are the runtime's
      // registered host memory (a proxy in host memory's pinned store on a
      // GPU machine) no device memset may write them (runtime/host_memory.h:
      // CUDA does not promise cudaMemsetAsync on mapped pinned memory), so
      // the host does, once the worker's stream has finished what it had
      // enqueued (a snapshot copy of a step that failed may still read them).
      const size_t slot_bytes = static_cast<size_t>(n) * sizeof(float);
      const bool host_write =
          slots > 0 && n > 0 && IsHostMemory(store.buf(k, 0, 1), slot_bytes * slots);
      if (host_write) {
        err = dev.SynchronizeHost("seeding the optimizer state in host memory");
        if (err.failure()) return err;
        for (int32_t j = 1; j <= slots; ++j) std::memset(store.buf(k, 0, j), 0, slot_bytes);
      }
      for (const OwnedRange& r : store.owned(k)) {
        err = ForSegments(plan, r,
                          [&](int64_t leaf, int64_t leaf_off, int64_t piece_off, int64_t len) {
                            const LeafRef x = u.params(leaf);
                            LeafRun run{ElementPtr(x.data, x.dtype, leaf_off), x.dtype, len,
                                        r.off + (piece_off - r.lo)};
                            return dev.Gather(&run, 1, store.buf(k, 0, 0), p + k, n);
                          });
        if (err.failure()) return err;
      }
      for (int32_t j = 1; j <= slots && !host_write; ++j) {
        err = dev.ZeroBytes(store.buf(k, 0, j), slot_bytes);
        if (err.failure()) return err;
      }
      return dev.Publish();
    }
    case ParamStore::Seed::kNone: break;
  }
  if (!u.check_params) return Status::Success();
  // The params this step got must be what the store returned: compared with
  // the committed master rounded to the params' dtype, where they are (CPU)
  // or widened into the buffer this step writes anyway (streams, CUDA).
  // (A delayed update has written that buffer already: its own scratch.)
  float* given = u.spec->delayed ? store.check_scratch(k) : store.buf(k, 1, 0);
  const float* master = store.buf(k, 0, 0);
  std::vector<LeafRun> runs;
  std::vector<std::pair<int64_t, int64_t>> where;  // per run: leaf, offset in it
  for (const OwnedRange& r : store.owned(k)) {
    err = ForSegments(plan, r, [&](int64_t leaf, int64_t leaf_off, int64_t piece_off, int64_t len) {
      const LeafRef x = u.params(leaf);
      runs.push_back(
          LeafRun{ElementPtr(x.data, x.dtype, leaf_off), x.dtype, len, r.off + (piece_off - r.lo)});
      where.emplace_back(leaf, leaf_off);
      return Status::Success();
    });
    if (err.failure()) return err;
  }
  // One check for all of them: on a GPU it is one read the host waits for.
  auto bad =
      dev.FirstMismatch(master, runs.data(), static_cast<int64_t>(runs.size()), given, p + k, n);
  if (bad.has_error()) return bad.error();
  if (bad.value().run < 0) return Status::Success();
  const auto [leaf, leaf_off] = where[bad.value().run];
  const int64_t i = bad.value().index;
  const float got = bad.value().given, held = bad.value().held;
  const std::string msg =
      "coarse_jax: coarse.value_and_update ('" + store.name() + "')" + session.DescribeStep() +
      ": the params passed to the step are not the params it "
      "returned last time (tensor '" +
      plan.leaf_names[leaf] + "', element " + std::to_string(leaf_off + i) + ": got " +
      FloatText(got) + ", the proxies' master holds " + FloatText(held) +
      "). The proxies hold the master parameters and the optimizer state, so the step "
      "must get back what it returned. Fix: pass the params the step returned; to continue "
      "from other params, call step.load_optimizer_state(params, opt_state) first, or "
      "step.reset_optimizer() to restart the optimizer from the params you pass.";
  session.Poison(msg);
  return Status::InvalidArgument(msg);
}

namespace {

OptScalars ScalarsOf(const ProxyUpdate& u) {
  const OptimizerSpec& spec = *u.spec;
  OptScalars o;
  o.kind = spec.kind;
  o.nesterov = spec.nesterov;
  o.clip = u.clip;
  o.lr = u.lr;
  o.bc1 = u.bc1;
  o.bc2 = u.bc2;
  o.b1 = spec.b1;
  o.one_minus_b1 = static_cast<float>(spec.one_minus_b1);
  o.b2 = spec.b2;
  o.one_minus_b2 = static_cast<float>(spec.one_minus_b2);
  o.eps = spec.eps;
  o.weight_decay = spec.weight_decay;
  o.momentum = spec.momentum;
  o.norm = u.norm;
  o.clip_norm = spec.clip_norm;
  o.step = u.step;
  o.clip_at = u.clip_at;
  return o;
}

// The optimizer over the owned ranges of proxy k that `pick(range)` accepts,
// per leaf segment (weight-decay masks are per leaf): the gradient of the
// range's element at piece offset `piece_off` read at grad(range, piece_off),
// where the new weight is written too; the master and state from the
// committed buffer to the other one.
template <typename Pick, typename Grad>
Status UpdateOwned(const Plan& plan, Device& dev, const ProxyUpdate& u, int64_t k, OptScalars o,
                   Pick&& pick, Grad&& grad) {
  ParamStore& store = *u.store;
  const OptimizerSpec& spec = *u.spec;
  const int32_t slots = spec.slots();
  for (const OwnedRange& r : store.owned(k)) {
    if (!pick(r)) continue;
    Status err = ForSegments(plan, r, [&](int64_t leaf, int64_t, int64_t piece_off, int64_t len) {
      const int64_t off = r.off + (piece_off - r.lo);
      OptBuffers b{};
      b.grad_io = grad(r, piece_off);
      b.w_in = store.buf(k, 0, 0) + off;
      b.w_out = store.buf(k, 1, 0) + off;
      for (int32_t j = 0; j < slots; ++j) {
        b.s_in[j] = store.buf(k, 0, 1 + j) + off;
        b.s_out[j] = store.buf(k, 1, 1 + j) + off;
      }
      o.decay = spec.decayed(leaf) && spec.weight_decay != 0.0f;
      return dev.ApplyOptimizer(o, b, len);
    });
    if (err.failure()) return err;
  }
  return Status::Success();
}

}  // namespace

Status ApplyOptimizer(Call& call, Device& dev, const ProxyUpdate& u, int64_t s, float* own,
                      int half) {
  const int64_t n = call.plan().piece_nelems[s];  // ring 1's half starts at n / 2 (ring.h)
  return UpdateOwned(
      call.plan(), dev, u, call.who.index, ScalarsOf(u),
      [&](const OwnedRange& r) {
        return r.piece == s && (half < 0 || (r.lo >= n / 2 ? 1 : 0) == half);
      },
      [&](const OwnedRange&, int64_t piece_off) { return own + piece_off; });
}

Status ApplyPending(Call& call, Device& dev, ProxyUpdate& u) {
  ParamStore& store = *u.store;
  const int64_t k = call.who.index;
  TraceScope span(*call.session, call.device(), "delayed update");
  Status err = store.Enter(call.session, call.who);
  if (err.success()) err = store.Prepare(*call.session, *u.spec);
  if (err.failure() || !store.applies_pending()) return err;
  // The previous call's gradient (committed) into this version's buffer,
  // where the kernel writes the new weights over it: a failed step leaves
  // the committed one for the next try.
  const int64_t n = store.owned_nelems(k), self = call.device();
  float* grad = store.pending(k, 1);
  err = dev.CopyFrom(grad, store.pending(k, 0), self, n);
  if (err.failure()) return err;
  OptScalars o = ScalarsOf(u);
  // The scalars the previous call's worker copied for this update (its count
  // is the committed one), in the set this call's worker does not write.
  o.step = store.step_scalars(k, store.count());
  err = UpdateOwned(
      call.plan(), dev, u, k, o, [](const OwnedRange&) { return true; },
      [&](const OwnedRange& r, int64_t piece_off) { return grad + r.off + (piece_off - r.lo); });
  if (err.success()) err = dev.Publish();
  return err;
}

Status TakePending(Call& call, Device& dev, const ProxyUpdate& u, int64_t s, float* own) {
  ParamStore& store = *u.store;
  const int64_t k = call.who.index, self = call.device();
  // The weights to hand out: this call's update of the previous gradient, or
  // (nothing pending: a first call) the master as it is.
  const float* weights = store.buf(k, store.applies_pending() ? 1 : 0, 0);
  for (const OwnedRange& r : store.owned(k)) {
    if (r.piece != s) continue;
    const int64_t len = r.hi - r.lo;
    Status err = dev.CopyFrom(store.pending(k, 1) + r.off, own + r.lo, self, len);
    if (err.success()) err = dev.CopyFrom(own + r.lo, weights + r.off, self, len);
    if (err.failure()) return err;
  }
  return Status::Success();
}

Status KeepUnapplied(Call& call, Device& dev, const ProxyUpdate& u) {
  ParamStore& store = *u.store;
  if (!u.spec->delayed || store.applies_pending()) return Status::Success();
  // Nothing applied: the version this session commits is the committed one.
  const int64_t k = call.who.index, n = store.owned_nelems(k), self = call.device();
  for (int32_t slot = 0; slot <= u.spec->slots(); ++slot) {
    Status err = dev.CopyFrom(store.buf(k, 1, slot), store.buf(k, 0, slot), self, n);
    if (err.failure()) return err;
  }
  return Status::Success();
}

// On a device (NormOnDevice) the owned ranges' sum of squares is one
// operation, its result stays in the proxy's memory, the peers' shares are
// copied beside it there, and the optimizer's kernels read the clip scalars
// where they are: per step a launch or two, a peer copy per other proxy, no
// host synchronization (one per owned range read each sum back before). A
// proxy in host memory sums on the host, where the values already are.
Status ClipByGlobalNorm(Call& call, Device& dev, ProxyUpdate& u) {
  Session& session = *call.session;
  const int64_t k = call.who.index, q = call.plan().proxies, w = call.plan().workers;
  const Plan& plan = call.plan();
  NormOnDevice* on_device = dev.norm_on_device();
  double sum_sq = 0;  // a host proxy's share (on a device it stays there)
  std::vector<const float*> xs;
  std::vector<int64_t> ns;
  for (const OwnedRange& r : u.store->owned(k)) {
    const float* x = session.arena(k) + plan.slot(k, r.piece, 0) + r.lo;
    if (on_device == nullptr) {
      auto part = dev.SumSquares(x, r.hi - r.lo);
      if (part.has_error()) return part.error();
      sum_sq += part.value();
      continue;
    }
    xs.push_back(x);
    ns.push_back(r.hi - r.lo);
    if (ClipSyncsPerPiece()) {  // testing: a host synchronization per range, as before
      Status e = dev.SynchronizeHost("testing: the global norm's host sync per range");
      if (e.failure()) return e;
    }
  }
  if (on_device != nullptr) {
    Status e = on_device->SumSquaresPart(xs.data(), ns.data(), static_cast<int64_t>(xs.size()), k);
    if (e.success() && q > 1) e = dev.Publish();  // the peers copy this share
    if (e.failure()) return e;
  }
  session.PostNormPart(k, sum_sq);
  Status err = session.Wait(
      call.who, Session::Waits::kPeer, [&] { return session.NormReady(); },
      [&] { return std::string("every proxy's share of the global gradient norm (clip_norm)"); });
  if (err.failure()) return err;
  if (on_device == nullptr) {
    u.norm = static_cast<float>(std::sqrt(session.NormTotal()));
    u.clip = !(u.norm < u.spec->clip_norm);
    return Status::Success();
  }
  std::vector<int64_t> devices(q);
  for (int64_t j = 0; j < q && err.success(); ++j) {
    devices[j] = w + j;
    if (j != k) err = dev.Acquire(w + j);
  }
  if (err.failure()) return err;
  auto clip = on_device->ClipScalars(k, devices.data(), q, u.spec->clip_norm);
  if (clip.has_error()) return clip.error();
  u.clip_at = clip.value();
  return Status::Success();
}

}  // namespace coarse
