// ReadStore / ReadOptimizer (see xla/optimizer_attrs.h).
#include "xla/optimizer_attrs.h"

#include <string>

namespace coarse {
namespace ffi = xla::ffi;

std::optional<std::shared_ptr<ParamStore>> ReadStore(const OptimizerAttrs& attrs) {
  if (attrs.store < 0) return std::nullopt;
  return GetParamStore(attrs.store, std::string(attrs.name));
}

ffi::ErrorOr<OptimizerSpec> ReadOptimizer(const OptimizerAttrs& attrs, const Plan& plan) {
  if (attrs.kind < 0 || attrs.kind > 2)
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        "coarse_jax: optimizer kind must be 0 (sgd), 1 (adam) or 2 (adamw), got " +
        std::to_string(attrs.kind)));
  if (static_cast<int64_t>(attrs.leaf_flags.size()) !=
      static_cast<int64_t>(plan.leaf_nelems.size()))
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        "coarse_jax: optimizer leaf_flags has " + std::to_string(attrs.leaf_flags.size()) +
        " entries, the plan has " + std::to_string(plan.leaf_nelems.size()) + " leaves"));
  OptimizerSpec spec;
  spec.kind = static_cast<OptKind>(attrs.kind);
  spec.b1 = static_cast<float>(attrs.b1);
  spec.b2 = static_cast<float>(attrs.b2);
  spec.eps = static_cast<float>(attrs.eps);
  spec.one_minus_b1 = attrs.one_minus_b1;
  spec.one_minus_b2 = attrs.one_minus_b2;
  spec.weight_decay = static_cast<float>(attrs.weight_decay);
  spec.momentum = static_cast<float>(attrs.momentum);
  spec.clip_norm = static_cast<float>(attrs.clip_norm);
  spec.nesterov = attrs.nesterov;
  spec.snapshot_every = attrs.snapshot_every;
  for (int64_t f : attrs.leaf_flags) spec.leaf_flags.push_back(static_cast<uint8_t>(f));
  spec.delayed = attrs.delayed;
  if (spec.delayed && spec.clip_norm > 0)
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        "coarse_jax: a delayed update (opt_delayed) with global-norm clipping is not supported"));
  return spec;
}

}  // namespace coarse
