// The link probe (coarse_probe): times one or two transfers through the
// runtime's transport.
//
// The profiler (coarse_jax/profile.py) runs coarse_probe on every device of
// the mesh with up to two (src device, dst device) pairs, so one compiled
// program per size measures every link. Each source device copies the
// payload into a runtime buffer of its destination and, on an emulated
// interconnect, waits for the booked arrival: the same Reserve + copy + sleep
// a push, ring step or pull does. Sources start each repetition together (a
// barrier), so two pairs in opposite directions measure the link both ways
// at once. With a virtual clock (emulator.h) nothing sleeps: a repetition
// starts at the simulated time the barrier opened (the latest source's clock)
// and lasts until the booked arrival, so the result is exact. The probe runs
// on CPU devices only: its buffers are host memory. ffi/xla/probe.cc reads the
// call's operands into a ProbeRequest.
//
// Proxies in host memory (make_mesh(..., proxies_on="host")) are no devices
// and run no program: the probe runs on the p workers only, and worker k < q
// also stands for host proxy k (device p + k), on a thread of its own so
// that its transfers start with the other sources'; its times are the
// second half of worker k's result.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "runtime/emulator.h"
#include "runtime/session.h"
#include "runtime/status.h"

namespace coarse {

struct ProbeRequest {
  int64_t run_id = 0;  // the devices of one execution and call site meet
  int64_t site = 0;
  int64_t workers = 0;             // p
  int64_t proxies = 0;             // q: the probe spans p + q devices
  bool host_proxies = false;       // proxies in host memory: workers k < q stand for them
  Who who{kWorker, 0};             // the calling device
  const int32_t* pairs = nullptr;  // [4]: (src, dst) device pairs, -1 unused
  const void* payload = nullptr;   // the bytes each source moves
  int64_t nbytes = 0;
  const Topology* topology = nullptr;    // null: not emulated
  std::chrono::milliseconds timeout{0};  // for the other source at the barrier
  float* times = nullptr;  // [reps] seconds per repetition on a source, 0 elsewhere; with
                           // host proxies [2 * reps]: the worker's, then its host proxy's
  size_t reps = 0;
};

Status RunProbe(const ProbeRequest& request);

}  // namespace coarse
