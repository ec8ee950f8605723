// SyncSelfTest: the four calls' phases on 2p threads over a platform's
// members (see sync_selftest.h).
#include "runtime/sync_selftest.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "runtime/call.h"
#include "runtime/phases.h"

namespace coarse {
namespace ffi = xla::ffi;

namespace {

std::shared_ptr<const Plan> SelfTestPlan(const SyncSelfTestSpec& spec) {
  const int64_t p = spec.workers;
  auto plan = std::make_shared<Plan>();
  plan->key = static_cast<int64_t>(
      std::hash<std::string>{}("selftest/" + std::to_string(p) + "/" +
                               std::to_string(spec.proxy_elems) + "/" + std::to_string(spec.piece) +
                               "/" + std::to_string(spec.leading_elems) + "/" + spec.route) >>
      1);
  plan->workers = p;
  plan->proxies = p;  // 1:1: each worker's proxy also runs the worker's calls
  plan->timeout_ms = 20000;
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
      const int64_t k = spec.route == "cross" ? (w + s) % p : spec.route == "dense" ? s % p : w;
      plan->piece_dest.push_back(static_cast<int32_t>(k));
    }
  }
  FinishPlan(plan.get());
  return plan;
}

}  // namespace

std::vector<float> SyncSelfTest(const SyncSelfTestSpec& spec, const float* values,
                                const std::vector<int64_t>& ordinals, const MakeMember& make) {
  const int64_t p = spec.workers;
  if (p < 1 || spec.proxy_elems < 0 || spec.piece < 1 || spec.leading_elems < 0 || spec.steps < 1)
    throw std::invalid_argument("sync self-test: workers >= 1, sizes >= 0, piece >= 1, steps >= 1");
  if (spec.route != "local" && spec.route != "cross" && spec.route != "dense")
    throw std::invalid_argument("sync self-test: route must be local, cross or dense");
  auto plan = SelfTestPlan(spec);
  const int64_t total = spec.proxy_elems + spec.leading_elems;
  std::vector<float> out(spec.steps * 2 * p * total);
  static std::atomic<int64_t> next_run{int64_t{1} << 50};  // apart from XLA's run ids
  std::mutex error_mu;
  std::string error;
  for (int64_t step = 0; step < spec.steps; ++step) {
    const int64_t run_id = next_run.fetch_add(1);
    std::vector<std::thread> threads;
    for (int64_t d = 0; d < 2 * p; ++d) {
      threads.emplace_back([&, d] {
        Call call{JoinSession(plan, run_id, 0, d, ordinals), Who{d < p ? kWorker : kProxy, d % p}};
        auto member = make(d, *call.session);
        Device& dev = member->device();
        float* in = member->Buffer(total);
        float* res = member->Buffer(total);
        auto leaves_at = [&](float* base) {
          return [base, &spec](int64_t leaf) {
            return LeafRef{base + (leaf == 0 ? 0 : spec.proxy_elems), ffi::DataType::F32};
          };
        };
        const bool worker = call.who.tier == kWorker;
        std::vector<LeafRun> in_runs,
            out_runs{LeafRun{res + spec.proxy_elems, ffi::DataType::F32, spec.leading_elems, 0}};
        if (worker)
          in_runs.push_back(
              LeafRun{in + spec.proxy_elems, ffi::DataType::F32, spec.leading_elems, 0});
        // The calls in a step's program order: push, proxy ring, worker ring, pull.
        ffi::Error e = AcquireStorage(call, dev);
        if (e.success() && worker) e = member->Load(in, values + d * total, total);
        if (e.success() && worker) e = PushPieces(call, dev, 0, plan->num_pieces(), leaves_at(in));
        if (e.success() && !worker) e = ReducePieces(call, dev, nullptr);
        if (e.success()) e = ReduceLeading(call, dev, in_runs, out_runs);
        if (e.success()) e = PullPieces(call, dev, leaves_at(res));
        if (e.success()) e = member->Store(out.data() + (step * 2 * p + d) * total, res, total);
        if (e.success()) e = dev.Publish();
        if (e.failure()) call.session->Poison(e.message());
        call.session->Finish(d);
        if (e.failure()) {
          std::lock_guard<std::mutex> lock(error_mu);
          if (error.empty()) error = e.message();
        }
      });
    }
    for (auto& t : threads) t.join();
    if (!error.empty()) throw std::runtime_error(error);
  }
  return out;
}

}  // namespace coarse
