// What every coarse_* sync handler does first and last, on any platform:
// read the plan and the call site from the call's typed attributes
// (CallAttrs, xla/call_attrs.h), learn which device is
// calling, join the session, make the caller's first call of the session wait
// for the previous user of the storage, and on the way out either leave the
// session (attribute last: the last call of the step on this device) or
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
#include "xla/call_attrs.h"
#include "xla/ffi/api/ffi.h"
#include "xla/status_xla.h"

namespace coarse {

// How the caller is identified: on CPU by the int32[2] (tier, data) operand,
// read on the host; on CUDA that operand lives on the GPU, so by the device
// ordinal XLA runs the call on, looked up in the call's ordinals.
struct Caller {
  const xla::ffi::AnyBuffer* who_operand = nullptr;
  std::optional<int64_t> ordinal;
};

// Reads the int32[2] (tier, data index) operand.
xla::ffi::ErrorOr<Who> ReadWho(xla::ffi::AnyBuffer who, int64_t workers, int64_t proxies);

// Joins the session of the call's plan and site (CallAttrs: plan, site,
// ordinals).
xla::ffi::ErrorOr<Call> BeginCall(xla::ffi::RunId run_id, const Caller& caller,
                                  const CallAttrs& attrs);

// FinishCall (runtime/call.h), leaving the session if attrs.last.
xla::ffi::Error EndCall(Call& call, Device& device, xla::ffi::Error status, const CallAttrs& attrs);

// A worker's call starts the session's proxy jobs (runtime/service.h) the
// first time any worker calls into the session (Call::started_proxies says
// it did); later calls do nothing. `make_proxy_device` makes the device a
// job runs on.
xla::ffi::Error StartProxyService(Call& call, const CallAttrs& attrs,
                                  const MakeProxyDevice& make_proxy_device);

// BeginCall, a device from `make_device(call)` (a DeviceHandle, or a
// std::unique_ptr<Device> of the call's own), the proxies' jobs
// (StartProxyService), AcquireStorage, `body(call, device)`, EndCall: the
// whole life of one handler call.
template <typename MakeDevice, typename Body>
xla::ffi::Error RunCall(xla::ffi::RunId run_id, const Caller& caller, const CallAttrs& attrs,
                        MakeDevice&& make_device, Body&& body,
                        const MakeProxyDevice& make_proxy_device) {
  auto begun = BeginCall(run_id, caller, attrs);
  if (begun.has_error()) return begun.error();
  Call call = std::move(begun.value());
  auto made = make_device(call);
  if (made.has_error()) {
    call.session->Poison(made.error().message());
    call.session->Finish(call.device());
    return ToXlaError(made.error());
  }
  const DeviceHandle device(std::move(made.value()));
  Device& dev = *device;
  xla::ffi::Error status = StartProxyService(call, attrs, make_proxy_device);
  if (status.success()) status = ToXlaError(AcquireStorage(call, dev));
  if (status.success()) status = body(call, dev);
  if (status.success())
    status = ToXlaError(dev.Flush());  // what the call's device held back (Device::Flush)
  return EndCall(call, dev, std::move(status), attrs);
}

}  // namespace coarse
