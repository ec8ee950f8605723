// coarse_proxy_ring's XLA translation, run by the workers: the proxies'
// ring itself runs in the runtime's service (runtime/service.h). A worker's
// call zeroes the token result, whose operands (the pushes' outputs) order
// its pull after its pushes.
//
// In a value_and_update (an optimizer store, xla/optimizer_attrs.h) the
// operands after the first num_deps are the step's params (one per
// proxy leaf, sync order; the loss's place holds the loss) and f32[3]
// (lr, bc1, bc2) for this step: worker k sets the store up for proxy k with
// them and hands proxy k the scalars (BeginUpdateForProxy, phases.h).
// The optimizer's check_params = false (coarse_jax/dispatch/params_check.py: the
// params are the very arrays the step returned last time) skips the params
// check, and with it the host's wait for its result.
//
// Across hosts (attribute hosts_stage, coarse_jax/api/_hosts.py) the ring
// is two calls: stage 1 has a second result, f32[width], the chunks proxy k
// owns after the reduce-scatter within the host (worker k waits for its job
// to export them); stage 2 takes the chunks summed over the hosts and
// int32[hosts], every host's plan key, as its last two operands, and hands
// the chunks back to proxy k's job, which updates and all-gathers.
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/phases.h"
#include "xla/optimizer_attrs.h"
#include "xla/sync_ops.h"

