// The plan and the emulated topology, read from a custom call's attributes.
//
// The Python planner (coarse_jax/plan/) hands its decisions to every
// custom call as FFI attributes (plain int64 / float64 arrays), so a compiled
// program carries its own plan. This is the only code that reads them; the
// runtime sees the parsed Plan (runtime/plan.h) and Topology
// (runtime/emulator.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "runtime/emulator.h"
#include "runtime/plan.h"
#include "xla/ffi/api/ffi.h"

namespace coarse {

// Attribute `name` of type T, or an InvalidArgument error naming it (read by
// every attribute parser: the plan's, the topology's, the optimizer's).
template <typename T>
xla::ffi::ErrorOr<T> Need(const xla::ffi::Dictionary& attrs, std::string_view name) {
  auto v = attrs.get<T>(name);
  if (v.has_error()) {
    return xla::ffi::Unexpected(xla::ffi::Error::InvalidArgument(
        "coarse_jax: custom call is missing attribute '" + std::string(name) +
        "' (built by a different coarse_jax version?): " + v.error().message()));
  }
  return v;
}

// Returns the cached plan for the attributes' `plan_key`, parsing (and
// range-checking: a malformed plan is InvalidArgument naming the attribute)
// it on first use. The cache keeps the PlanCacheLimit() most recently used
// plans; an evicted one is parsed again when next used. Attributes (all int64
// unless noted):
//   plan_key, workers, timeout_ms, mean (0/1), num_proxy_leaves,
//   piece_nelems[S], piece_nbytes[S], piece_dest[S*p], segments[5*G],
//   leaf_nelems[L], leading_nbytes, leaf_names (string, '\n'-separated),
//   and optionally the emu_* topology attributes (see ParseTopology).
xla::ffi::ErrorOr<std::shared_ptr<const Plan>> GetPlan(const xla::ffi::Dictionary& attrs);

// The plan cache's limit (plans kept) and size. The limit applies at once.
inline constexpr int64_t kDefaultCachedPlans = 64;
void SetPlanCacheLimit(int64_t plans);
int64_t PlanCacheLimit();
int64_t CachedPlans();

// The optional int64 attribute "proxies" (q, dividing `workers`); absent
// (a 1:1 plan or probe): q = workers.
xla::ffi::ErrorOr<int64_t> ReadProxies(const xla::ffi::Dictionary& attrs, int64_t workers);

// Parses the emu_* attributes (float64 [p*p] tables emu_{wp,pp,ww}_s_per_byte
// and emu_{wp,pp,ww}_latency_s, optional int64 emu_virtual and
// emu_host_proxies); returns false
// when the call has none.
xla::ffi::ErrorOr<bool> ParseTopology(const xla::ffi::Dictionary& attrs, int64_t workers,
                                      int64_t proxies, Topology* out);

}  // namespace coarse
