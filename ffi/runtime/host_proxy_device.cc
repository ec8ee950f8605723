// HostProxyDevice (see host_proxy_device.h).
#include "runtime/host_proxy_device.h"

#include <functional>
#include <thread>
#include <utility>

#include "runtime/stream_ops.h"

namespace coarse {
namespace ffi = xla::ffi;

HostProxyDevice::HostProxyDevice(std::unique_ptr<Device> host, std::unique_ptr<Stream> waits,
                                 StreamResources& resources, int64_t workers, std::string who,
                                 std::chrono::milliseconds timeout,
                                 std::optional<uint64_t> chaos_seed)
    : host_(std::move(host)),
      waits_(Counted(std::move(waits), resources)),
      res_(resources),
      workers_(workers),
      who_(std::move(who)),
      timeout_(timeout) {
  if (chaos_seed) chaos_.emplace(*chaos_seed ^ std::hash<std::string>{}(who_));
}

void HostProxyDevice::Stall() {
  if (!chaos_) return;
  const uint64_t r = (*chaos_)();
  if (r % 2 == 0) std::this_thread::sleep_for(std::chrono::microseconds((r >> 8) % 1500));
}

ffi::Error HostProxyDevice::Acquire(int64_t device) {
  // Another proxy in host memory wrote its storage on the host before its
  // counters said so; a worker's writes are copies on its stream.
  if (device >= workers_) return ffi::Error::Success();
  return acquired_.WaitOnce(res_, device, [&] {
    return waits_->HostWait(res_.event(device), timeout_,
                            "coarse_jax: " + who_ + ": worker " + std::to_string(device) +
                                "'s stream to finish its device-to-host copies into this proxy");
  });
}

}  // namespace coarse
