// The device a call or a proxy's job runs on in the CPU module: a
// StreamDevice, the CUDA backend's orchestration, over one of the CPU
// platform's streams, for the backend chosen when it loaded
// (cpu_backend_choice.h): the inline stream (inline_stream.h: work done
// when enqueued, one address space, the shared-memory strategy), or with
// COARSE_JAX_BACKEND=streams the threaded host stream of the caller's mesh
// device (host_stream.h; a worker's stands for XLA's stream, a proxy's is
// the one the runtime owns). Used by the handlers (handlers_cpu.cc) and the
// self-test (lab/cpu_selftest.cc) alike.
#pragma once

#include <memory>

#include "cpu/host_stream.h"
#include "runtime/call.h"
#include "runtime/device.h"
#include "runtime/service.h"
#include "runtime/status.h"

namespace coarse {

// The device `call` runs on. With the streams backend `*queue` (if given)
// names its stream; else it is left alone.
StatusOr<std::unique_ptr<Device>> MakeCpuDevice(const Call& call, HostQueue** queue);
// With the streams backend, the streams a worker's call enqueues on that it
// answers for before it returns (handlers_cpu.cc): its own, and with a proxy
// in host memory its copy-up stream (whose flag waits report their timeouts
// there); null on the inline stream.
struct WorkerStreams {
  HostQueue* main = nullptr;
  HostQueue* ups = nullptr;
};
// A worker's call's device: a StreamDevice kept in the storage set across
// its calls (KeptStreamDevice); `*streams` (if given) names its streams.
StatusOr<DeviceHandle> CpuWorkerDevice(const Call& call, WorkerStreams* streams);

// The proxies' jobs run on the same backend (runtime/service.h).
const MakeProxyDevice& CpuProxies();

}  // namespace coarse
