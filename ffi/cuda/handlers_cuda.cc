// The CUDA bindings of coarse_begin / coarse_push / coarse_proxy_ring / coarse_worker_ring /
// coarse_pull: the same translation and protocol as on CPU (xla/sync_ops.h,
// runtime/phases.h) inside RunCall (xla/handler.h), run on a StreamDevice
// (runtime/stream_device.h) over a CudaStream on XLA's stream. The caller is named by its device
// ordinal (the (tier, data) operand is on the GPU, so the host cannot read it), looked up in the
// call's ordinals (CallAttrs, xla/call_attrs.h) the Python side adds for the mesh. The proxies'
// part of a step runs in the runtime's service (runtime/service.h) on streams the runtime owns on
// the proxy GPUs (CudaProxies below).
#include <cuda_runtime.h>

#include <memory>

#include "cuda/cuda_storage.h"
#include "cuda/cuda_stream.h"
#include "cuda/cuda_util.h"
#include "host/inline_stream.h"
#include "runtime/host_proxy_device.h"
#include "runtime/stream_device.h"
#include "xla/handler.h"
#include "xla/stream_host_io.h"
#include "xla/sync_ops.h"

namespace coarse::cuda {
namespace ffi = xla::ffi;

namespace {

// The runtime's own streams, one of each kind per GPU: created on first use
// and never destroyed (a job may still hold one while the process exits).
// kProxy: a proxy's. Jobs of several sessions may share it; their work is
// ordered after the workers' pushes by the session's events
// (StreamDevice::Acquire), and the workers' pulls after theirs the same
// way, so no job blocks a stream on the host. With a proxy sharing a
// worker's GPU (coarse_jax.testing shared_device_mesh) it is a stream of
// its own beside XLA's. kCopies: a worker's copies down to a proxy in host
// memory (StreamDevice's `copies`), beside XLA's stream, so the backward
// pass goes on while they run; kCopiesUp: its copies up from one, with the
// flag waits that gate them (`ups`), so XLA's stream does not stall on a
// flag: the two directions of PCIe run at once.
enum class RuntimeStreamKind { kProxy, kCopies, kCopiesUp };
StatusOr<cudaStream_t> RuntimeStream(RuntimeStreamKind kind, int ordinal) {
  const std::string name = kind == RuntimeStreamKind::kProxy    ? "proxy"
                           : kind == RuntimeStreamKind::kCopies ? "copy"
                                                                : "copy-up";
  return OwnedStream(name + " " + std::to_string(ordinal),
                     "the " + name + " stream of GPU " + std::to_string(ordinal));
}

auto DeviceMaker(cudaStream_t stream, int32_t ordinal) {
  return [stream, ordinal](const Call& call) -> StatusOr<DeviceHandle> {
    auto& storage = static_cast<CudaStorage&>(call.session->storage());
    if (!storage.error().empty()) return Status::Internal(storage.error());
    Status e = Check(cudaSetDevice(ordinal), "cudaSetDevice");
    if (e.failure()) return e;
    // Kept in the storage set across the worker's calls, built again only
    // when XLA's stream changed (KeptStreamDevice).
    return KeptStreamDevice(
        storage, call.device(), stream, [&]() -> StatusOr<std::unique_ptr<StreamDevice>> {
          std::unique_ptr<Stream> copies, ups;
          if (HasHostProxy(call.plan(), storage)) {
            auto down = RuntimeStream(RuntimeStreamKind::kCopies, ordinal);
            if (down.has_error()) return down.error();
            auto up = RuntimeStream(RuntimeStreamKind::kCopiesUp, ordinal);
            if (up.has_error()) return up.error();
            copies = std::make_unique<CudaStream>(down.value(), ordinal, storage.ordinals());
            ups = std::make_unique<CudaStream>(up.value(), ordinal, storage.ordinals());
          }
          return std::make_unique<StreamDevice>(
              std::make_unique<CudaStream>(stream, ordinal, storage.ordinals()), call.device(),
              storage, std::move(copies), std::move(ups));
        });
  };
}

// The device a proxy's job runs on: its GPU (the session's ordinals), on
// the runtime's stream there.
const MakeProxyDevice& CudaProxies() {
  static const MakeProxyDevice make = [](const Call& call) -> StatusOr<std::unique_ptr<Device>> {
    auto& storage = static_cast<CudaStorage&>(call.session->storage());
    if (!storage.error().empty()) return Status::Internal(storage.error());
    if (storage.in_host_memory(call.device())) {
      // A proxy in host memory: the CPU platform's loops in this job's thread
      // over its pinned storage; a CUDA stream object only for its host
      // waits on the workers' events (runtime/host_proxy_device.h).
      Session& s = *call.session;
      return std::unique_ptr<Device>(new HostProxyDevice(
          MakeInlineHostStream(),
          std::make_unique<CudaStream>(nullptr, storage.ordinal(0), storage.ordinals()), storage,
          s.p(), call.who.Describe() + s.DescribeStep(), s.PeerWaitLimit()));
    }
    const int ordinal = static_cast<int>(storage.ordinal(call.device()));
    Status e = Check(cudaSetDevice(ordinal), "cudaSetDevice");
    if (e.failure()) return e;
    auto stream = RuntimeStream(RuntimeStreamKind::kProxy, ordinal);
    if (stream.has_error()) return stream.error();
    return std::unique_ptr<Device>(
        new StreamDevice(std::make_unique<CudaStream>(stream.value(), ordinal, storage.ordinals()),
                         call.device(), storage));
  };
  return make;
}

Caller ByOrdinal(int32_t ordinal) { return Caller{nullptr, static_cast<int64_t>(ordinal)}; }

ffi::Error BeginImpl(cudaStream_t stream, int32_t ordinal, ffi::RunId run_id, ffi::AnyBuffer,
                     ffi::Result<ffi::AnyBuffer> token, CallAttrs attrs) {
  return RunCall(
      run_id, ByOrdinal(ordinal), attrs, DeviceMaker(stream, ordinal),
      [&](Call& call, Device& dev) { return BeginBody(call, dev, token); }, CudaProxies());
}

ffi::Error PushImpl(cudaStream_t stream, int32_t ordinal, ffi::RunId run_id, ffi::AnyBuffer,
                    ffi::AnyBuffer after, ffi::RemainingArgs leaves, ffi::RemainingRets outs,
                    CallAttrs attrs, int64_t first_leaf, int64_t first_piece, int64_t num_pieces,
                    bool passthrough) {
  const PushAttrs bucket{first_leaf, first_piece, num_pieces, passthrough};
  return RunCall(
      run_id, ByOrdinal(ordinal), attrs, DeviceMaker(stream, ordinal),
      [&](Call& call, Device& dev) {
        return PushBody(call, dev, after.untyped_data(), leaves, outs, bucket, attrs.push_in_place);
      },
      CudaProxies());
}

// The optimizer's scalars live in GPU memory: small blocking copies on
// XLA's stream (StreamHostIo; a value_and_update's worker k, once per step).
HostIo IoOf(Device& dev) { return StreamHostIo(static_cast<StreamDevice&>(dev).stream()); }

ffi::Error ProxyRingImpl(cudaStream_t stream, int32_t ordinal, ffi::RunId run_id, ffi::AnyBuffer,
                         ffi::RemainingArgs args, ffi::RemainingRets outs, CallAttrs attrs,
                         int64_t hosts_stage, int64_t num_deps) {
  return RunCall(
      run_id, ByOrdinal(ordinal), attrs, DeviceMaker(stream, ordinal),
      [&](Call& call, Device& dev) {
        return ProxyRingBody(call, dev, args, outs, attrs, hosts_stage, num_deps, IoOf(dev));
      },
      CudaProxies());
}

ffi::Error OptCountImpl(cudaStream_t stream, int32_t ordinal, ffi::RunId run_id, ffi::AnyBuffer,
                        ffi::Result<ffi::AnyBuffer> count, CallAttrs attrs) {
  return RunCall(
      run_id, ByOrdinal(ordinal), attrs, DeviceMaker(stream, ordinal),
      [&](Call& call, Device& dev) {
        return OptCountBody(call, dev, count, attrs.optimizer, IoOf(dev));
      },
      CudaProxies());
}

ffi::Error WorkerRingImpl(cudaStream_t stream, int32_t ordinal, ffi::RunId run_id, ffi::AnyBuffer,
                          ffi::AnyBuffer, ffi::RemainingArgs leaves, ffi::RemainingRets outs,
                          CallAttrs attrs) {
  return RunCall(
      run_id, ByOrdinal(ordinal), attrs, DeviceMaker(stream, ordinal),
      [&](Call& call, Device& dev) { return WorkerRingBody(call, dev, leaves, outs); },
      CudaProxies());
}

ffi::Error PullImpl(cudaStream_t stream, int32_t ordinal, ffi::RunId run_id, ffi::AnyBuffer,
                    ffi::AnyBuffer, ffi::RemainingArgs leaves, ffi::RemainingRets outs,
                    CallAttrs attrs) {
  return RunCall(
      run_id, ByOrdinal(ordinal), attrs, DeviceMaker(stream, ordinal),
      [&](Call& call, Device& dev) {
        return PullBody(call, dev, leaves, outs, attrs.push_in_place);
      },
      CudaProxies());
}

}  // namespace

// Operands and results as in handlers_cpu.cc; the (tier, data) operand and
// the ordering tokens are dependencies only.
XLA_FFI_DEFINE_HANDLER_SYMBOL(Begin, BeginImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's stream
                                  .Ctx<ffi::DeviceOrdinal>()                 // names the caller
                                  .Ctx<ffi::RunId>()          // rendezvous key: one execution
                                  .Arg<ffi::AnyBuffer>()      // int32[2] (tier, data index)
                                  .Ret<ffi::AnyBuffer>()      // f32[] token for the first push
                                  .Attr<CallAttrs>("call"));  // plan, site, ordinals, ...

XLA_FFI_DEFINE_HANDLER_SYMBOL(Push, PushImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's stream
                                  .Ctx<ffi::DeviceOrdinal>()                 // names the caller
                                  .Ctx<ffi::RunId>()            // rendezvous key: one execution
                                  .Arg<ffi::AnyBuffer>()        // int32[2] (tier, data index)
                                  .Arg<ffi::AnyBuffer>()        // token of the previous push
                                  .RemainingArgs()              // the bucket's gradient leaves
                                  .RemainingRets()              // [the same leaves, aliased,] token
                                  .Attr<CallAttrs>("call")      // plan, site, ordinals, ...
                                  .Attr<int64_t>("first_leaf")  // the bucket's first leaf
                                  .Attr<int64_t>("first_piece")  // the bucket's first piece
                                  .Attr<int64_t>("num_pieces")   // the bucket's pieces
                                  .Attr<bool>("passthrough"));   // the leaves come back

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    ProxyRing, ProxyRingImpl,
    ffi::Ffi::Bind()
        .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's stream
        .Ctx<ffi::DeviceOrdinal>()                 // names the caller
        .Ctx<ffi::RunId>()                         // rendezvous key: one execution
        .Arg<ffi::AnyBuffer>()                     // int32[2] (tier, data index)
        .RemainingArgs()               // push outputs [, params, scalars][, chunks, keys]
        .RemainingRets()               // token for the next call [, chunks]
        .Attr<CallAttrs>("call")       // plan, site, ordinals, ...
        .Attr<int64_t>("hosts_stage")  // across hosts: 1 or 2; 0 within one host
        .Attr<int64_t>("num_deps"));   // operands before the params (the pushes' outputs)

