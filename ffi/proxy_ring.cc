// coarse_proxy_ring's XLA translation: zeroes the token result and, on a
// proxy, runs ReducePieces (runtime/phases/reduce_pieces.cc). Workers run
// this call as a no-op; its operands (the pushes' outputs) only order their
// pull after their pushes.
//
// In a value_and_update (attribute opt_store, optimizer_attrs.h) the
// operands after the first opt_num_deps are the step's params (one per
// proxy leaf, sync order; the loss's place holds the loss) and f32[3]
// (lr, bc1, bc2) for this step.
//
// Across hosts (attribute hosts_stage, coarse_jax/api/_hosts.py) the ring
// is two calls: stage 1 has a second result, f32[width], the chunks this
// proxy owns after the reduce-scatter (zeros on a worker); stage 2 takes the
// chunks summed over the hosts and int32[hosts], every host's plan key, as
// its last two operands.
#include <string>
#include <vector>

#include "optimizer_attrs.h"
#include "runtime/phases.h"
#include "sync_ops.h"

namespace coarse {
namespace ffi = xla::ffi;

namespace {

// Every host must run the same plan: the chunks they sum are laid out by it.
ffi::Error CheckSamePlan(const Plan& plan, ffi::AnyBuffer keys, const HostIo& io) {
  const int64_t hosts = static_cast<int64_t>(keys.element_count());
  if (keys.element_type() != ffi::DataType::S32 || hosts < 1)
    return ffi::Error::InvalidArgument(
        "coarse_jax: coarse_proxy_ring stage 2's last operand must be int32[hosts]");
  std::vector<int32_t> got(hosts);
  ffi::Error e = io.read(keys, got.data(), got.size() * sizeof(int32_t));
  if (e.failure()) return e;
  const int32_t mine = static_cast<int32_t>(plan.key & 0x7fffffff);
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
                         const ffi::Dictionary& attrs, const HostIo& io) {
  HostsStage hosts;
  if (attrs.contains("hosts_stage")) {
    auto stage = attrs.get<int64_t>("hosts_stage");
    if (stage.has_error()) return stage.error();
    hosts.kind = stage.value() == 1 ? HostsStage::kToHosts : HostsStage::kFromHosts;
  }
  auto token = outs.get<ffi::AnyBuffer>(0);
  if (token.has_error()) return token.error();
  ffi::Error e = dev.ZeroBytes(token.value()->untyped_data(), token.value()->size_bytes());
  if (e.failure()) return e;
  int64_t num_args = static_cast<int64_t>(args.size());
  if (hosts.kind == HostsStage::kToHosts) {
    auto chunks = outs.get<ffi::AnyBuffer>(1);
    if (chunks.has_error()) return chunks.error();
    hosts.chunks = static_cast<float*>(chunks.value()->untyped_data());
    hosts.width = static_cast<int64_t>(chunks.value()->element_count());
    if (call.who.tier != kProxy)
      return dev.ZeroBytes(hosts.chunks, static_cast<size_t>(hosts.width) * sizeof(float));
  } else if (hosts.kind == HostsStage::kFromHosts) {
    if (num_args < 2)
      return ffi::Error::InvalidArgument(
          "coarse_jax: coarse_proxy_ring stage 2 expects the summed chunks and the plan keys");
    num_args -= 2;
    auto chunks = args.get<ffi::AnyBuffer>(num_args);
    if (chunks.has_error()) return chunks.error();
    hosts.chunks = static_cast<float*>(chunks.value().untyped_data());
    hosts.width = static_cast<int64_t>(chunks.value().element_count());
    if (call.who.tier == kProxy) {
      auto keys = args.get<ffi::AnyBuffer>(num_args + 1);
      if (keys.has_error()) return keys.error();
      e = CheckSamePlan(call.plan(), keys.value(), io);
      if (e.failure()) {
        call.session->Poison(std::string(e.message()));
        return e;
      }
    }
  }
  // The proxies' ring runs in the runtime's service (runtime/service.h); a
  // worker's call orders its pull after its pushes and, in a
  // value_and_update, sets the store up for its local proxy with the params
  // the step got and hands over this step's scalars.
  auto store = ReadStore(attrs);
  if (store.has_error()) return store.error();
  if (!store.value().has_value()) return ffi::Error::Success();
  const Plan& plan = call.plan();
  auto spec = ReadOptimizer(attrs, plan);
  if (spec.has_error()) return spec.error();
  auto num_deps = attrs.get<int64_t>("opt_num_deps");
  if (num_deps.has_error()) return num_deps.error();
  const int64_t first = num_deps.value();
  if (num_args != first + plan.num_proxy_leaves + 1)
    return ffi::Error::InvalidArgument(
        "coarse_jax: coarse_proxy_ring of a value_and_update expects " +
        std::to_string(first + plan.num_proxy_leaves + 1) + " operands after (tier, data), got " +
        std::to_string(num_args));
  for (int64_t leaf = 0; leaf < plan.num_proxy_leaves; ++leaf) {
    if (!spec.value().updated(leaf)) continue;
    auto x = args.get<ffi::AnyBuffer>(first + leaf);
    if (x.has_error()) return x.error();
    e = CheckLeaf(plan, leaf, x.value().element_type(), x.value().element_count(),
                  "coarse_proxy_ring");
    if (e.failure()) return e;
  }
  auto scalars = args.get<ffi::AnyBuffer>(first + plan.num_proxy_leaves);
  if (scalars.has_error()) return scalars.error();
  if (scalars.value().element_type() != ffi::DataType::F32 || scalars.value().element_count() != 3)
    return ffi::Error::InvalidArgument(
        "coarse_jax: coarse_proxy_ring's last operand must be f32[3] (lr, bc1, bc2)");
  float sc[3];
  e = io.read(scalars.value(), sc, sizeof sc);
  if (e.failure()) return e;
  ProxyUpdate update{store.value().value(), &spec.value(), sc[0], sc[1], sc[2], [&](int64_t leaf) {
                       ffi::AnyBuffer x = args.get<ffi::AnyBuffer>(first + leaf).value();
                       return LeafRef{x.untyped_data(), x.element_type()};
                     }};
  return BeginUpdateForProxy(call, dev, update);
}

ffi::ErrorOr<ProxyJob> ReadProxyJob(const ffi::Dictionary& attrs, const Plan& plan) {
  ProxyJob job;
  job.in_place = PushInPlaceAttr(attrs);
  auto store = ReadStore(attrs);
  if (store.has_error()) return ffi::Unexpected(store.error());
  if (!store.value().has_value()) return job;
  auto spec = ReadOptimizer(attrs, plan);
  if (spec.has_error()) return ffi::Unexpected(spec.error());
  job.store = store.value().value();
  job.spec = spec.value();
  return job;
}

ffi::Error OptCountBody(Call& call, Device& dev, ffi::Result<ffi::AnyBuffer> count,
                        const ffi::Dictionary& attrs, const HostIo& io) {
  (void)dev;
  auto store = ReadStore(attrs);
  if (store.has_error()) return store.error();
  if (!store.value().has_value())
    return ffi::Error::InvalidArgument("coarse_jax: coarse_opt_count needs attribute opt_store");
  auto n = OptimizerCount(call, *store.value().value());
  if (n.has_error()) return n.error();
  const int32_t v = static_cast<int32_t>(n.value());
  return io.write(&v, count, sizeof v);
}

}  // namespace coarse
