// SyncSelfTest: the workers' calls on p threads, the proxies' jobs from the
// service, over a platform's devices (see sync_selftest.h).
#include "lab/sync_selftest.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "runtime/param_store.h"
#include "runtime/phases.h"

namespace coarse {

namespace {

std::shared_ptr<const Plan> SelfTestPlan(const SyncSelfTestSpec& spec) {
  const int64_t p = spec.workers, q = spec.proxies;
  auto plan = std::make_shared<Plan>();
  plan->key = static_cast<int64_t>(
      std::hash<std::string>{}("selftest/" + std::to_string(p) + "/" + std::to_string(q) + "/" +
                               std::to_string(spec.proxy_elems) + "/" + std::to_string(spec.piece) +
                               "/" + std::to_string(spec.leading_elems) + "/" + spec.route) >>
      1);
  plan->workers = p;
  plan->proxies = q;
  plan->timeout_ms = 60000;  // chaos delays on a loaded machine are slow, never stuck
  plan->mean = true;
  plan->leaf_nelems = {spec.proxy_elems, spec.leading_elems};
  plan->leaf_names = {"proxy_leaf", "leading_leaf"};
  plan->num_proxy_leaves = 1;
  plan->leading_nelems = spec.leading_elems;
  plan->leading_nbytes = spec.leading_elems * static_cast<int64_t>(sizeof(float));
  plan->piece_seg_begin = {0};
  for (int64_t off = 0, s = 0; off < spec.proxy_elems; off += spec.piece, ++s) {
    const int64_t len = std::min(spec.piece, spec.proxy_elems - off);
    plan->piece_nelems.push_back(len);
    plan->piece_nbytes.push_back(len * static_cast<int64_t>(sizeof(float)));
    plan->segments.push_back(Segment{0, off, len, s, 0});
    plan->piece_seg_begin.push_back(s + 1);
    for (int64_t w = 0; w < p; ++w) {
      const int64_t k = spec.route == "cross"   ? (w + s) % q
                        : spec.route == "dense" ? s % q
                                                : w / (p / q);
      plan->piece_dest.push_back(static_cast<int32_t>(k));
    }
  }
  FinishPlan(plan.get());
  return plan;
}

// What every step shares.
struct Run {
  const SyncSelfTestSpec& spec;
  const SelfTestPlatform& platform;
  std::shared_ptr<const Plan> plan;
  ProxyJob job;                       // the attributes' part of the proxies' jobs
  std::shared_ptr<ParamStore> store;  // with lr > 0
  int64_t run_id = 0, step = 0;
};

// Worker w's part of one step: its calls in program order, each begun as
// RunCall (ffi/xla/handler.h) begins it (the proxies' jobs the first time any
// worker calls, the storage's previous users on the first call) and ended
// as the platform's handler ends it. `grad`: its gradient row; `params`:
// the params this step gets (optimizer only); `out`: its results.
Status WorkerStep(const Run& run, int64_t w, const float* grad, const float* params, float* out) {
  const SyncSelfTestSpec& spec = run.spec;
  const Plan& plan = *run.plan;
  Call call{JoinSession(run.plan, run.run_id, 0, w, run.platform.ordinals.data(),
                        run.platform.ordinals.size()),
            Who{kWorker, w}};
  std::unique_ptr<SelfTestWorker> member;
  try {
    member = run.platform.make_worker(call);
  } catch (const std::exception& e) {
    call.session->Poison(e.what());
    call.session->Finish(call.device());
    return Status::Internal(e.what());
  }
  Device& dev = member->device();
  const int64_t total = spec.proxy_elems + spec.leading_elems;
  float* in = member->Buffer(total);
  float* res = member->Buffer(total);
  float* prm = run.store ? member->Buffer(spec.proxy_elems) : nullptr;
  auto leaves_at = [&](float* base) -> LeafResolver {
    return [base, &spec](int64_t leaf) {
      return LeafRef{base + (leaf == 0 ? 0 : spec.proxy_elems), DType::kF32};
    };
  };
  const LeafResolver pushed = leaves_at(in);
  auto begin = [&] {
    if (!call.session->proxies_started())
      StartProxies(call.session, run.job, run.platform.make_proxy_device);
    return AcquireStorage(call, dev);
  };
  // The step's operands exist before its first call, as XLA's buffers do.
  Status e = member->Load(in, grad, total);
  if (e.success() && prm) e = member->Load(prm, params, spec.proxy_elems);
  if (e.success() && run.store) {  // coarse_opt_count
    e = begin();
    if (e.success()) {
      auto count = OptimizerCount(call, *run.store);
      if (count.has_error())
        e = count.error();
      else if (count.value() != run.step)
        e = Status::Internal("sync self-test: the store's step count is " +
                             std::to_string(count.value()) + " at step " +
                             std::to_string(run.step));
    }
    member->CallReturns();
  }
  if (e.success()) {  // coarse_push, the whole proxy leaf as one bucket
    e = begin();
    if (e.success()) e = PushPieces(call, dev, 0, plan.num_pieces(), pushed, spec.in_place);
    member->CallReturns();
  }
  if (e.success()) {  // coarse_proxy_ring: in a value_and_update, proxy k's inputs
    e = begin();
    if (e.success() && run.store) {
      ProxyUpdate update{run.store, &run.job.spec, spec.lr, 1.0f, 1.0f, leaves_at(prm)};
      e = BeginUpdateForProxy(call, dev, update);
    }
    member->CallReturns();
  }
  if (e.success()) {  // coarse_worker_ring
    e = begin();
    const std::vector<LeafRun> in_runs{
        LeafRun{in + spec.proxy_elems, DType::kF32, spec.leading_elems, 0}};
    const std::vector<LeafRun> out_runs{
        LeafRun{res + spec.proxy_elems, DType::kF32, spec.leading_elems, 0}};
    if (e.success()) e = ReduceLeading(call, dev, in_runs, out_runs);
    member->CallReturns();
  }
  if (e.success()) {  // coarse_pull, the step's last call
    e = begin();
    if (e.success())
      e = PullPieces(call, dev, leaves_at(res),
                     PushesInPlace(*call.session, spec.in_place) ? &pushed : nullptr);
  }
  e = FinishCall(call, dev, std::move(e), /*last=*/true);
  member->CallReturns();
  if (e.success()) e = member->Store(out, res, total);
  return e;
}

}  // namespace

std::vector<float> SyncSelfTest(const SyncSelfTestSpec& given, const float* values,
                                const float* params, const SelfTestPlatform& platform) {
  SyncSelfTestSpec spec = given;
  const int64_t p = spec.workers;
  if (spec.proxies == 0) spec.proxies = p;
  const int64_t q = spec.proxies;
  if (p < 1 || q < 1 || p % q != 0)
    throw std::invalid_argument("sync self-test: workers >= 1 and proxies dividing them, got " +
                                std::to_string(p) + " workers and " + std::to_string(q) +
                                " proxies");
  if (spec.proxy_elems < 0 || spec.piece < 1 || spec.leading_elems < 0 || spec.steps < 1)
    throw std::invalid_argument("sync self-test: sizes >= 0, piece >= 1, steps >= 1");
  if (spec.route != "local" && spec.route != "cross" && spec.route != "dense")
    throw std::invalid_argument("sync self-test: route must be local, cross or dense, got '" +
                                spec.route + "'");
  if (spec.lr < 0 || (spec.lr > 0 && params == nullptr))
    throw std::invalid_argument("sync self-test: lr >= 0, and lr > 0 needs the initial params");
  static std::atomic<int64_t> next_run{int64_t{1} << 50};  // apart from XLA's run ids
  static std::atomic<int64_t> next_store{int64_t{1} << 50};
  Run run{spec, platform, SelfTestPlan(spec), {}, nullptr};
  run.job.in_place = spec.in_place;
  if (spec.lr > 0) {
    run.store = std::make_shared<ParamStore>(next_store.fetch_add(1), "sync self-test");
    run.job.store = run.store;
    run.job.spec.kind = OptKind::kSgd;
    run.job.spec.momentum = spec.momentum;
    run.job.spec.leaf_flags = {1, 0};  // the proxy leaf is a parameter, the leading leaf not
  }
  const int64_t total = spec.proxy_elems + spec.leading_elems;
  std::vector<float> out(spec.steps * p * total);
  std::vector<float> step_params;  // with the optimizer: the params of the step
  if (run.store) step_params.assign(params, params + spec.proxy_elems);
  for (int64_t step = 0; step < spec.steps; ++step) {
    run.run_id = next_run.fetch_add(1);
    run.step = step;
    std::mutex error_mu;
    std::string error;
    std::vector<std::thread> threads;
    for (int64_t w = 0; w < p; ++w) {
      threads.emplace_back([&, w] {
        // Every worker gets the params the store returned last (the same
        // bits on every worker: worker 0's row of the step before).
        Status e = WorkerStep(run, w, values + (step * p + w) * total, step_params.data(),
                              out.data() + (step * p + w) * total);
        if (e.failure()) {
          std::lock_guard<std::mutex> lock(error_mu);
          if (error.empty()) error = std::string(e.message());
        }
      });
    }
    for (auto& t : threads) t.join();
    if (!error.empty()) throw std::runtime_error(error);
    if (run.store)
      std::copy(out.begin() + step * p * total, out.begin() + step * p * total + spec.proxy_elems,
                step_params.begin());
  }
  return out;
}

}  // namespace coarse
