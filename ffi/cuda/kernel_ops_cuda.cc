// coarse_pack / coarse_unpack / coarse_reduce on one GPU: the kernels as
// custom calls (coarse_jax.kernels), so a jitted program can use them and the
// tests can hold them against plain jnp. The handlers only translate buffers
// into launches on XLA's stream; nothing here waits on the host.
#include <optional>
#include <string>
#include <vector>

#include "coarse_kernels.h"
#include "cuda/cuda_util.h"
#include "xla/ffi/api/ffi.h"
#include "xla/kernel_ops.h"
#include "xla/status_xla.h"

namespace coarse::cuda {
namespace ffi = xla::ffi;

static_assert(kReduceMaxInputs == kernels::kMaxReduceInputs,
              "coarse_reduce's operand limit is the kernel's");

namespace {

ffi::Error DTypeOf(ffi::AnyBuffer b, const char* op, const std::string& what, kernels::DType* out) {
  if (const std::optional<DType> d = AsDType(b.element_type())) {
    *out = *d;
    return ffi::Error::Success();
  }
  return ffi::Error::InvalidArgument(std::string("coarse_jax: ") + op + ": " + what +
                                     " must be float32, bfloat16 or float16");
}

// Spans laying the leaves end to end in the packed buffer, uploaded into XLA
// scratch memory (stream-ordered, freed after this call's work).
ffi::ErrorOr<const kernels::Span*> LeafSpans(const std::vector<ffi::AnyBuffer>& leaves,
                                             const ffi::AnyBuffer& buf, const char* op, int device,
                                             cudaStream_t stream, ffi::ScratchAllocator& scratch,
                                             int64_t* total) {
  std::vector<kernels::Span> spans(leaves.size());
  int64_t off = 0;
  for (size_t a = 0; a < leaves.size(); ++a) {
    ffi::Error e = DTypeOf(leaves[a], op, "leaf " + std::to_string(a), &spans[a].leaf_dtype);
    if (e.failure()) return ffi::Unexpected(e);
    spans[a].leaf = leaves[a].untyped_data();
    spans[a].buf_off = off;
    spans[a].len = static_cast<int64_t>(leaves[a].element_count());
    off += spans[a].len;
  }
  *total = kernels::SetBegins(spans.data(), static_cast<int64_t>(spans.size()));
  if (*total != static_cast<int64_t>(buf.element_count()))
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        std::string("coarse_jax: ") + op + ": the packed buffer has " +
        std::to_string(buf.element_count()) + " elements, the leaves " + std::to_string(*total)));
  if (spans.empty()) return static_cast<const kernels::Span*>(nullptr);
  const size_t bytes = spans.size() * sizeof(kernels::Span);
  auto mem = scratch.Allocate(bytes, alignof(kernels::Span));
  if (!mem.has_value())
    return ffi::Unexpected(
        ffi::Error(ffi::ErrorCode::kResourceExhausted,
                   std::string("coarse_jax: ") + op + ": no scratch memory for the span table"));
  ffi::Error e = ToXlaError(Check(UploadAsync(device, *mem, spans.data(), bytes, stream),
                                  std::string(op) + ": uploading the span table"));
  if (e.failure()) return ffi::Unexpected(e);
  return static_cast<const kernels::Span*>(*mem);
}

std::vector<ffi::AnyBuffer> Buffers(ffi::RemainingArgs args) {
  std::vector<ffi::AnyBuffer> out;
  for (size_t a = 0; a < args.size(); ++a) out.push_back(args.get<ffi::AnyBuffer>(a).value());
  return out;
}

std::vector<ffi::AnyBuffer> Buffers(ffi::RemainingRets rets) {
  std::vector<ffi::AnyBuffer> out;
  for (size_t a = 0; a < rets.size(); ++a) out.push_back(*rets.get<ffi::AnyBuffer>(a).value());
  return out;
}

