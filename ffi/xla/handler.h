// What every coarse_* sync handler does first and last, on any platform:
// read the plan and the call site from the attributes, learn which device is
// calling, join the session, make the caller's first call of the session wait
// for the previous user of the storage, and on the way out either leave the
// session (attribute last=1: the last call of the step on this device) or
// poison it (runtime/call.h).
//
// The protocol of each call is written once (runtime/phases.h) and
// translated from XLA buffers once (xla/sync_ops.h); cpu/handlers_cpu.cc and
// cuda/handlers_cuda.cc bind it to XLA for each platform through RunCall.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include "runtime/call.h"
#include "runtime/device.h"
#include "runtime/service.h"
#include "runtime/session.h"
#include "xla/ffi/api/ffi.h"

namespace coarse {

// How the caller is identified: on CPU by the int32[2] (tier, data) operand,
// read on the host; on CUDA that operand lives on the GPU, so by the device
// ordinal XLA runs the call on, looked up in the "ordinals" attribute.
struct Caller {
  const xla::ffi::AnyBuffer* who_operand = nullptr;
  std::optional<int64_t> ordinal;
};

// Reads the int32[2] (tier, data index) operand.
xla::ffi::ErrorOr<Who> ReadWho(xla::ffi::AnyBuffer who, int64_t workers, int64_t proxies);

// Attributes read here besides the plan's (see xla/plan_attrs.h): site (int64,
// which coarse sync of the program), last (int64 0/1, this call ends the step
// on its device), ordinals (int64[2p], the platform's device number of every
// mesh device; optional on CPU).
xla::ffi::ErrorOr<Call> BeginCall(xla::ffi::RunId run_id, const Caller& caller,
                                  const xla::ffi::Dictionary& attrs);

// FinishCall (runtime/call.h) with `last` read from the attributes.
xla::ffi::Error EndCall(Call& call, Device& device, xla::ffi::Error status,
                        const xla::ffi::Dictionary& attrs);

// A worker's call starts the session's proxy jobs (runtime/service.h) the
// first time any worker calls into the session (Call::started_proxies says
// it did); later calls do nothing. `make_proxy_device` makes the device a
// job runs on.
xla::ffi::Error StartProxyService(Call& call, const xla::ffi::Dictionary& attrs,
                                  const MakeProxyDevice& make_proxy_device);

// BeginCall, a device from `make_device(call)` (a DeviceHandle, or a
// std::unique_ptr<Device> of the call's own), the proxies' jobs
// (StartProxyService), AcquireStorage, `body(call, device)`, EndCall: the
// whole life of one handler call.
template <typename MakeDevice, typename Body>
xla::ffi::Error RunCall(xla::ffi::RunId run_id, const Caller& caller,
                        const xla::ffi::Dictionary& attrs, MakeDevice&& make_device, Body&& body,
                        const MakeProxyDevice& make_proxy_device) {
  auto begun = BeginCall(run_id, caller, attrs);
  if (begun.has_error()) return begun.error();
  Call call = std::move(begun.value());
  auto made = make_device(call);
  if (made.has_error()) {
    call.session->Poison(made.error().message());
    call.session->Finish(call.device());
    return made.error();
  }
  const DeviceHandle device(std::move(made.value()));
  Device& dev = *device;
  xla::ffi::Error status = StartProxyService(call, attrs, make_proxy_device);
  if (status.success()) status = AcquireStorage(call, dev);
  if (status.success()) status = body(call, dev);
  if (status.success()) status = dev.Flush();  // what the call's device held back (Device::Flush)
  return EndCall(call, dev, std::move(status), attrs);
}

}  // namespace coarse