XLA_FFI_DEFINE_HANDLER_SYMBOL(OptCount, OptCountImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's stream
                                  .Ctx<ffi::DeviceOrdinal>()                 // names the caller
                                  .Ctx<ffi::RunId>()          // rendezvous key: one execution
                                  .Arg<ffi::AnyBuffer>()      // int32[2] (tier, data index)
                                  .Ret<ffi::AnyBuffer>()      // int32[] the step count
                                  .Attr<CallAttrs>("call"));  // plan, site, ordinals, ...

XLA_FFI_DEFINE_HANDLER_SYMBOL(WorkerRing, WorkerRingImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's stream
                                  .Ctx<ffi::DeviceOrdinal>()                 // names the caller
                                  .Ctx<ffi::RunId>()          // rendezvous key: one execution
                                  .Arg<ffi::AnyBuffer>()      // int32[2] (tier, data index)
                                  .Arg<ffi::AnyBuffer>()      // token: after the proxy ring
                                  .RemainingArgs()            // leading leaves
                                  .RemainingRets()            // reduced leading leaves, token
                                  .Attr<CallAttrs>("call"));  // plan, site, ordinals, ...

XLA_FFI_DEFINE_HANDLER_SYMBOL(Pull, PullImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's stream
                                  .Ctx<ffi::DeviceOrdinal>()                 // names the caller
                                  .Ctx<ffi::RunId>()          // rendezvous key: one execution
                                  .Arg<ffi::AnyBuffer>()      // int32[2] (tier, data index)
                                  .Arg<ffi::AnyBuffer>()      // token: after proxy/worker ring
                                  .RemainingArgs()            // proxy leaves (aliased to results)
                                  .RemainingRets()            // the reduced proxy leaves
                                  .Attr<CallAttrs>("call"));  // plan, site, ordinals, ...

}  // namespace coarse::cuda
