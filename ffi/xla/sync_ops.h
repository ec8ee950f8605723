// The XLA translation of the sync custom calls, one file each (xla/begin.cc,
// xla/push.cc, xla/proxy_ring.cc, xla/worker_ring.cc, xla/pull.cc): read the call's operands,
// results and typed attributes (xla/call_attrs.h), check them against the plan, and run the call's
// phase (runtime/phases.h).
// Platform-neutral: cpu/handlers_cpu.cc and cuda/handlers_cuda.cc bind them to XLA, inside RunCall
// (xla/handler.h).
#pragma once

#include <cstddef>
#include <functional>

#include "runtime/call.h"
#include "runtime/device.h"
#include "runtime/service.h"
#include "xla/call_attrs.h"
#include "xla/ffi/api/ffi.h"
#include "xla/status_xla.h"

namespace coarse {

// coarse_begin: no operand but the caller's, result a token (f32[], zeroed)
// for the sync's first push. Its work is RunCall's (xla/begin.cc).
xla::ffi::Error BeginBody(Call& call, Device& dev, xla::ffi::Result<xla::ffi::AnyBuffer> token);
// coarse_push's own attributes: the bucket (its leaves among the plan's
// proxy leaves, its pieces among the plan's) and passthrough (the leaves
// come back as results, for backward hooks).
struct PushAttrs {
  int64_t first_leaf, first_piece, num_pieces;
  bool passthrough;
};
// coarse_push: operands the bucket's leaves, results [the same leaves,] token.
// `after`: the previous token's buffer; the token result aliases it (nothing
// to write) unless XLA had to copy.
xla::ffi::Error PushBody(Call& call, Device& dev, const void* after, xla::ffi::RemainingArgs leaves,
                         xla::ffi::RemainingRets outs, const PushAttrs& bucket, bool push_in_place);
// How a platform moves the proxy optimizer's few scalars between an XLA
// buffer and the host (CPU: plain loads and stores; CUDA: small blocking
// copies).
struct HostIo {
  std::function<xla::ffi::Error(xla::ffi::AnyBuffer src, void* dst, size_t bytes)> read;
  std::function<xla::ffi::Error(const void* src, xla::ffi::Result<xla::ffi::AnyBuffer> dst,
                                size_t bytes)>
      write;
};

// coarse_proxy_ring: operands the pushes' outputs (the first `num_deps`,
// dependencies only) and, in a value_and_update, the params and the step's
// scalars; across hosts (`hosts_stage` 1 or 2; 0: within one host) also the
// exchanged chunks (xla/proxy_ring.cc). Results: the token [, chunks].
xla::ffi::Error ProxyRingBody(Call& call, Device& dev, xla::ffi::RemainingArgs args,
                              xla::ffi::RemainingRets outs, const CallAttrs& attrs,
                              int64_t hosts_stage, int64_t num_deps, const HostIo& io);
// What the proxies' jobs of a session need (runtime/service.h), from the
// attributes every call of its site carries: push_in_place, across_hosts
// and, in a value_and_update, the optimizer and its store.
xla::ffi::ErrorOr<ProxyJob> ReadProxyJob(const CallAttrs& attrs, const Plan& plan);
// coarse_opt_count: the int32 step count of the store's next update.
xla::ffi::Error OptCountBody(Call& call, Device& dev, xla::ffi::Result<xla::ffi::AnyBuffer> count,
                             const OptimizerAttrs& attrs, const HostIo& io);
// coarse_worker_ring: operands the leading leaves, results the reduced
// leading leaves, then the token.
xla::ffi::Error WorkerRingBody(Call& call, Device& dev, xla::ffi::RemainingArgs leaves,
                               xla::ffi::RemainingRets outs);
// coarse_pull: operands the proxy leaves (aliased to the results, or, with
// push_in_place, the pushed leaves the proxies read), results the reduced
// proxy leaves.
xla::ffi::Error PullBody(Call& call, Device& dev, xla::ffi::RemainingArgs leaves,
                         xla::ffi::RemainingRets outs, bool push_in_place);

}  // namespace coarse
