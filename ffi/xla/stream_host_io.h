// HostIo (xla/sync_ops.h) on a backend with streams: the optimizer's few scalars
// move between an XLA buffer of the caller's device and the host through its
// stream, and the host waits for each copy (once per step, a few bytes).
#pragma once

#include "runtime/stream.h"
#include "xla/sync_ops.h"

namespace coarse {

// `stream` must outlive the HostIo (the caller's StreamDevice's).
HostIo StreamHostIo(Stream& stream);

}  // namespace coarse
