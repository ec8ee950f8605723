// The stream API (runtime/stream.h) on the host, done when enqueued: the
// default CPU platform. Every call runs its work on the caller's thread
// before it returns (host_kernels.h, the CPU backend's loops), so events
// mark nothing still to do, stream waits and syncs are free, and the
// host's clock times the work (Stream::DoneWhenEnqueued: emulated links).
// A WaitValue waits on the caller's thread, at most its timeout, and fails
// there. All devices share one address space: a peer copy is a memcpy.
// The stream-semantics backend (COARSE_JAX_BACKEND=streams) runs the same
// kernels on threaded streams instead (host_stream.h).
#pragma once

#include <memory>

#include "runtime/stream.h"

namespace coarse {

// A new inline stream (it holds no state: any number may run at once).
std::unique_ptr<Stream> MakeInlineHostStream();

}  // namespace coarse
