// StreamHostIo (see xla/stream_host_io.h).
#include "xla/stream_host_io.h"

namespace coarse {
namespace ffi = xla::ffi;

HostIo StreamHostIo(Stream& stream) {
  return HostIo{[&stream](ffi::AnyBuffer src, void* dst, size_t bytes) {
                  Status e = stream.Download(dst, src.untyped_data(), bytes,
                                             "reading the optimizer's scalars");
                  // The host reads `dst` as soon as this returns.
                  return ToXlaError(e.failure() ? e : stream.Synchronize("optimizer scalars"));
                },
                [&stream](const void* src, ffi::Result<ffi::AnyBuffer> dst, size_t bytes) {
                  // Upload copies `src` as it is enqueued; XLA reads the result in
                  // stream order (on a GPU its next kernel; on the host streams the
                  // handler drains before it returns): no host synchronization.
                  return ToXlaError(stream.Upload(dst->untyped_data(), src, bytes,
                                                  "writing the optimizer's step count"));
                }};
}

}  // namespace coarse
