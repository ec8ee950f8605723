// The proxies as a runtime service (docs/guides/design.md, "The proxies as a service").
//
// The step's XLA program spans the workers only. A proxy's part of a session
// (receiving pushes, sums, the rings, the optimizer, its snapshot copy) runs
// here, on a runtime thread, driven by the workers' custom calls: the first
// worker call of a session starts every proxy's job (StartProxies), once.
// A job is ReducePieces as proxy k (runtime/phases.h), then leaving the
// session as the proxy's last call did (FinishCall). What a proxy's own call
// used to read from XLA operands now comes from its local worker's calls
// through the session: the optimizer's scalars and the params check
// (Session::PostUpdateInputs, posted by worker k's coarse_proxy_ring).
// Across hosts with the proxy optimizer the job stops after the
// reduce-scatter, hands its owned chunks to worker k (whose program sums
// them over "host" through XLA) and goes on with the global chunks worker k
// hands back (Session::host_chunks).
//
// Threads come from a cached pool: an idle thread takes the next job, else a
// new thread starts (never one queue per proxy: two sites of one program may
// start in either order on different workers, and a proxy's job of one site
// must never wait behind its job of the other). Every wait a job makes has the
// session's deadline, so no job outlives its session by more than timeout_s.
// No thread starts on the hot path: StartProxies first reserves 2q threads
// (a site's q jobs, plus q of a step whose jobs are still returning to the
// pool, or of a second site), started once and kept for good; only threads
// beyond the largest reservation exit, after the idle time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "runtime/call.h"
#include "runtime/device.h"
#include "runtime/param_store.h"
#include "runtime/session.h"
#include "runtime/status.h"

namespace coarse {

// What a proxy's job needs beyond the session's plan: read from the
// attributes every call of a synchronization site carries.
struct ProxyJob {
  bool in_place = false;              // push_in_place (PushesInPlace, phases.h)
  bool across_hosts = false;          // with a store: sum over hosts inside the ring
  std::shared_ptr<ParamStore> store;  // coarse.value_and_update's store, or null
  OptimizerSpec spec;                 // with a store: the optimizer it runs
};

// Makes the device backend a proxy's job runs on (the platform's: a
// StreamDevice on its stream, a HostProxyDevice for a proxy in host memory).
using MakeProxyDevice = std::function<StatusOr<std::unique_ptr<Device>>(const Call& call)>;

// Starts proxy k's job of `session` for every proxy k, unless the session's
// proxies were started already (Session::TakeProxyStart). Returns at once:
// true if this call started them.
bool StartProxies(const std::shared_ptr<Session>& session, ProxyJob job, MakeProxyDevice make);

// Jobs running now and threads the pool keeps (tests, memory_stats).
struct ServiceStats {
  int64_t running = 0, threads = 0;
};
ServiceStats TheServiceStats();

// Keeps at least `n` threads in the pool from now on (starting the missing
// ones now): the pool's reservation is the largest `n` ever asked for.
void ReserveServiceThreads(int64_t n);
// How long a thread beyond the reservation waits idle for a job before it
// exits (30 s by default); returns the previous value. Testing.
int64_t SetServiceIdleMs(int64_t ms);

}  // namespace coarse
