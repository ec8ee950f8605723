// MakeCpuDevice and CpuProxies (see cpu_devices.h).
#include "cpu/cpu_devices.h"

#include <vector>

#include "cpu/cpu_backend_choice.h"
#include "host/inline_stream.h"
#include "runtime/host_proxy_device.h"
#include "runtime/stream_device.h"

namespace coarse {

namespace {

// The resources of `call`'s storage set (both backends' sets have them).
StatusOr<StreamResources*> ResourcesOf(const Call& call) {
  auto* res = dynamic_cast<StreamResources*>(&call.session->storage());
  if (res == nullptr)
    return Status::Internal(
        "coarse_jax: a CPU session's storage has no streams' resources (the storage pool "
        "installed is not the CPU module's)");
  return res;
}

int64_t OrdinalOf(const Call& call) {
  const std::vector<int64_t>& ordinals = call.session->ordinals();
  return ordinals.empty() ? call.device() : ordinals[call.device()];
}

bool Inline() { return ActiveCpuBackend() != CpuBackend::kStreams; }

// The stream `call`'s device runs on: the inline one, or the host stream
// `q` (the caller's).
std::unique_ptr<Stream> StreamOn(HostQueue* q) {
  if (q == nullptr) return MakeInlineHostStream();
  return std::make_unique<HostStream>(*q);
}

// A worker's StreamDevice; with a proxy in host memory (the streams
// backend's: the shared sets have none) its copies down and up run on copy
// streams of their own.
std::unique_ptr<StreamDevice> StreamWorker(const Call& call, StreamResources& res, HostQueue* q) {
  std::unique_ptr<Stream> copies, ups;
  if (q != nullptr && HasHostProxy(call.plan(), res)) {
    copies = std::make_unique<HostStream>(CopyQueue(OrdinalOf(call)));
    ups = std::make_unique<HostStream>(CopyUpQueue(OrdinalOf(call)));
  }
  return std::make_unique<StreamDevice>(StreamOn(q), call.device(), res, std::move(copies),
                                        std::move(ups));
}

}  // namespace

StatusOr<std::unique_ptr<Device>> MakeCpuDevice(const Call& call, HostQueue** queue) {
  auto res = ResourcesOf(call);
  if (res.has_error()) return res.error();
  const bool worker = call.who.tier == kWorker;
  HostQueue* q = nullptr;
  if (!Inline()) q = worker ? &WorkerQueue(OrdinalOf(call)) : &ProxyQueue(OrdinalOf(call));
  if (queue != nullptr && q != nullptr) *queue = q;
  if (worker) return std::unique_ptr<Device>(StreamWorker(call, *res.value(), q));
  if (res.value()->in_host_memory(call.device())) {
    // A proxy in host memory: the host's loops in its job's thread, as with
    // GPU workers (host_proxy_device.h); its stream only serves host waits.
    Session& s = *call.session;
    return std::unique_ptr<Device>(new HostProxyDevice(
        MakeInlineHostStream(), StreamOn(q), *res.value(), s.p(),
        call.who.Describe() + s.DescribeStep(), s.PeerWaitLimit(), StreamChaosSeed()));
  }
  return std::unique_ptr<Device>(new StreamDevice(StreamOn(q), call.device(), *res.value()));
}

StatusOr<DeviceHandle> CpuWorkerDevice(const Call& call, WorkerStreams* streams) {
  auto res = ResourcesOf(call);
  if (res.has_error()) return res.error();
  // The inline stream is the same whoever runs it: the key of every inline device.
  static const char kInline = 0;
  HostQueue* q = Inline() ? nullptr : &WorkerQueue(OrdinalOf(call));
  if (streams != nullptr && q != nullptr) {
    streams->main = q;
    if (HasHostProxy(call.plan(), *res.value())) streams->ups = &CopyUpQueue(OrdinalOf(call));
  }
  const void* key = q != nullptr ? static_cast<const void*>(q) : &kInline;
  return KeptStreamDevice(*res.value(), call.device(), key,
                          [&]() -> StatusOr<std::unique_ptr<StreamDevice>> {
                            return StreamWorker(call, *res.value(), q);
                          });
}

const MakeProxyDevice& CpuProxies() {
  static const MakeProxyDevice make = [](const Call& call) { return MakeCpuDevice(call, nullptr); };
  return make;
}

}  // namespace coarse
