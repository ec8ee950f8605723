// The CPU bindings of coarse_begin / coarse_push / coarse_proxy_ring / coarse_worker_ring /
// coarse_pull / coarse_probe: the caller is named by the (tier, data)
// operand, and each call's translation (xla/sync_ops.h, xla/probe.h) runs inside
// RunCall (xla/handler.h) on a StreamDevice, the CUDA backend's
// orchestration, over the CPU platform's inline stream, or with
// COARSE_JAX_BACKEND=streams (cpu_backend_choice.h) over the caller's host
// stream (cpu_devices.h). coarse_host_gather (xla/host_gather.h, CPU only)
// runs outside any session, on an inline stream of its own. The CUDA twin:
// cuda/handlers_cuda.cc.
#include <chrono>
#include <memory>
#include <string>

#include "cpu/cpu_devices.h"
#include "cpu/host_stream.h"
#include "host/inline_stream.h"
#include "runtime/stream_device.h"
#include "xla/handler.h"
#include "xla/host_gather.h"
#include "xla/probe.h"
#include "xla/stream_host_io.h"
#include "xla/sync_ops.h"

namespace coarse {
namespace ffi = xla::ffi;

namespace {

// RunCall (xla/handler.h) on this module's backend (cpu_devices.h). XLA:CPU runs the next
// operation as soon as a custom call returns, so with the streams backend
// the call drains its device's stream before it returns: the one place it
// differs from a GPU, where XLA's next kernel waits in stream order instead.
// (Outputs are then complete when XLA reads them; what is checked is the
// order among the devices' streams within the call and the proxies' jobs.)
// The drain has a deadline, and what the call's streams failed at (a flag
// wait that timed out, whose copies then ran on) fails the call: a call
// never returns success over work its streams did not do.
ffi::Error DrainCall(const WorkerStreams& streams, const CallAttrs& attrs) {
  // Longer than any wait a task of the stream makes itself (a flag wait: the
  // session's peer limit, Session::WaitLimit, 1.25x the timeout).
  const int64_t ms = 2 * attrs.plan.timeout_ms + 1000;
  if (!streams.main->DrainUntil(std::chrono::steady_clock::now() + std::chrono::milliseconds(ms)))
    return ffi::Error::Internal(
        "coarse_jax: " + streams.main->name() + " did not finish this call's work within " +
        std::to_string(ms / 1000) +
        " s (twice the step's timeout): it waits for work that never came, of this program "
        "or of another one on the same device. This is a coarse_jax bug: please report it "
        "with the step's code.");
  for (HostQueue* q : {streams.main, streams.ups}) {
    if (q == nullptr) continue;
    const std::string error = q->TakeError();
    if (!error.empty()) return ffi::Error::Internal(error);
  }
  return ffi::Error::Success();
}

template <typename Body>
ffi::Error RunCpuCall(ffi::RunId run_id, ffi::AnyBuffer& who, const CallAttrs& attrs, Body&& body) {
  WorkerStreams streams;
  ffi::Error e = RunCall(
      run_id, Caller{&who, {}}, attrs,
      [&](const Call& call) { return CpuWorkerDevice(call, &streams); }, std::forward<Body>(body),
      CpuProxies());
  if (streams.main == nullptr) return e;
  ffi::Error drained = DrainCall(streams, attrs);
  return e.failure() ? e : drained;
}

ffi::Error BeginImpl(ffi::RunId run_id, ffi::AnyBuffer who, ffi::Result<ffi::AnyBuffer> token,
                     CallAttrs attrs) {
  return RunCpuCall(run_id, who, attrs,
                    [&](Call& call, Device& dev) { return BeginBody(call, dev, token); });
}

ffi::Error PushImpl(ffi::RunId run_id, ffi::AnyBuffer who, ffi::AnyBuffer after,
                    ffi::RemainingArgs leaves, ffi::RemainingRets outs, CallAttrs attrs,
                    int64_t first_leaf, int64_t first_piece, int64_t num_pieces, bool passthrough) {
  // `after` orders this push after the previous one; its buffer is the token's.
  const PushAttrs bucket{first_leaf, first_piece, num_pieces, passthrough};
  return RunCpuCall(run_id, who, attrs, [&](Call& call, Device& dev) {
    return PushBody(call, dev, after.untyped_data(), leaves, outs, bucket, attrs.push_in_place);
  });
}

// The host's copies to and from XLA's buffers, on the device's stream in
// its order, as the CUDA backend makes them (StreamHostIo).
HostIo IoOf(Device& dev) { return StreamHostIo(static_cast<StreamDevice&>(dev).stream()); }

ffi::Error ProxyRingImpl(ffi::RunId run_id, ffi::AnyBuffer who, ffi::RemainingArgs args,
                         ffi::RemainingRets outs, CallAttrs attrs, int64_t hosts_stage,
                         int64_t num_deps) {
  return RunCpuCall(run_id, who, attrs, [&](Call& call, Device& dev) {
    return ProxyRingBody(call, dev, args, outs, attrs, hosts_stage, num_deps, IoOf(dev));
  });
}

ffi::Error OptCountImpl(ffi::RunId run_id, ffi::AnyBuffer who, ffi::Result<ffi::AnyBuffer> count,
                        CallAttrs attrs) {
  return RunCpuCall(run_id, who, attrs, [&](Call& call, Device& dev) {
    return OptCountBody(call, dev, count, attrs.optimizer, IoOf(dev));
  });
}

ffi::Error WorkerRingImpl(ffi::RunId run_id, ffi::AnyBuffer who, ffi::AnyBuffer token_in,
                          ffi::RemainingArgs leaves, ffi::RemainingRets outs, CallAttrs attrs) {
  (void)token_in;
  return RunCpuCall(run_id, who, attrs, [&](Call& call, Device& dev) {
    return WorkerRingBody(call, dev, leaves, outs);
  });
}

ffi::Error PullImpl(ffi::RunId run_id, ffi::AnyBuffer who, ffi::AnyBuffer token,
                    ffi::RemainingArgs leaves, ffi::RemainingRets outs, CallAttrs attrs) {
  (void)token;
  return RunCpuCall(run_id, who, attrs, [&](Call& call, Device& dev) {
    return PullBody(call, dev, leaves, outs, attrs.push_in_place);
  });
}

ffi::Error HostGatherImpl(ffi::RunId run_id, ffi::AnyBuffer who, ffi::AnyBuffer chunk,
                          ffi::RemainingArgs leaves, ffi::RemainingRets outs, int64_t workers,
                          int64_t site, int64_t timeout_ms, int64_t chunk_size,
                          InterHostLinkAttrs link) {
  (void)leaves;  // aliased to the results; every element is overwritten
  std::unique_ptr<Stream> host = MakeInlineHostStream();
  return HostGatherBody(run_id, who, chunk, outs,
                        HostGatherAttrs{workers, site, timeout_ms, chunk_size, link}, *host);
}

ffi::Error ProbeImpl(ffi::RunId run_id, ffi::AnyBuffer who, ffi::AnyBuffer pairs,
                     ffi::AnyBuffer payload, ffi::Result<ffi::AnyBuffer> times,
                     ffi::Dictionary attrs) {
  return ProbeBody(run_id, who, pairs, payload, times, attrs);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(Begin, BeginImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::RunId>()          // rendezvous key: one execution
                                  .Arg<ffi::AnyBuffer>()      // int32[2] (tier, data index)
                                  .Ret<ffi::AnyBuffer>()      // f32[] token for the first push
                                  .Attr<CallAttrs>("call"));  // plan, site, optimizer, ...

XLA_FFI_DEFINE_HANDLER_SYMBOL(Push, PushImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::RunId>()        // rendezvous key: one execution
                                  .Arg<ffi::AnyBuffer>()    // int32[2] (tier, data index)
                                  .Arg<ffi::AnyBuffer>()    // token of the previous push (ordering)
                                  .RemainingArgs()          // the bucket's gradient leaves
                                  .RemainingRets()          // [the same leaves, aliased,] token
                                  .Attr<CallAttrs>("call")  // plan, site, optimizer, ...
                                  .Attr<int64_t>("first_leaf")   // the bucket's first leaf
                                  .Attr<int64_t>("first_piece")  // the bucket's first piece
                                  .Attr<int64_t>("num_pieces")   // the bucket's pieces
                                  .Attr<bool>("passthrough"));   // the leaves come back

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    ProxyRing, ProxyRingImpl,
    ffi::Ffi::Bind()
        .Ctx<ffi::RunId>()             // rendezvous key: one execution
        .Arg<ffi::AnyBuffer>()         // int32[2] (tier, data index)
        .RemainingArgs()               // push outputs [, params, scalars][, chunks, keys]
        .RemainingRets()               // int32[] token for the next call [, chunks]
        .Attr<CallAttrs>("call")       // plan, site, optimizer, ...
        .Attr<int64_t>("hosts_stage")  // across hosts: 1 or 2; 0 within one host
        .Attr<int64_t>("num_deps"));   // operands before the params (the pushes' outputs)

XLA_FFI_DEFINE_HANDLER_SYMBOL(OptCount, OptCountImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::RunId>()          // rendezvous key: one execution
                                  .Arg<ffi::AnyBuffer>()      // int32[2] (tier, data index)
                                  .Ret<ffi::AnyBuffer>()      // int32[] the step count
                                  .Attr<CallAttrs>("call"));  // plan, site, optimizer, ...

XLA_FFI_DEFINE_HANDLER_SYMBOL(WorkerRing, WorkerRingImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::RunId>()          // rendezvous key: one execution
                                  .Arg<ffi::AnyBuffer>()      // int32[2] (tier, data index)
                                  .Arg<ffi::AnyBuffer>()      // token: after the proxy ring
                                  .RemainingArgs()            // leading leaves
                                  .RemainingRets()            // reduced leading leaves, then token
                                  .Attr<CallAttrs>("call"));  // plan, site, optimizer, ...

XLA_FFI_DEFINE_HANDLER_SYMBOL(Pull, PullImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::RunId>()          // rendezvous key: one execution
                                  .Arg<ffi::AnyBuffer>()      // int32[2] (tier, data index)
                                  .Arg<ffi::AnyBuffer>()      // token: after proxy/worker ring
                                  .RemainingArgs()            // proxy leaves (aliased / pushed)
                                  .RemainingRets()            // the reduced proxy leaves
                                  .Attr<CallAttrs>("call"));  // plan, site, optimizer, ...

XLA_FFI_DEFINE_HANDLER_SYMBOL(HostGather, HostGatherImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::RunId>()            // rendezvous key: one execution
                                  .Arg<ffi::AnyBuffer>()        // int32[2] (tier, data index)
                                  .Arg<ffi::AnyBuffer>()        // f32[width] this device's chunk
                                  .RemainingArgs()              // the synced leaves (aliased)
                                  .RemainingRets()              // the same leaves, global values
                                  .Attr<int64_t>("workers")     // p
                                  .Attr<int64_t>("site")        // the rendezvous key, with the run
                                  .Attr<int64_t>("timeout_ms")  // the wait for the host's workers
                                  .Attr<int64_t>("chunk")       // a chunk's elements that count
                                  .Attr<InterHostLinkAttrs>("link"));  // xla/host_gather.h

XLA_FFI_DEFINE_HANDLER_SYMBOL(Probe, ProbeImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::RunId>()      // rendezvous key: one execution
                                  .Arg<ffi::AnyBuffer>()  // int32[2] (tier, data index)
                                  .Arg<ffi::AnyBuffer>()  // int32[4] (src, dst) pairs, -1 unused
                                  .Arg<ffi::AnyBuffer>()  // payload, the bytes to move
                                  .Ret<ffi::AnyBuffer>()  // float32[reps] seconds (sources only)
                                  // A dictionary: workers, site, timeout_ms and, only on
                                  // emulated links or host proxies, emu_*, host_proxies.
                                  .Attrs<ffi::Dictionary>());

}  // namespace coarse
