// coarse_begin's XLA translation: the first call of a sync on each worker,
// at the head of the step's computation (before the forward pass of a
// coarse.value_and_grad or coarse.value_and_update). Everything it does is
// RunCall's part of every call (xla/handler.h): join the session, start the
// proxies' jobs if no worker has (runtime/service.h), and wait for the
// storage's previous user. Done here, it overlaps the forward pass: the
// proxies' jobs are queued before the first push, and where a core is free
// they have started (their thread woken, their device made, their storage
// acquired) and wait for it by the time it arrives. The body only zeroes the
// token result, which the sync's first push takes as its ordering operand.
#include "xla/sync_ops.h"

namespace coarse {
namespace ffi = xla::ffi;

ffi::Error BeginBody(Call& call, Device& dev, ffi::Result<ffi::AnyBuffer> token) {
  (void)call;
  return ToXlaError(dev.ZeroBytes(token->untyped_data(), token->size_bytes()));
}

}  // namespace coarse
