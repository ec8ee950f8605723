// The in-host hand-out of the inter-host step (coarse_jax/api/_hosts.py): the
// workers of one host, p of them, each offer one chunk and each receive every
// chunk, through shared memory of the process (one memcpy per chunk).
//
// Across hosts every device of a host holds one chunk of the global result
// after the XLA collective over "host"; this rendezvous gives every device of
// the host all of them. It is keyed by (RunId, site, iteration) like a
// Session (session.h) but needs none of its storage: a device's chunk is
// read in place, so each device stays in the meeting until every peer has
// read it (a handler's input is only alive during its call). Every wait has
// a deadline; a device that times out fails the meeting for all.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "runtime/status.h"

namespace coarse {

// Device `device` of `devices` offers `chunk` and calls `take(d, chunk_d)` for
// every device d (itself included) once all have offered; returns when every
// device has taken every chunk. `describe(d)` names device d in errors.
Status HandOut(int64_t run_id, int64_t site, int64_t device, int64_t devices, const void* chunk,
               int64_t timeout_ms, const std::function<void(int64_t, const void*)>& take,
               const std::function<std::string(int64_t)>& describe);

// Meetings open now (testing: none is left behind).
int64_t LiveHandOuts();

}  // namespace coarse
