// MakeCpuDevice and CpuProxies (see cpu_devices.h).
#include "cpu/cpu_devices.h"

#include <vector>

#include "cpu/cpu_backend_choice.h"
#include "cpu/cpu_device.h"
#include "runtime/host_proxy_device.h"
#include "runtime/stream_device.h"

namespace coarse {
namespace ffi = xla::ffi;

namespace {

// The streams backend's resources of `call`'s storage set.
ffi::ErrorOr<StreamResources*> ResourcesOf(const Call& call) {
  auto* res = dynamic_cast<StreamResources*>(&call.session->storage());
  if (res == nullptr)
    return ffi::Unexpected(ffi::Error::Internal(
        "coarse_jax: the streams backend got a session whose storage has no streams' resources "
        "(the storage pool was installed for the plain CPU backend)"));
  return res;
}

int64_t OrdinalOf(const Call& call) {
  const std::vector<int64_t>& ordinals = call.session->ordinals();
  return ordinals.empty() ? call.device() : ordinals[call.device()];
}

// A worker's StreamDevice over its host stream, `q`; with a proxy in host
// memory its copies down and up run on copy streams of their own.
std::unique_ptr<StreamDevice> StreamWorker(const Call& call, StreamResources& res, HostQueue& q) {
  std::unique_ptr<Stream> copies, ups;
  if (HasHostProxy(call.plan(), res)) {
    copies = std::make_unique<HostStream>(CopyQueue(OrdinalOf(call)));
    ups = std::make_unique<HostStream>(CopyUpQueue(OrdinalOf(call)));
  }
  return std::make_unique<StreamDevice>(std::make_unique<HostStream>(q), call.device(), res,
                                        std::move(copies), std::move(ups));
}

}  // namespace

ffi::ErrorOr<std::unique_ptr<Device>> MakeCpuDevice(const Call& call, HostQueue** queue) {
  if (ActiveCpuBackend() != CpuBackend::kStreams) return std::unique_ptr<Device>(new CpuDevice);
  auto res = ResourcesOf(call);
  if (res.has_error()) return ffi::Unexpected(res.error());
  const bool worker = call.who.tier == kWorker;
  HostQueue& q = worker ? WorkerQueue(OrdinalOf(call)) : ProxyQueue(OrdinalOf(call));
  if (queue != nullptr) *queue = &q;
  if (worker) return std::unique_ptr<Device>(StreamWorker(call, *res.value(), q));
  if (res.value()->in_host_memory(call.device())) {
    // A proxy in host memory: the host's loops in its job's thread, as with
    // GPU workers (host_proxy_device.h); its stream only serves host waits.
    Session& s = *call.session;
    return std::unique_ptr<Device>(new HostProxyDevice(
        std::make_unique<CpuDevice>(), std::make_unique<HostStream>(q), *res.value(), s.p(),
        call.who.Describe() + s.DescribeStep(), s.PeerWaitLimit(), StreamChaosSeed()));
  }
  return std::unique_ptr<Device>(
      new StreamDevice(std::make_unique<HostStream>(q), call.device(), *res.value()));
}

ffi::ErrorOr<DeviceHandle> CpuWorkerDevice(const Call& call, HostQueue** queue) {
  if (ActiveCpuBackend() != CpuBackend::kStreams) {
    static CpuDevice cpu;  // no state: one for every call
    return DeviceHandle(cpu, nullptr);
  }
  auto res = ResourcesOf(call);
  if (res.has_error()) return ffi::Unexpected(res.error());
  HostQueue& q = WorkerQueue(OrdinalOf(call));
  if (queue != nullptr) *queue = &q;
  return KeptStreamDevice(*res.value(), call.device(), &q,
                          [&]() -> ffi::ErrorOr<std::unique_ptr<StreamDevice>> {
                            return StreamWorker(call, *res.value(), q);
                          });
}

const MakeProxyDevice& CpuProxies() {
  static const MakeProxyDevice make = [](const Call& call) { return MakeCpuDevice(call, nullptr); };
  return make;
}

}  // namespace coarse
