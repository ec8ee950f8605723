// coarse_host_gather's XLA translation and its CPU binding (CPU only: on GPUs
// coarse_jax/api/_hosts.py uses XLA's all_gather within the host instead).
// Operands: int32[2] (tier, data index), f32[width] this device's chunk of
// the inter-host result. Results: f32[p * proxy_chunk] the proxies' chunks
// end to end, f32[p * worker_chunk] the workers', on every device of the
// host. Attributes: workers (p), site, timeout_ms, proxy_chunk,
// worker_chunk (elements of a chunk that count, <= width). The rendezvous
// is runtime/hand_out.h.
#include <cstring>
#include <string>

#include "handler.h"
#include "runtime/hand_out.h"
#include "xla/ffi/api/ffi.h"

namespace coarse {
namespace ffi = xla::ffi;

namespace {

ffi::Error HostGatherImpl(ffi::RunId run_id, ffi::AnyBuffer who, ffi::AnyBuffer chunk,
                          ffi::Result<ffi::AnyBuffer> proxies, ffi::Result<ffi::AnyBuffer> workers,
                          int64_t p, int64_t site, int64_t timeout_ms, int64_t proxy_chunk,
                          int64_t worker_chunk) {
  auto me = ReadWho(who, p);
  if (me.has_error()) return me.error();
  const int64_t width = static_cast<int64_t>(chunk.element_count());
  if (chunk.element_type() != ffi::DataType::F32 || proxy_chunk > width || worker_chunk > width ||
      proxy_chunk < 0 || worker_chunk < 0)
    return ffi::Error::InvalidArgument(
        "coarse_host_gather: operand 1 must be f32[width] with width >= proxy_chunk, "
        "worker_chunk");
  if (proxies->element_type() != ffi::DataType::F32 ||
      static_cast<int64_t>(proxies->element_count()) != p * proxy_chunk ||
      workers->element_type() != ffi::DataType::F32 ||
      static_cast<int64_t>(workers->element_count()) != p * worker_chunk)
    return ffi::Error::InvalidArgument(
        "coarse_host_gather: results must be f32[p * proxy_chunk], f32[p * worker_chunk]");
  float* q = static_cast<float*>(proxies->untyped_data());
  float* w = static_cast<float*>(workers->untyped_data());
  auto take = [&](int64_t d, const void* src) {
    const bool proxy = d >= p;
    const int64_t n = proxy ? proxy_chunk : worker_chunk;
    float* dst = proxy ? q + (d - p) * proxy_chunk : w + d * worker_chunk;
    if (n > 0) std::memcpy(dst, src, n * sizeof(float));
  };
  auto describe = [&](int64_t d) { return Who{d < p ? kWorker : kProxy, d % p}.Describe(); };
  return HandOut(run_id.run_id, site, me.value().device(p), 2 * p, chunk.untyped_data(), timeout_ms,
                 take, describe);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(HostGather, HostGatherImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::RunId>()            // rendezvous key: one execution
                                  .Arg<ffi::AnyBuffer>()        // int32[2] (tier, data index)
                                  .Arg<ffi::AnyBuffer>()        // f32[width] this device's chunk
                                  .Ret<ffi::AnyBuffer>()        // f32[p * proxy_chunk]
                                  .Ret<ffi::AnyBuffer>()        // f32[p * worker_chunk]
                                  .Attr<int64_t>("workers")     // p
                                  .Attr<int64_t>("site")        // which sync of the program
                                  .Attr<int64_t>("timeout_ms")  // every wait's deadline
                                  .Attr<int64_t>("proxy_chunk")
                                  .Attr<int64_t>("worker_chunk"));

}  // namespace coarse
