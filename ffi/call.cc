#include "call.h"

#include <string>

namespace coarse {
namespace ffi = xla::ffi;

ffi::ErrorOr<Call> BeginCall(ffi::RunId run_id, ffi::AnyBuffer who_buf,
                             const ffi::Dictionary& attrs) {
  auto plan = GetPlan(attrs);
  if (plan.has_error()) return ffi::Unexpected(plan.error());
  auto site = attrs.get<int64_t>("site");
  if (site.has_error()) return ffi::Unexpected(site.error());
  auto who = ReadWho(who_buf, plan.value()->workers);
  if (who.has_error()) return ffi::Unexpected(who.error());
  return Call{JoinSession(plan.value(), run_id.run_id, site.value()), who.value()};
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

ffi::Error EndCall(Call& call, ffi::Error status, const ffi::Dictionary& attrs) {
  if (status.failure()) {
    call.session->Poison(status.message());
    return status;
  }
  auto last = attrs.get<int64_t>("last");
  if (last.has_value() && last.value() != 0) call.session->Leave();
  return status;
}

}  // namespace coarse
