// BeginCall / EndCall / ReadWho: the attributes and the (tier, data) operand
// every sync handler reads (see xla/handler.h).
#include "xla/handler.h"

#include <string>
#include <vector>

#include "xla/plan_attrs.h"
#include "xla/sync_ops.h"

namespace coarse {
namespace ffi = xla::ffi;

// Read in place (the attribute outlives the call): no copy per call. Empty:
// none given (a CPU call may name its caller by the (tier, data) operand).
static ffi::ErrorOr<ffi::Span<const int64_t>> CheckOrdinals(ffi::Span<const int64_t> ordinals,
                                                            int64_t devices) {
  if (ordinals.size() == 0) return ordinals;
  if (static_cast<int64_t>(ordinals.size()) != devices)
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        "coarse_jax: attribute 'ordinals' has " + std::to_string(ordinals.size()) +
        " entries, the mesh has " + std::to_string(devices) + " devices"));
  return ordinals;
}

static ffi::ErrorOr<Who> WhoByOrdinal(int64_t ordinal, ffi::Span<const int64_t> ordinals,
                                      int64_t p) {
  for (int64_t d = 0; d < static_cast<int64_t>(ordinals.size()); ++d)
    if (ordinals[d] == ordinal) return Who{d < p ? kWorker : kProxy, d < p ? d : d - p};
  return ffi::Unexpected(ffi::Error::InvalidArgument(
      "coarse_jax: the call runs on device ordinal " + std::to_string(ordinal) +
      ", which is not in the coarse mesh (attribute 'ordinals' has " +
      std::to_string(ordinals.size()) + " devices)"));
}

ffi::ErrorOr<Who> ReadWho(ffi::AnyBuffer who, int64_t workers, int64_t proxies) {
  if (who.element_type() != ffi::DataType::S32 || who.element_count() != 2)
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        "coarse_jax: first operand must be int32[2] (tier, data index)"));
  const int32_t* v = static_cast<const int32_t*>(who.untyped_data());
  if ((v[0] != kWorker && v[0] != kProxy) || v[1] < 0 ||
      v[1] >= (v[0] == kWorker ? workers : proxies))
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        "coarse_jax: device index (tier=" + std::to_string(v[0]) +
        ", index=" + std::to_string(v[1]) + ") is outside the mesh of " + std::to_string(workers) +
        " workers and " + std::to_string(proxies) + " proxies"));
  return Who{static_cast<Tier>(v[0]), v[1]};
}

ffi::ErrorOr<Call> BeginCall(ffi::RunId run_id, const Caller& caller, const CallAttrs& attrs) {
  auto plan = GetPlan(attrs.plan);
  if (plan.has_error()) return ffi::Unexpected(plan.error());
  const int64_t p = plan.value()->workers;
  auto ordinals = CheckOrdinals(attrs.ordinals, plan.value()->devices());
  if (ordinals.has_error()) return ffi::Unexpected(ordinals.error());
  auto who = caller.ordinal.has_value() ? WhoByOrdinal(*caller.ordinal, ordinals.value(), p)
                                        : ReadWho(*caller.who_operand, p, plan.value()->proxies);
  if (who.has_error()) return ffi::Unexpected(who.error());
  if (who.value().tier != kWorker)
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        "coarse_jax: a coarse call ran on " + who.value().Describe() +
        ", but the proxies run no XLA program: their part of a step is the runtime's service "
        "(ffi/runtime/service.h), started by the workers' calls. Run the step's program on the "
        "workers only (coarse.sync does; a hand-made program must shard_map over "
        "coarse_jax.mesh.workers_mesh(mesh))."));
  return Call{JoinSession(plan.value(), run_id.run_id, attrs.site, who.value().device(p),
                          ordinals.value().begin(), ordinals.value().size()),
              who.value()};
}

ffi::Error StartProxyService(Call& call, const CallAttrs& attrs,
                             const MakeProxyDevice& make_proxy_device) {
  if (call.session->proxies_started()) return ffi::Error::Success();
  auto job = ReadProxyJob(attrs, call.plan());
  if (job.has_error()) return job.error();
  call.started_proxies = StartProxies(call.session, std::move(job.value()), make_proxy_device);
  return ffi::Error::Success();
}

ffi::Error EndCall(Call& call, Device& device, ffi::Error status, const CallAttrs& attrs) {
  const bool last = status.success() && attrs.last;
  // FinishCall reads a failure's message only (it poisons the session with
  // it): XLA gets `status` itself back, its code unchanged.
  const Status finished =
      FinishCall(call, device,
                 status.success() ? Status::Success() : Status::Internal(status.message()), last);
  return status.failure() ? std::move(status) : ToXlaError(finished);
}

}  // namespace coarse
