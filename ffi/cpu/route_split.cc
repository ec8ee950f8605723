// coarse_route_join / coarse_route_split (CPU only): the latency route's tree
// laid end to end as one f32 vector, and the reduced vector handed out as the
// tree's leaves again (coarse_jax/api/_xla_route.py). The route reduces the
// whole tree as one vector (one XLA collective). Built with XLA's concatenate
// and cut with XLA slices and casts, every leaf costs generated code of its own
// (its offset differs), and a tree of 250 leaves took seconds to compile. Here
// each is a loop per leaf in one custom call: the join widens each leaf to f32
// (exact), the split narrows each piece into its leaf's dtype, rounding to
// nearest even as XLA's convert does (the CPU backend's own loops,
// host/element_loops.h; a NaN may come back as another NaN pattern).
#include <cstdint>
#include <optional>
#include <string>

#include "host/element_loops.h"
#include "runtime/dtype.h"
#include "xla/ffi/api/ffi.h"
#include "xla/status_xla.h"

namespace coarse {
namespace ffi = xla::ffi;

namespace {

ffi::Error Unsupported(const char* call, size_t i, ffi::DataType dtype) {
  return ffi::Error::InvalidArgument(std::string(call) + ": leaf " + std::to_string(i) + " is " +
                                     DtypeName(dtype) + "; expected float32, bfloat16 or float16");
}

ffi::Error RouteJoinImpl(ffi::RemainingArgs leaves, ffi::Result<ffi::AnyBuffer> flat) {
  float* dst = static_cast<float*>(flat->untyped_data());
  const size_t total = flat->element_count();
  size_t offset = 0;
  for (size_t i = 0; i < leaves.size(); ++i) {
    auto got = leaves.get<ffi::AnyBuffer>(i);
    if (got.has_error()) return got.error();
    const ffi::AnyBuffer& leaf = got.value();
    const size_t n = leaf.element_count();
    if (offset + n > total)
      return ffi::Error::InvalidArgument(
          "coarse_route_join: the leaves hold more elements (" + std::to_string(offset + n) +
          " after leaf " + std::to_string(i) + ") than the result's " + std::to_string(total));
    const std::optional<DType> dtype = AsDType(leaf.element_type());
    if (!dtype) return Unsupported("coarse_route_join", i, leaf.element_type());
    cpu::WidenToF32(*dtype, leaf.untyped_data(), dst + offset, static_cast<int64_t>(n));
    offset += n;
  }
  if (offset != total)
    return ffi::Error::InvalidArgument("coarse_route_join: the leaves hold " +
                                       std::to_string(offset) + " elements, the result " +
                                       std::to_string(total));
  return ffi::Error::Success();
}

ffi::Error RouteSplitImpl(ffi::AnyBuffer flat, ffi::RemainingRets outs) {
  const float* src = static_cast<const float*>(flat.untyped_data());
  const size_t total = flat.element_count();
  size_t offset = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    auto got = outs.get<ffi::AnyBuffer>(i);
    if (got.has_error()) return got.error();
    ffi::AnyBuffer& leaf = *got.value();
    const size_t n = leaf.element_count();
    if (offset + n > total)
      return ffi::Error::InvalidArgument(
          "coarse_route_split: the leaves hold more elements (" + std::to_string(offset + n) +
          " after leaf " + std::to_string(i) + ") than the operand's " + std::to_string(total));
    const std::optional<DType> dtype = AsDType(leaf.element_type());
    if (!dtype) return Unsupported("coarse_route_split", i, leaf.element_type());
    cpu::NarrowFromF32(*dtype, src + offset, leaf.untyped_data(), static_cast<int64_t>(n));
    offset += n;
  }
  if (offset != total)
    return ffi::Error::InvalidArgument("coarse_route_split: the leaves hold " +
                                       std::to_string(offset) + " elements, the operand " +
                                       std::to_string(total));
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RouteJoin, RouteJoinImpl,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()          // the leaves (f32, bf16, f16)
                                  .Ret<ffi::AnyBuffer>());  // f32[n]: them widened, end to end

XLA_FFI_DEFINE_HANDLER_SYMBOL(RouteSplit, RouteSplitImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // f32[n], the reduced vector
                                  .RemainingRets());      // the leaves, in their own dtypes

}  // namespace coarse
