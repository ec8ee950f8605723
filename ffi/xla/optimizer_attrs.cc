// ReadStore / ReadOptimizer (see xla/optimizer_attrs.h).
#include "xla/optimizer_attrs.h"

#include <string>

#include "xla/plan_attrs.h"

namespace coarse {
namespace ffi = xla::ffi;

ffi::ErrorOr<std::optional<std::shared_ptr<ParamStore>>> ReadStore(const ffi::Dictionary& attrs) {
  if (!attrs.contains("opt_store")) return std::optional<std::shared_ptr<ParamStore>>();
  auto id = Need<int64_t>(attrs, "opt_store");
  if (id.has_error()) return ffi::Unexpected(id.error());
  auto name = Need<std::string_view>(attrs, "opt_name");
  if (name.has_error()) return ffi::Unexpected(name.error());
  return std::optional<std::shared_ptr<ParamStore>>(
      GetParamStore(id.value(), std::string(name.value())));
}

ffi::ErrorOr<OptimizerSpec> ReadOptimizer(const ffi::Dictionary& attrs, const Plan& plan) {
  OptimizerSpec spec;
#define COARSE_OPT(var, T, name)   \
  auto var = Need<T>(attrs, name); \
  if (var.has_error()) return ffi::Unexpected(var.error());
  COARSE_OPT(kind, int64_t, "opt_kind");
  COARSE_OPT(b1, double, "opt_b1");
  COARSE_OPT(b2, double, "opt_b2");
  COARSE_OPT(eps, double, "opt_eps");
  COARSE_OPT(omb1, double, "opt_one_minus_b1");
  COARSE_OPT(omb2, double, "opt_one_minus_b2");
  COARSE_OPT(wd, double, "opt_weight_decay");
  COARSE_OPT(momentum, double, "opt_momentum");
  COARSE_OPT(clip, double, "opt_clip_norm");
  COARSE_OPT(nesterov, int64_t, "opt_nesterov");
  COARSE_OPT(flags, ffi::Span<const int64_t>, "opt_leaf_flags");
  COARSE_OPT(snapshot_every, int64_t, "opt_snapshot_every");
#undef COARSE_OPT
  if (kind.value() < 0 || kind.value() > 2)
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        "coarse_jax: opt_kind must be 0 (sgd), 1 (adam) or 2 (adamw), got " +
        std::to_string(kind.value())));
  if (static_cast<int64_t>(flags.value().size()) != static_cast<int64_t>(plan.leaf_nelems.size()))
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        "coarse_jax: opt_leaf_flags has " + std::to_string(flags.value().size()) +
        " entries, the plan has " + std::to_string(plan.leaf_nelems.size()) + " leaves"));
  spec.kind = static_cast<OptKind>(kind.value());
  spec.b1 = static_cast<float>(b1.value());
  spec.b2 = static_cast<float>(b2.value());
  spec.eps = static_cast<float>(eps.value());
  spec.one_minus_b1 = omb1.value();
  spec.one_minus_b2 = omb2.value();
  spec.weight_decay = static_cast<float>(wd.value());
  spec.momentum = static_cast<float>(momentum.value());
  spec.clip_norm = static_cast<float>(clip.value());
  spec.nesterov = nesterov.value() != 0;
  spec.snapshot_every = snapshot_every.value();
  for (int64_t f : flags.value()) spec.leaf_flags.push_back(static_cast<uint8_t>(f));
  if (attrs.contains("opt_delayed")) {
    auto delayed = attrs.get<int64_t>("opt_delayed");
    if (delayed.has_error()) return ffi::Unexpected(delayed.error());
    spec.delayed = delayed.value() != 0;
  }
  if (spec.delayed && spec.clip_norm > 0)
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        "coarse_jax: a delayed update (opt_delayed) with global-norm clipping is not supported"));
  return spec;
}

}  // namespace coarse
