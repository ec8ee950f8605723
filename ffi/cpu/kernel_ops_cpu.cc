// coarse_pack / coarse_unpack / coarse_reduce on CPU: the same arithmetic as
// the CUDA kernels (f32 in between, one rounding to the output type, the sum
// in operand order, the scale after the sum), so both platforms give the same
// bits and the Python wrappers are tested on every machine.
#include <cstring>
#include <string>
#include <vector>

#include "host/element_loops.h"
#include "runtime/dtype.h"
#include "xla/kernel_ops.h"
#include "xla/status_xla.h"

namespace coarse {
namespace ffi = xla::ffi;

namespace {

ffi::Error CheckDtype(ffi::DataType t, const char* op, const std::string& what) {
  if (IsSupported(t)) return ffi::Error::Success();
  return ffi::Error::InvalidArgument(std::string("coarse_jax: ") + op + ": " + what + " has " +
                                     DtypeName(t) + "; it must be float32, bfloat16 or float16");
}

// dst = dst_t(scale * float(src)), through an f32 temporary when needed.
void ConvertScaled(DType src_t, const void* src, DType dst_t, void* dst, int64_t n, float scale,
                   std::vector<float>& tmp) {
  if (n == 0) return;
  float* f = dst_t == DType::kF32 ? static_cast<float*>(dst) : (tmp.resize(n), tmp.data());
  cpu::WidenToF32(src_t, src, f, n);
  if (scale != 1.0f) cpu::ScaleF32(f, scale, n);
  if (dst_t != DType::kF32) cpu::NarrowFromF32(dst_t, f, dst, n);
}

template <bool kPack>
ffi::Error MoveLeaves(const char* op, ffi::AnyBuffer buf, const std::vector<ffi::AnyBuffer>& leaves,
                      float scale) {
  ffi::Error e = CheckDtype(buf.element_type(), op, "the packed buffer");
  if (e.failure()) return e;
  int64_t total = 0;
  for (size_t a = 0; a < leaves.size(); ++a) {
    e = CheckDtype(leaves[a].element_type(), op, "leaf " + std::to_string(a));
    if (e.failure()) return e;
    total += static_cast<int64_t>(leaves[a].element_count());
  }
  if (total != static_cast<int64_t>(buf.element_count()))
    return ffi::Error::InvalidArgument(
        std::string("coarse_jax: ") + op + ": the packed buffer has " +
        std::to_string(buf.element_count()) + " elements, the leaves " + std::to_string(total));
  std::vector<float> tmp;
  int64_t off = 0;
  const DType buf_t = *AsDType(buf.element_type());  // checked above, as every leaf's
  for (const ffi::AnyBuffer& leaf : leaves) {
    void* at = ElementPtr(buf.untyped_data(), buf_t, off);
    const int64_t n = static_cast<int64_t>(leaf.element_count());
    const DType leaf_t = *AsDType(leaf.element_type());
    if (kPack)
      ConvertScaled(leaf_t, leaf.untyped_data(), buf_t, at, n, scale, tmp);
    else
      ConvertScaled(buf_t, at, leaf_t, leaf.untyped_data(), n, scale, tmp);
    off += n;
  }
  return ffi::Error::Success();
}

ffi::Error PackImpl(ffi::RemainingArgs args, ffi::Result<ffi::AnyBuffer> buf, float scale) {
  std::vector<ffi::AnyBuffer> leaves;
  for (size_t a = 0; a < args.size(); ++a) leaves.push_back(args.get<ffi::AnyBuffer>(a).value());
  return MoveLeaves<true>("coarse_pack", *buf, leaves, scale);
}

ffi::Error UnpackImpl(ffi::AnyBuffer buf, ffi::RemainingRets rets, float scale) {
  std::vector<ffi::AnyBuffer> leaves;
  for (size_t a = 0; a < rets.size(); ++a) leaves.push_back(*rets.get<ffi::AnyBuffer>(a).value());
  return MoveLeaves<false>("coarse_unpack", buf, leaves, scale);
}

ffi::Error ReduceImpl(ffi::RemainingArgs inputs, ffi::Result<ffi::AnyBuffer> out, float scale) {
  ffi::Error e = CheckReduceOperands(inputs, *out);
  if (e.failure()) return e;
  e = CheckDtype(out->element_type(), "coarse_reduce", "the output");
  if (e.failure()) return e;
  const DType t = *AsDType(out->element_type());  // checked above
  const int64_t n = static_cast<int64_t>(out->element_count());
  std::vector<float> acc(n), x(n);
  if (n == 0) return ffi::Error::Success();
  cpu::WidenToF32(t, inputs.get<ffi::AnyBuffer>(0).value().untyped_data(), acc.data(), n);
  for (size_t a = 1; a < inputs.size(); ++a) {
    cpu::WidenToF32(t, inputs.get<ffi::AnyBuffer>(a).value().untyped_data(), x.data(), n);
    cpu::AddF32(acc.data(), x.data(), n);
  }
  if (scale != 1.0f) cpu::ScaleF32(acc.data(), scale, n);
  cpu::NarrowFromF32(t, acc.data(), out->untyped_data(), n);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(Pack, PackImpl,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()         // leaves, any shapes
                                  .Ret<ffi::AnyBuffer>()   // 1-D packed buffer
                                  .Attr<float>("scale"));  // multiplies every element

XLA_FFI_DEFINE_HANDLER_SYMBOL(Unpack, UnpackImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()   // 1-D packed buffer
                                  .RemainingRets()         // leaves, any shapes
                                  .Attr<float>("scale"));  // multiplies every element

XLA_FFI_DEFINE_HANDLER_SYMBOL(Reduce, ReduceImpl,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()         // 1..8 arrays, one shape and dtype
                                  .Ret<ffi::AnyBuffer>()   // scale * their sum
                                  .Attr<float>("scale"));  // applied once, after the sum

}  // namespace coarse
