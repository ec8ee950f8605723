// coarse_host_gather (xla/host_gather.cc): the in-host hand-out of the inter-host
// step, written into the synced leaves. Bound for CPU in cpu/handlers_cpu.cc.
#pragma once

#include "runtime/stream.h"
#include "xla/ffi/api/ffi.h"

namespace coarse {

// Operands: int32[2] (tier, data index) of a worker, f32[width] its chunk,
// then the synced leaves (aliased to the results). Results: the synced
// leaves. Attributes: workers (p), site, timeout_ms, chunk (the elements of
// a chunk that count); on emulated links also hosts,
// emu_host_s_per_byte, emu_host_latency_s, emu_virtual (the inter-host link,
// charged after the hand-out; xla/host_gather.cc). `host`: a stream whose
// work is done when enqueued (the CPU's inline stream), which unpacks the
// chunks, host memory, into the leaves.
xla::ffi::Error HostGatherBody(xla::ffi::RunId run_id, xla::ffi::AnyBuffer who,
                               xla::ffi::AnyBuffer chunk, xla::ffi::RemainingRets outs,
                               const xla::ffi::Dictionary& attrs, Stream& host);

}  // namespace coarse
