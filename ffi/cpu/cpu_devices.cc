// MakeCpuDevice and CpuProxies (see cpu_devices.h).
#include "cpu/cpu_devices.h"

#include <vector>

#include "cpu/cpu_backend_choice.h"
#include "cpu/cpu_device.h"
#include "runtime/host_proxy_device.h"
#include "runtime/stream_device.h"

namespace coarse {
namespace ffi = xla::ffi;

ffi::ErrorOr<std::unique_ptr<Device>> MakeCpuDevice(const Call& call, HostQueue** queue) {
  if (ActiveCpuBackend() != CpuBackend::kStreams) return std::unique_ptr<Device>(new CpuDevice);
  auto* res = dynamic_cast<StreamResources*>(&call.session->storage());
  if (res == nullptr)
    return ffi::Unexpected(ffi::Error::Internal(
        "coarse_jax: the streams backend got a session whose storage has no streams' resources "
        "(the storage pool was installed for the plain CPU backend)"));
  const std::vector<int64_t>& ordinals = call.session->ordinals();
  const int64_t ordinal = ordinals.empty() ? call.device() : ordinals[call.device()];
  HostQueue& q = call.who.tier == kWorker ? WorkerQueue(ordinal) : ProxyQueue(ordinal);
  if (queue != nullptr) *queue = &q;
  if (call.who.tier == kProxy && res->in_host_memory(call.device())) {
    // A proxy in host memory: the host's loops in its job's thread, as with
    // GPU workers (host_proxy_device.h); its stream only serves host waits.
    Session& s = *call.session;
    return std::unique_ptr<Device>(new HostProxyDevice(
        std::make_unique<CpuDevice>(), std::make_unique<HostStream>(q), *res, s.p(),
        call.who.Describe() + s.DescribeStep(), s.PeerWaitLimit(), StreamChaosSeed()));
  }
  // A worker of a session with a proxy in host memory copies down to it on
  // a copy stream of its own.
  std::unique_ptr<Stream> copies, ups;
  if (call.who.tier == kWorker && HasHostProxy(call.plan(), *res)) {
    copies = std::make_unique<HostStream>(CopyQueue(ordinal));
    ups = std::make_unique<HostStream>(CopyUpQueue(ordinal));
  }
  return std::unique_ptr<Device>(new StreamDevice(std::make_unique<HostStream>(q), call.device(),
                                                  *res, std::move(copies), std::move(ups)));
}

const MakeProxyDevice& CpuProxies() {
  static const MakeProxyDevice make = [](const Call& call) { return MakeCpuDevice(call, nullptr); };
  return make;
}

}  // namespace coarse
