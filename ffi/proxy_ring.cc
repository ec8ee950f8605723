// coarse_proxy_ring's XLA translation: zeroes the token result and, on a
// proxy, runs ReducePieces (runtime/phases/reduce_pieces.cc). Workers run
// this call as a no-op; its operands (the pushes' outputs) only order their
// pull after their pushes.
//
// In a value_and_update (attribute opt_store, optimizer_attrs.h) the
// operands after the first opt_num_deps are the step's params (one per
// proxy leaf, sync order; the loss's place holds the loss) and f32[3]
// (lr, bc1, bc2) for this step.
#include <string>

#include "optimizer_attrs.h"
#include "runtime/phases.h"
#include "sync_ops.h"

namespace coarse {
namespace ffi = xla::ffi;

ffi::Error ProxyRingBody(Call& call, Device& dev, ffi::RemainingArgs args,
                         ffi::Result<ffi::AnyBuffer> token, const ffi::Dictionary& attrs,
                         const HostIo& io) {
  ffi::Error e = dev.ZeroBytes(token->untyped_data(), token->size_bytes());
  if (e.failure()) return e;
  if (call.who.tier != kProxy) return ffi::Error::Success();
  auto store = ReadStore(attrs);
  if (store.has_error()) return store.error();
  if (!store.value().has_value()) return ReducePieces(call, dev, nullptr);
  const Plan& plan = call.plan();
  auto spec = ReadOptimizer(attrs, plan);
  if (spec.has_error()) return spec.error();
  auto num_deps = attrs.get<int64_t>("opt_num_deps");
  if (num_deps.has_error()) return num_deps.error();
  const int64_t first = num_deps.value();
  if (static_cast<int64_t>(args.size()) != first + plan.num_proxy_leaves + 1)
    return ffi::Error::InvalidArgument(
        "coarse_jax: coarse_proxy_ring of a value_and_update expects " +
        std::to_string(first + plan.num_proxy_leaves + 1) + " operands after (tier, data), got " +
        std::to_string(args.size()));
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
  return ReducePieces(call, dev, &update);
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
