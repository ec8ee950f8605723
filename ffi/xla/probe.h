// coarse_probe's XLA translation (xla/probe.cc), bound on CPU by
// cpu/handlers_cpu.cc. The probe itself: runtime/probe.h.
#pragma once

#include "xla/ffi/api/ffi.h"

namespace coarse {

// Operands: int32[2] (tier, data index), int32[4] (src, dst) device pairs
// (-1 unused), the payload; result float32[reps] seconds; attributes
// workers, site, timeout_ms and optionally the emu_* topology.
xla::ffi::Error ProbeBody(xla::ffi::RunId run_id, xla::ffi::AnyBuffer who_buf,
                          xla::ffi::AnyBuffer pairs_buf, xla::ffi::AnyBuffer payload,
                          xla::ffi::Result<xla::ffi::AnyBuffer> times,
                          const xla::ffi::Dictionary& attrs);

}  // namespace coarse