namespace coarse {
namespace ffi = xla::ffi;

namespace {

// Every host must run the same plan: the chunks they sum are laid out by it.
// coarse.sync compares the processes' plans before a new program runs
// (coarse_jax/api/_arrival.py), on every process alike; this check is the
// one left for a step called inside the user's own jit (no such meeting).
// Refused here, a process may stop short of an inter-host collective that
// another is in, which then waits out the collective library's own limit.
ffi::Error CheckSamePlan(const Plan& plan, ffi::AnyBuffer keys, const HostIo& io) {
  const int64_t hosts = static_cast<int64_t>(keys.element_count());
  if (keys.element_type() != ffi::DataType::S32 || hosts < 1)
    return ffi::Error::InvalidArgument(
        "coarse_jax: coarse_proxy_ring stage 2's last operand must be int32[hosts]");
  std::vector<int32_t> got(hosts);
  ffi::Error e = io.read(keys, got.data(), got.size() * sizeof(int32_t));
  if (e.failure()) return e;
  const int32_t mine = HostPlanKey(plan.key);
  std::string differ;
  for (int64_t h = 0; h < hosts; ++h)
    if (got[h] != mine) differ += (differ.empty() ? "" : ", ") + std::to_string(h);
  if (differ.empty()) return ffi::Error::Success();
  return ffi::Error(
      ffi::ErrorCode::kFailedPrecondition,
      "coarse_jax: the hosts of this mesh synchronize with different plans (the plan of "
      "host(s) " +
          differ +
          " differs from this host's), so the chunks they sum would not line up. Fix: pass the "
          "same "
          "coarse.Config (routes, shard_bytes, latency_threshold_bytes, timeout_s, topology) and "
          "the "
          "same parameter tree on every process; a Config.from_profile measured on each host "
          "separately differs, so profile once and share it.");
}

}  // namespace

ffi::Error ProxyRingBody(Call& call, Device& dev, ffi::RemainingArgs args, ffi::RemainingRets outs,
                         const CallAttrs& attrs, int64_t hosts_stage, int64_t num_deps,
                         const HostIo& io) {
  HostsStage hosts;
  if (hosts_stage != 0)
    hosts.kind = hosts_stage == 1 ? HostsStage::kToHosts : HostsStage::kFromHosts;
  auto token = outs.get<ffi::AnyBuffer>(0);
  if (token.has_error()) return token.error();
  ffi::Error e =
      ToXlaError(dev.ZeroBytes(token.value()->untyped_data(), token.value()->size_bytes()));
  if (e.failure()) return e;
  int64_t num_args = static_cast<int64_t>(args.size());
  Session& session = *call.session;
  // The proxy whose chunks this worker carries across hosts: the one it
  // leads (Plan::group_leader); -1 for the other workers of a shared
  // proxy's group, whose stage-1 output is zeros and whose stage 2 hands
  // nothing back.
  const int64_t k = call.plan().led_proxy(call.who.index);
  if (hosts.kind == HostsStage::kFromHosts) {
    if (k < 0) return ffi::Error::Success();
    // Worker k hands proxy k's chunks back, summed over the hosts; its job
    // (runtime/service.cc RunProxyAcrossHosts) then updates and all-gathers.
    if (num_args < 2)
      return ffi::Error::InvalidArgument(
          "coarse_jax: coarse_proxy_ring stage 2 expects the summed chunks and the plan keys");
    auto chunks = args.get<ffi::AnyBuffer>(num_args - 2);
    auto keys = args.get<ffi::AnyBuffer>(num_args - 1);
    if (chunks.has_error()) return chunks.error();
    if (keys.has_error()) return keys.error();
    e = CheckSamePlan(call.plan(), keys.value(), io);
    if (e.failure()) {
      session.Poison(std::string(e.message()));
      return e;
    }
    HostVector<float>& mine = session.host_chunks(k);  // sized by proxy k before stage 1
    if (static_cast<int64_t>(chunks.value().element_count()) < static_cast<int64_t>(mine.size()))
      return ffi::Error::Internal("coarse_jax: coarse_proxy_ring stage 2: proxy " +
                                  std::to_string(k) + " owns " + std::to_string(mine.size()) +
                                  " elements but the summed chunks hold " +
                                  std::to_string(chunks.value().element_count()) +
                                  " (the step was built from another plan than the one that runs)");
    e = io.read(chunks.value(), mine.data(), mine.size() * sizeof(float));
    if (e.failure()) return e;
    session.PostHostChunks(k, 2);
    return ffi::Error::Success();
  }
  // The proxies' ring runs in the runtime's service (runtime/service.h); a
  // worker's call orders its pull after its pushes and, in a
  // value_and_update, sets the store up for its local proxy with the params
  // the step got and hands over this step's scalars.
  const std::optional<std::shared_ptr<ParamStore>> store = ReadStore(attrs.optimizer);
  if (!store.has_value()) return ffi::Error::Success();
  const Plan& plan = call.plan();
  auto spec = ReadOptimizer(attrs.optimizer, plan);
  if (spec.has_error()) return spec.error();
  const int64_t first = num_deps;
  if (num_args != first + plan.num_proxy_leaves + 1)
    return ffi::Error::InvalidArgument(
        "coarse_jax: coarse_proxy_ring of a value_and_update expects " +
        std::to_string(first + plan.num_proxy_leaves + 1) + " operands after (tier, data), got " +
        std::to_string(num_args));
  for (int64_t leaf = 0; leaf < plan.num_proxy_leaves; ++leaf) {
    if (!spec.value().updated(leaf)) continue;
    auto x = args.get<ffi::AnyBuffer>(first + leaf);
    if (x.has_error()) return x.error();
    e = ToXlaError(CheckLeaf(plan, leaf, AsDType(x.value().element_type()),
                             x.value().element_count(), "coarse_proxy_ring"));
    if (e.failure()) return e;
  }
  auto scalars = args.get<ffi::AnyBuffer>(first + plan.num_proxy_leaves);
  if (scalars.has_error()) return scalars.error();
  if (scalars.value().element_type() != ffi::DataType::F32 || scalars.value().element_count() != 3)
    return ffi::Error::InvalidArgument(
        "coarse_jax: coarse_proxy_ring's last operand must be f32[3] (lr, bc1, bc2)");
  // The scalars stay in device memory: the proxy's kernels read a copy
  // (ProxyUpdate::scalars_in), no host reads them.
  ProxyUpdate update{store.value(), &spec.value(), 0.0f, 1.0f, 1.0f, [&](int64_t leaf) {
                       ffi::AnyBuffer x = args.get<ffi::AnyBuffer>(first + leaf).value();
                       return LeafRef{x.untyped_data(), *AsDType(x.element_type())};  // checked
                     }};
  update.scalars_in = static_cast<const float*>(scalars.value().untyped_data());
  update.check_params = attrs.optimizer.check_params;
  e = ToXlaError(BeginUpdateForProxy(call, dev, update));
  if (e.failure() || hosts.kind != HostsStage::kToHosts) return e;
  // Stage 1: proxy k's owned chunks after the reduce-scatter within the host,
  // to XLA, which sums them over "host" among the workers.
  auto out = outs.get<ffi::AnyBuffer>(1);
  if (out.has_error()) return out.error();
  float* dst = static_cast<float*>(out.value()->untyped_data());
  const int64_t width = static_cast<int64_t>(out.value()->element_count());
  if (k < 0) return ToXlaError(dev.ZeroBytes(dst, static_cast<size_t>(width) * sizeof(float)));
  e = ToXlaError(session.Wait(
      call.who, Session::Waits::kPeer, [&] { return session.HostChunksAt(k, 1); },
      [&] {
        return "proxy " + std::to_string(k) +
               " to reduce-scatter every piece within the host (its chunks for the other hosts)";
      }));
  if (e.failure()) return e;
  const HostVector<float>& mine = session.host_chunks(k);
  const int64_t n = static_cast<int64_t>(mine.size());
  if (n > width)
    return ffi::Error::Internal(
        "coarse_jax: coarse_proxy_ring across hosts: proxy " + std::to_string(k) + " owns " +
        std::to_string(n) + " elements after the reduce-scatter but the exchange buffer has " +
        std::to_string(width) +
        " (the step was built from another plan than the one that runs: coarse_jax reads "
        "the width from ExchangeRanges, ffi/runtime/param_store.cc)");
  // `mine` is host memory (the session's), `dst` XLA's buffer on this device.
  e = ToXlaError(dev.CopyFromHost(dst, mine.data(), static_cast<size_t>(n) * sizeof(float)));
  if (e.failure() || width == n) return e;
  return ToXlaError(dev.ZeroBytes(dst + n, static_cast<size_t>(width - n) * sizeof(float)));
}

ffi::ErrorOr<ProxyJob> ReadProxyJob(const CallAttrs& attrs, const Plan& plan) {
  ProxyJob job;
  job.in_place = attrs.push_in_place;
  job.across_hosts = attrs.across_hosts;
  std::optional<std::shared_ptr<ParamStore>> store = ReadStore(attrs.optimizer);
  if (!store.has_value()) return job;
  auto spec = ReadOptimizer(attrs.optimizer, plan);
  if (spec.has_error()) return ffi::Unexpected(spec.error());
  job.store = std::move(store.value());
  job.spec = spec.value();
  return job;
}

ffi::Error OptCountBody(Call& call, Device& dev, ffi::Result<ffi::AnyBuffer> count,
                        const OptimizerAttrs& attrs, const HostIo& io) {
  (void)dev;
  std::optional<std::shared_ptr<ParamStore>> store = ReadStore(attrs);
  if (!store.has_value())
    return ffi::Error::InvalidArgument(
        "coarse_jax: coarse_opt_count needs an optimizer store (attribute call.optimizer.store)");
  auto n = OptimizerCount(call, *store.value());
  if (n.has_error()) return ToXlaError(n.error());
  const int32_t v = static_cast<int32_t>(n.value());
  return io.write(&v, count, sizeof v);
}

}  // namespace coarse
