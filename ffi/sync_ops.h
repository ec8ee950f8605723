// The XLA translation of the four sync custom calls, one file each (push.cc,
// proxy_ring.cc, worker_ring.cc, pull.cc): read the call's operands, results
// and attributes, check them against the plan, and run the call's phase
// (runtime/phases.h). Platform-neutral: cpu/handlers_cpu.cc and
// cuda/handlers_cuda.cc bind them to XLA, inside RunCall (handler.h).
#pragma once

#include "runtime/call.h"
#include "runtime/device.h"
#include "xla/ffi/api/ffi.h"

namespace coarse {

// coarse_push: operands the bucket's leaves, results [the same leaves,] token.
xla::ffi::Error PushBody(Call& call, Device& dev, xla::ffi::RemainingArgs leaves,
                         xla::ffi::RemainingRets outs, const xla::ffi::Dictionary& attrs);
// coarse_proxy_ring: the token result.
xla::ffi::Error ProxyRingBody(Call& call, Device& dev, xla::ffi::Result<xla::ffi::AnyBuffer> token);
// coarse_worker_ring: operands the leading leaves, results the reduced
// leading leaves, then the token.
xla::ffi::Error WorkerRingBody(Call& call, Device& dev, xla::ffi::RemainingArgs leaves,
                               xla::ffi::RemainingRets outs);
// coarse_pull: results the reduced proxy leaves.
xla::ffi::Error PullBody(Call& call, Device& dev, xla::ffi::RemainingRets outs);

}  // namespace coarse
