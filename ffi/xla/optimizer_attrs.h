// The proxy optimizer's attributes on coarse_proxy_ring / coarse_opt_count of
// a `coarse.value_and_update` (coarse_jax/optim.py writes them):
//   opt_store (int64, the store's id), opt_name (string, names it in errors),
//   opt_kind (0 sgd, 1 adam, 2 adamw), opt_b1, opt_b2, opt_eps,
//   opt_one_minus_b1, opt_one_minus_b2, opt_weight_decay, opt_momentum,
//   opt_clip_norm (f64), opt_nesterov (int64), opt_leaf_flags (int64 per
//   plan leaf, param_store.h), opt_snapshot_every (int64, Config.snapshot_every),
//   opt_num_deps (int64: operands before the params), opt_check_params
//   (int64, absent 1: whether BeginUpdate checks the params, xla/proxy_ring.cc),
//   opt_delayed (int64, absent 0: OptimizerSpec::delayed).
#pragma once

#include <memory>
#include <optional>

#include "runtime/param_store.h"
#include "xla/ffi/api/ffi.h"

namespace coarse {

// The store named by opt_store / opt_name, or nullopt if the call has none
// (a value_and_grad's ring).
xla::ffi::ErrorOr<std::optional<std::shared_ptr<ParamStore>>> ReadStore(
    const xla::ffi::Dictionary& attrs);

xla::ffi::ErrorOr<OptimizerSpec> ReadOptimizer(const xla::ffi::Dictionary& attrs, const Plan& plan);

}  // namespace coarse
