// coarse_proxy_ring's XLA translation: zeroes the token result and, on a
// proxy, runs ReducePieces (runtime/phases/reduce_pieces.cc). Workers run
// this call as a no-op; its operands (the pushes' outputs) only order their
// pull after their pushes.
#include "runtime/phases.h"
#include "sync_ops.h"

namespace coarse {
namespace ffi = xla::ffi;

ffi::Error ProxyRingBody(Call& call, Device& dev, ffi::Result<ffi::AnyBuffer> token) {
  ffi::Error e = dev.ZeroBytes(token->untyped_data(), token->size_bytes());
  if (e.failure()) return e;
  return call.who.tier == kProxy ? ReducePieces(call, dev) : ffi::Error::Success();
}

}  // namespace coarse
