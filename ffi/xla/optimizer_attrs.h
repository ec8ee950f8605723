// The proxy optimizer's attributes on the sync calls of a
// `coarse.value_and_update` (OptimizerAttrs, xla/call_attrs.h; written by
// coarse_jax/optim.py and coarse_jax/api/_stores.py): its store, the
// optimizer's hyperparameters and which leaves it updates.
#pragma once

#include <memory>
#include <optional>

#include "runtime/param_store.h"
#include "xla/call_attrs.h"
#include "xla/ffi/api/ffi.h"

namespace coarse {

// The store the attributes name, or nullopt if they name none (store -1:
// a value_and_grad's sync).
std::optional<std::shared_ptr<ParamStore>> ReadStore(const OptimizerAttrs& attrs);

// The optimizer, checked against the plan.
xla::ffi::ErrorOr<OptimizerSpec> ReadOptimizer(const OptimizerAttrs& attrs, const Plan& plan);

}  // namespace coarse
