// The XLA translation of the sync custom calls, one file each (xla/begin.cc,
// xla/push.cc, xla/proxy_ring.cc, xla/worker_ring.cc, xla/pull.cc): read the call's operands,
// results and attributes, check them against the plan, and run the call's phase (runtime/phases.h).
// Platform-neutral: cpu/handlers_cpu.cc and cuda/handlers_cuda.cc bind them to XLA, inside RunCall
// (xla/handler.h).
#pragma once

#include <cstddef>
#include <functional>

#include "runtime/call.h"
#include "runtime/device.h"
#include "runtime/service.h"
#include "xla/ffi/api/ffi.h"

namespace coarse {

// coarse_begin: no operand but the caller's, result a token (f32[], zeroed)
// for the sync's first push. Its work is RunCall's (xla/begin.cc).
xla::ffi::Error BeginBody(Call& call, Device& dev, xla::ffi::Result<xla::ffi::AnyBuffer> token);
// coarse_push: operands the bucket's leaves, results [the same leaves,] token.
// `after`: the previous token's buffer; the token result aliases it (nothing
// to write) unless XLA had to copy.
xla::ffi::Error PushBody(Call& call, Device& dev, const void* after, xla::ffi::RemainingArgs leaves,
                         xla::ffi::RemainingRets outs, const xla::ffi::Dictionary& attrs);
// How a platform moves the proxy optimizer's few scalars between an XLA
// buffer and the host (CPU: plain loads and stores; CUDA: small blocking
// copies).
struct HostIo {
  std::function<xla::ffi::Error(xla::ffi::AnyBuffer src, void* dst, size_t bytes)> read;
  std::function<xla::ffi::Error(const void* src, xla::ffi::Result<xla::ffi::AnyBuffer> dst,
                                size_t bytes)>
      write;
};

// coarse_proxy_ring: operands the pushes' outputs (dependencies only) and,
// in a value_and_update, the params and the step's scalars; across hosts
// also the exchanged chunks (xla/proxy_ring.cc). Results: the token [, chunks].
xla::ffi::Error ProxyRingBody(Call& call, Device& dev, xla::ffi::RemainingArgs args,
                              xla::ffi::RemainingRets outs, const xla::ffi::Dictionary& attrs,
                              const HostIo& io);
// What the proxies' jobs of a session need (runtime/service.h), from the
// attributes every call of its site carries: push_in_place and, in a
// value_and_update, the optimizer and its store.
xla::ffi::ErrorOr<ProxyJob> ReadProxyJob(const xla::ffi::Dictionary& attrs, const Plan& plan);
// coarse_opt_count: the int32 step count of the store's next update.
xla::ffi::Error OptCountBody(Call& call, Device& dev, xla::ffi::Result<xla::ffi::AnyBuffer> count,
                             const xla::ffi::Dictionary& attrs, const HostIo& io);
// coarse_worker_ring: operands the leading leaves, results the reduced
// leading leaves, then the token.
xla::ffi::Error WorkerRingBody(Call& call, Device& dev, xla::ffi::RemainingArgs leaves,
                               xla::ffi::RemainingRets outs);
// coarse_pull: operands the proxy leaves (aliased to the results, or, with
// push_in_place, the pushed leaves the proxies read), results the reduced
// proxy leaves.
xla::ffi::Error PullBody(Call& call, Device& dev, xla::ffi::RemainingArgs leaves,
                         xla::ffi::RemainingRets outs, const xla::ffi::Dictionary& attrs);

// Attribute push_in_place of coarse_push, coarse_proxy_ring and coarse_pull:
// the Python side keeps every pushed leaf alive until the pull, so the
// proxies may read the pushes in place (PushesInPlace, runtime/phases.h).
// Absent: 0.
inline bool PushInPlaceAttr(const xla::ffi::Dictionary& attrs) {
  if (!attrs.contains("push_in_place")) return false;
  auto v = attrs.get<int64_t>("push_in_place");
  return v.has_value() && v.value() != 0;
}

}  // namespace coarse