ffi::Error PackImpl(cudaStream_t stream, int32_t device, ffi::ScratchAllocator scratch,
                    ffi::RemainingArgs leaves, ffi::Result<ffi::AnyBuffer> buf, float scale) {
  kernels::DType buf_dtype;
  ffi::Error e = DTypeOf(*buf, "coarse_pack", "the packed buffer", &buf_dtype);
  if (e.failure()) return e;
  int64_t total = 0;
  auto spans = LeafSpans(Buffers(leaves), *buf, "coarse_pack", device, stream, scratch, &total);
  if (spans.has_error()) return spans.error();
  return ToXlaError(Check(kernels::LaunchPack(spans.value(), static_cast<int64_t>(leaves.size()),
                                              total, buf->untyped_data(), buf_dtype, scale, stream),
                          "coarse_pack: launch"));
}

ffi::Error UnpackImpl(cudaStream_t stream, int32_t device, ffi::ScratchAllocator scratch,
                      ffi::AnyBuffer buf, ffi::RemainingRets leaves, float scale) {
  kernels::DType buf_dtype;
  ffi::Error e = DTypeOf(buf, "coarse_unpack", "the packed buffer", &buf_dtype);
  if (e.failure()) return e;
  int64_t total = 0;
  auto spans = LeafSpans(Buffers(leaves), buf, "coarse_unpack", device, stream, scratch, &total);
  if (spans.has_error()) return spans.error();
  return ToXlaError(
      Check(kernels::LaunchUnpack(buf.untyped_data(), buf_dtype, spans.value(),
                                  static_cast<int64_t>(leaves.size()), total, scale, stream),
            "coarse_unpack: launch"));
}

ffi::Error ReduceImpl(cudaStream_t stream, ffi::RemainingArgs inputs,
                      ffi::Result<ffi::AnyBuffer> out, float scale) {
  ffi::Error e = CheckReduceOperands(inputs, *out);
  if (e.failure()) return e;
  kernels::DType dtype;
  e = DTypeOf(*out, "coarse_reduce", "the output", &dtype);
  if (e.failure()) return e;
  std::vector<const void*> ptrs;
  for (size_t a = 0; a < inputs.size(); ++a)
    ptrs.push_back(inputs.get<ffi::AnyBuffer>(a).value().untyped_data());
  return ToXlaError(
      Check(kernels::LaunchReduce(ptrs.data(), static_cast<int>(ptrs.size()), out->untyped_data(),
                                  static_cast<int64_t>(out->element_count()), dtype, scale, stream),
            "coarse_reduce: launch"));
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(Pack, PackImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's stream
                                  .Ctx<ffi::DeviceOrdinal>()                 // whose pinned uploads
                                  .Ctx<ffi::ScratchAllocator>()              // span table
                                  .RemainingArgs()                           // leaves, any shapes
                                  .Ret<ffi::AnyBuffer>()                     // 1-D packed buffer
                                  .Attr<float>("scale"));  // multiplies every element

XLA_FFI_DEFINE_HANDLER_SYMBOL(Unpack, UnpackImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's stream
                                  .Ctx<ffi::DeviceOrdinal>()                 // whose pinned uploads
                                  .Ctx<ffi::ScratchAllocator>()              // span table
                                  .Arg<ffi::AnyBuffer>()                     // 1-D packed buffer
                                  .RemainingRets()                           // leaves, any shapes
                                  .Attr<float>("scale"));  // multiplies every element

// Pure stream work (its launches take every pointer by value, and it has no
// host side effect), so XLA may capture it into a command buffer (a CUDA
// graph) and replay it. Pack and unpack are not: each uploads a span table
// from host memory that a replay would not refresh.
XLA_FFI_DEFINE_HANDLER_SYMBOL(Reduce, ReduceImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's stream
                                  .RemainingArgs()        // 1..8 arrays, one shape and dtype
                                  .Ret<ffi::AnyBuffer>()  // scale * their sum
                                  .Attr<float>("scale"),  // applied once, after the sum
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace coarse::cuda
