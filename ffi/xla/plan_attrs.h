// The plan and the emulated topology, read from a custom call's attributes.
//
// The Python planner (coarse_jax/plan/) hands its decisions to every
// custom call as FFI attributes (plain int64 / float64 arrays, typed:
// xla/call_attrs.h), so a compiled program carries its own plan. This is
// the only code that checks and parses them; the runtime sees the parsed
// Plan (runtime/plan.h) and Topology (runtime/emulator.h).
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/emulator.h"
#include "runtime/plan.h"
#include "xla/call_attrs.h"
#include "xla/ffi/api/ffi.h"

namespace coarse {

// Returns the cached plan for `attrs.plan_key`, parsing (and range-checking:
// a malformed plan is InvalidArgument naming the attribute) it on first use.
// The cache keeps the PlanCacheLimit() most recently used plans; an evicted
// one is parsed again when next used.
xla::ffi::ErrorOr<std::shared_ptr<const Plan>> GetPlan(const PlanAttrs& attrs);

// The plan cache's limit (plans kept) and size. The limit applies at once.
inline constexpr int64_t kDefaultCachedPlans = 64;
void SetPlanCacheLimit(int64_t plans);
int64_t PlanCacheLimit();
int64_t CachedPlans();

// q, which must divide `workers`.
xla::ffi::ErrorOr<int64_t> CheckProxies(int64_t proxies, int64_t workers);

// Parses the topology's tables (empty: links are not emulated, returns
// false; otherwise all six must be there, each of its size).
xla::ffi::ErrorOr<bool> ParseTopology(const TopologyAttrs& attrs, int64_t workers, int64_t proxies,
                                      Topology* out);

}  // namespace coarse
