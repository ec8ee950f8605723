// What the orchestration asks of the streams, counted: every call a StreamDevice
// (the workers' and proxies' device on CUDA and on the stream-semantics CPU
// backend) or a HostProxyDevice makes on its Stream goes through a
// CountingStream, so one count describes both platforms. Process-wide and
// cumulative; coarse_jax.testing.stream_ops() reads them, per kind:
//   launches      kernels and memsets enqueued (Pack, Unpack, Reduce, Optimizer,
//                 SumSquares, FirstMismatch, Memset)
//   copies_*      copies by direction, with their bytes: d2d (within a device),
//                 peer (device to device), d2h (Download), h2d (Upload,
//                 UploadPinned)
//   records       event records
//   stream_waits  a stream made to wait (for an event, or for a host flag)
//   host_waits    the host waiting for device work (HostWait)
//   host_syncs    the host waiting for a whole stream (Synchronize)
//   table_uploads of copies_h2d, the span tables a StreamDevice uploaded (a
//                 merged pack or unpack whose table no slot held: SpanTables)
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/stream.h"

namespace coarse {

enum class StreamOp : int {
  kLaunches = 0,
  kCopiesD2D,
  kCopiesPeer,
  kCopiesD2H,
  kCopiesH2D,
  kBytesD2D,
  kBytesPeer,
  kBytesD2H,
  kBytesH2D,
  kRecords,
  kStreamWaits,
  kHostWaits,
  kHostSyncs,
  kTableUploads,
  kCount,
};

// (name, count) of every kind, in StreamOp order.
std::vector<std::pair<std::string, int64_t>> StreamOpCounts();
void ResetStreamOps();
// Counts one of `op` that no Stream call stands for (kTableUploads).
void CountStreamOp(StreamOp op);

// `stream`, its every call counted; `resources` tells which mesh devices are
// host memory (a copy to or from one crosses PCIe).
std::unique_ptr<Stream> Counted(std::unique_ptr<Stream> stream, StreamResources& resources);

}  // namespace coarse
