// coarse_host_gather (xla/host_gather.cc): the in-host hand-out of the inter-host
// step, written into the synced leaves. Bound for CPU in cpu/handlers_cpu.cc.
#pragma once

#include <cstdint>

#include "runtime/stream.h"
#include "xla/ffi/api/ffi.h"

namespace coarse {

// The attributes of coarse_host_gather, typed (coarse_jax/_ffi/host_gather.py
// writes them): workers (p), site, timeout_ms, chunk (the elements of a chunk
// that count), and the inter-host link (attribute "link"), charged after the
// hand-out on emulated links only (emulated false: the other members unread).
struct InterHostLinkAttrs {
  bool emulated;
  int64_t hosts;
  double s_per_byte, latency_s;  // coarse.Topology.inter_host_attrs, scaled
  bool virtual_clock;            // a virtual clock does not time the inter-host step
};
struct HostGatherAttrs {
  int64_t workers, site, timeout_ms, chunk;
  InterHostLinkAttrs link;
};

// Operands: int32[2] (tier, data index) of a worker, f32[width] its chunk,
// then the synced leaves (aliased to the results). Results: the synced
// leaves. `host`: a stream whose work is done when enqueued (the CPU's
// inline stream), which unpacks the chunks, host memory, into the leaves.
xla::ffi::Error HostGatherBody(xla::ffi::RunId run_id, xla::ffi::AnyBuffer who,
                               xla::ffi::AnyBuffer chunk, xla::ffi::RemainingRets outs,
                               const HostGatherAttrs& attrs, Stream& host);

}  // namespace coarse

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(::coarse::InterHostLinkAttrs,
                                      ::xla::ffi::StructMember<bool>("emulated"),
                                      ::xla::ffi::StructMember<int64_t>("hosts"),
                                      ::xla::ffi::StructMember<double>("s_per_byte"),
                                      ::xla::ffi::StructMember<double>("latency_s"),
                                      ::xla::ffi::StructMember<bool>("virtual_clock"));
