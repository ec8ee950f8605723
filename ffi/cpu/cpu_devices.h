// The device a call or a proxy's job runs on in the CPU module, for the
// backend chosen when it loaded (cpu_backend_choice.h): a CpuDevice, or with
// COARSE_JAX_BACKEND=streams a StreamDevice over the host stream of the
// caller's mesh device (host_stream.h; a worker's stands for XLA's stream,
// a proxy's is the one the runtime owns). Used by the handlers
// (handlers_cpu.cc) and the self-test (lab/cpu_selftest.cc) alike.
#pragma once

#include <memory>

#include "cpu/host_stream.h"
#include "runtime/call.h"
#include "runtime/device.h"
#include "runtime/service.h"
#include "xla/ffi/api/ffi.h"

namespace coarse {

// The device `call` runs on. With the streams backend `*queue` (if given)
// names its stream; else it is left alone.
xla::ffi::ErrorOr<std::unique_ptr<Device>> MakeCpuDevice(const Call& call, HostQueue** queue);
// A worker's call's device: with the streams backend a StreamDevice kept in
// the storage set across its calls (KeptStreamDevice), else the one
// stateless CpuDevice; `*queue` as MakeCpuDevice's.
xla::ffi::ErrorOr<DeviceHandle> CpuWorkerDevice(const Call& call, HostQueue** queue);

// The proxies' jobs run on the same backend (runtime/service.h).
const MakeProxyDevice& CpuProxies();

}  // namespace coarse
