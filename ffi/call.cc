#include "call.h"

#include <string>

namespace coarse {
namespace ffi = xla::ffi;

static ffi::ErrorOr<std::vector<int64_t>> ReadOrdinals(const ffi::Dictionary& attrs, int64_t p) {
  if (!attrs.contains("ordinals")) return std::vector<int64_t>{};
  auto span = attrs.get<ffi::Span<const int64_t>>("ordinals");
  if (span.has_error()) return ffi::Unexpected(span.error());
  std::vector<int64_t> out(span.value().begin(), span.value().end());
  if (static_cast<int64_t>(out.size()) != 2 * p)
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        "coarse_jax: attribute 'ordinals' has " + std::to_string(out.size()) +
        " entries, the mesh has " + std::to_string(2 * p) + " devices"));
  return out;
}

static ffi::ErrorOr<Who> WhoByOrdinal(int64_t ordinal, const std::vector<int64_t>& ordinals,
                                      int64_t p) {
  for (int64_t d = 0; d < static_cast<int64_t>(ordinals.size()); ++d)
    if (ordinals[d] == ordinal) return Who{d < p ? kWorker : kProxy, d % p};
  return ffi::Unexpected(ffi::Error::InvalidArgument(
      "coarse_jax: the call runs on device ordinal " + std::to_string(ordinal) +
      ", which is not in the coarse mesh (attribute 'ordinals' has " +
      std::to_string(ordinals.size()) + " devices)"));
}

ffi::ErrorOr<Call> BeginCall(ffi::RunId run_id, const Caller& caller, const ffi::Dictionary& attrs) {
  auto plan = GetPlan(attrs);
  if (plan.has_error()) return ffi::Unexpected(plan.error());
  auto site = attrs.get<int64_t>("site");
  if (site.has_error()) return ffi::Unexpected(site.error());
  const int64_t p = plan.value()->workers;
  auto ordinals = ReadOrdinals(attrs, p);
  if (ordinals.has_error()) return ffi::Unexpected(ordinals.error());
  auto who = caller.ordinal.has_value() ? WhoByOrdinal(*caller.ordinal, ordinals.value(), p)
                                        : ReadWho(*caller.who_operand, p);
  if (who.has_error()) return ffi::Unexpected(who.error());
  return Call{JoinSession(plan.value(), run_id.run_id, site.value(), ordinals.value()),
              who.value()};
}

ffi::Error AcquireStorage(Call& call, Device& device) {
  if (call.plan().emulated && !device.SupportsEmulation())
    return ffi::Error::InvalidArgument(
        "coarse_jax: an emulated topology (Config(topology=...)) only runs on CPU devices: "
        "its links are timed on the host");
  if (!call.session->TakeFirstCall(call.device())) return ffi::Error::Success();
  for (int64_t d = 0; d < 2 * call.session->p(); ++d) {
    if (d == call.device()) continue;
    ffi::Error e = device.Acquire(d);
    if (e.failure()) return e;
  }
  return ffi::Error::Success();
}

ffi::Error CheckLeaf(const Plan& plan, int64_t leaf, ffi::DataType dtype, size_t element_count,
                     const char* op) {
  if (!cpu::IsSupported(dtype))
    return ffi::Error::InvalidArgument(std::string("coarse_jax: ") + op + ": tensor '" +
                                       plan.leaf_names[leaf] + "' has " +
                                       cpu::DtypeName(dtype) +
                                       "; only float32, bfloat16 and float16 are synchronized");
  if (static_cast<int64_t>(element_count) != plan.leaf_nelems[leaf])
    return ffi::Error::InvalidArgument(
        std::string("coarse_jax: ") + op + ": tensor '" + plan.leaf_names[leaf] + "' has " +
        std::to_string(element_count) + " elements, the plan expects " +
        std::to_string(plan.leaf_nelems[leaf]));
  return ffi::Error::Success();
}

ffi::Error EndCall(Call& call, Device& device, ffi::Error status, const ffi::Dictionary& attrs) {
  if (status.failure()) {
    call.session->Poison(status.message());
    return status;
  }
  auto last = attrs.get<int64_t>("last");
  if (last.has_value() && last.value() != 0) {
    // Everything this device did to the storage (its reads included) is
    // what the next session's first calls will wait for.
    ffi::Error e = device.Publish();
    if (e.failure()) {
      call.session->Poison(e.message());
      return e;
    }
    call.session->Leave();
  }
  return status;
}

}  // namespace coarse
