// CheckReduceOperands: coarse_reduce's operand check, shared by the CPU and
// CUDA handlers (see xla/kernel_ops.h).
#include "xla/kernel_ops.h"

#include <string>

namespace coarse {
namespace ffi = xla::ffi;

ffi::Error CheckReduceOperands(ffi::RemainingArgs inputs, const ffi::AnyBuffer& out) {
  const int max_inputs = kReduceMaxInputs;
  if (inputs.size() < 1 || static_cast<int>(inputs.size()) > max_inputs)
    return ffi::Error::InvalidArgument("coarse_jax: coarse_reduce takes 1 to " +
                                       std::to_string(max_inputs) + " arrays, got " +
                                       std::to_string(inputs.size()));
  for (size_t a = 0; a < inputs.size(); ++a) {
    auto in = inputs.get<ffi::AnyBuffer>(a);
    if (in.has_error()) return in.error();
    if (in.value().element_type() != out.element_type() ||
        in.value().element_count() != out.element_count())
      return ffi::Error::InvalidArgument("coarse_jax: coarse_reduce: array " + std::to_string(a) +
                                         " differs from the output in dtype or size (" +
                                         std::to_string(in.value().element_count()) + " vs " +
                                         std::to_string(out.element_count()) + " elements)");
  }
  return ffi::Error::Success();
}

}  // namespace coarse
