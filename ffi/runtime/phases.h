// The protocol's phases: what the four sync custom calls do, written once
// against the device backend (device.h) and free of XLA buffers. The handler
// files (ffi/push.cc, proxy_ring.cc, worker_ring.cc, pull.cc) translate XLA's
// operands into these calls; the self-test (sync_selftest.h) drives them
// directly. One file each in runtime/phases/.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/call.h"
#include "runtime/device.h"
#include "runtime/session.h"
#include "xla/ffi/api/ffi.h"

namespace coarse {

// The caller's buffer of a plan leaf.
struct LeafRef {
  void* data;
  xla::ffi::DataType dtype;
};
using LeafResolver = std::function<LeafRef(int64_t leaf)>;

// coarse_push: a worker pushes pieces [first_piece, first_piece + num_pieces)
// (phases/push_pieces.cc).
xla::ffi::Error PushPieces(Call& call, Device& dev, int64_t first_piece, int64_t num_pieces,
                           const LeafResolver& leaf_of);

// coarse_proxy_ring: a proxy reduces every piece with the other proxies
// (phases/reduce_pieces.cc).
xla::ffi::Error ReducePieces(Call& call, Device& dev);

// coarse_worker_ring: workers gather `in_runs` (the leading leaves) into their
// scratch and ring-reduce it; every device then scatters the result into
// `out_runs` (a proxy from its worker's scratch, after the hand-over)
// (phases/reduce_leading.cc).
xla::ffi::Error ReduceLeading(Call& call, Device& dev, const std::vector<LeafRun>& in_runs,
                              const std::vector<LeafRun>& out_runs);
// Worker `who` runs both rings over the workers' scratch.
xla::ffi::Error WorkerRingAllReduce(Session& session, Device& dev, const Who& who);

// coarse_pull: every device writes the reduced proxy pieces into its leaves
// (phases/pull_pieces.cc).
xla::ffi::Error PullPieces(Call& call, Device& dev, const LeafResolver& leaf_of);

}  // namespace coarse
