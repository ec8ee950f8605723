// The stream API: what a device backend with GPU semantics offers the one
// orchestration that runs on it (runtime/stream_device.h). A Stream is one
// device's in-order queue of work: every call enqueues and returns; nothing
// it enqueued is done until the stream reaches it. Events order one stream
// after another; Synchronize is the one call that blocks the host.
//
// Two implementations: CUDA (cuda/cuda_stream.h: the kernels' launch
// functions, cudaMemcpyPeerAsync, cudaEventRecord / cudaStreamWaitEvent,
// cudaStreamSynchronize) and the host's (cpu/host_stream.h: a thread and a
// task queue per device, running the kernels' arithmetic in loops).
//
// Pointers name memory of a mesh device ("device memory"); the orchestration
// only touches a peer's memory through Copy, as a GPU must.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/span.h"
#include "runtime/device.h"
#include "runtime/plan.h"
#include "runtime/span_tables.h"
#include "runtime/status.h"

namespace coarse {

// An event, opaque to the orchestration: a cudaEvent_t on CUDA, a host event
// on the host stream. The session's storage holds one per mesh device.
using StreamEvent = void*;

class Stream {
 public:
  virtual ~Stream() = default;

  // The kernels (kernels/coarse_kernels.h), on f32 buffers of this device.
  // spans: device memory (this device's span table), `begin` filled.
  virtual Status Pack(const kernels::Span* spans, int64_t num_spans, int64_t total, float* buf) = 0;
  virtual Status Unpack(const float* buf, const kernels::Span* spans, int64_t num_spans,
                        int64_t total) = 0;
  // out[i] = (in[0][i] + ... + in[k-1][i]) * scale, 1 <= k <= kMaxReduceInputs;
  // `out` may alias in[0]. `inputs` itself may die on return.
  virtual Status Reduce(const float* const* inputs, int num_inputs, float* out, int64_t n,
                        float scale) = 0;
  // The same over `rows.count` rows of n elements in one launch: row i of
  // input k at inputs[k] + i * rows.in[k], of `out` at out + i * rows.out
  // (floats). Each element's arithmetic is Reduce's (the same bits). The
  // proxies' ring steps a group of pieces with it (ring.h: RingMember::rows).
  virtual Status ReduceRows(const float* const* inputs, int num_inputs, float* out, int64_t n,
                            float scale, const RowPitches& rows) = 0;
  virtual Status Optimizer(const OptScalars& o, const OptBuffers& b, int64_t n) = 0;
  // The same over `rows` rows of n elements in one launch, row i's buffers
  // OptRow(b, i, grad_pitch, buf_pitch) (the owned chunks of a ring group's
  // pieces, StreamDevice::ApplyOptimizer); each element's arithmetic is
  // Optimizer's.
  virtual Status OptimizerRows(const OptScalars& o, const OptBuffers& b, int64_t n, int64_t rows,
                               int64_t grad_pitch, int64_t buf_pitch) = 0;
  // *out = sum x[i]^2 in f64; `partial`: kSumSquaresBlocks doubles of scratch.
  virtual Status SumSquares(const float* x, int64_t n, double* partial, double* out) = 0;
  // *out = (accumulate ? *out : 0) + the sum of squares of the spans' f32
  // runs (span.leaf, span.len; spans: device memory, `total` their length):
  // on the host each run summed alone in index order, the runs' sums added
  // in span order (the bits of SumSquares per run, added in order); on CUDA
  // one pass over them all, in a fixed order for a given table.
  virtual Status SumSquaresSpans(const kernels::Span* spans, int64_t num_spans, int64_t total,
                                 double* partial, double* out, bool accumulate) = 0;
  // out[0, 2) = ClipScalarsOf(parts, num, clip_norm) (kernels/optimizer_math.h).
  virtual Status ClipScalars(const double* parts, int64_t num, float clip_norm, float* out) = 0;
  // *first = min(*first, base + the first i where master[i] rounded to
  // `dtype` differs bitwise from given[i], an element of `given_dtype`:
  // `dtype` (the params read where they are) or f32 (widened into scratch
  // first). Several runs share one result (StreamDevice::FirstMismatch).
  virtual Status FirstMismatch(const float* master, kernels::DType dtype, const void* given,
                               kernels::DType given_dtype, int64_t n, unsigned long long base,
                               unsigned long long* first) = 0;

  // dst[0, bytes) = 0, this device's memory.
  virtual Status Memset(void* dst, size_t bytes, const char* what) = 0;
  // `bytes` from mesh device `src_device`'s memory to `dst_device`'s (either
  // may be this device, or both: a local copy).
  virtual Status Copy(void* dst, int64_t dst_device, const void* src, int64_t src_device,
                      size_t bytes, const char* what) = 0;
  // `rows` rows of `row_bytes` in one copy (cudaMemcpy2DAsync /
  // cudaMemcpy3DPeerAsync): row i from src + i * src_pitch to dst + i *
  // dst_pitch (bytes), between mesh devices as Copy.
  virtual Status CopyRows(void* dst, int64_t dst_device, size_t dst_pitch, const void* src,
                          int64_t src_device, size_t src_pitch, size_t row_bytes, int64_t rows,
                          const char* what) = 0;
  // Host -> this device. `src` may die as soon as the call returns.
  virtual Status Upload(void* dst, const void* src, size_t bytes, const char* what) = 0;
  // This device -> host. `dst` holds the bytes only after Synchronize, or
  // once the host has waited (HostWait) for an event recorded after it.
  virtual Status Download(void* dst, const void* src, size_t bytes, const char* what) = 0;
  // Pinned host memory (a proxy in host memory's storage) -> this device,
  // read when the stream reaches the copy (cudaMemcpyAsync from pinned
  // memory), not when it is enqueued as Upload's `src` is: the host keeps
  // `src` alive and unwritten until then (WaitValue orders it after the
  // host's writes).
  virtual Status UploadPinned(void* dst, const void* src, size_t bytes, const char* what) = 0;

  // The event now marks everything enqueued so far on this stream.
  virtual Status Record(StreamEvent event) = 0;
  // Work enqueued after this waits for what `event` marked when Wait was
  // called (nothing, if it was never recorded). The host does not wait.
  virtual Status Wait(StreamEvent event, int64_t device) = 0;
  // The host waits until everything enqueued so far is done.
  virtual Status Synchronize(const char* what) = 0;

  // The host (the caller's thread) waits until what `event` marks now is
  // done, at most `timeout`: a proxy in host memory's job before it reads
  // what a worker's stream copied into its storage. On timeout the error
  // names `what`. `event` may be any stream's (nothing, if never recorded).
  virtual Status HostWait(StreamEvent event, std::chrono::milliseconds timeout,
                          const std::string& what) = 0;
  // Work enqueued after this waits until the 32-bit flag in pinned host
  // memory, written by the host (WriteFlag), has reached `value`
  // (FlagReached: wrap-around safe). The host does not wait. On the host
  // streams the stream gives up after `timeout` and its next Record or
  // Synchronize fails naming `what`; cuStreamWaitValue32 has no timeout, so
  // whoever writes the flag must write it on failure too (the proxies' jobs
  // release their flags when they fail).
  virtual Status WaitValue(const uint32_t* flag, uint32_t value, std::chrono::milliseconds timeout,
                           const std::string& what) = 0;

  // Whether every call has done its work when it returns (the CPU's inline
  // stream, host/inline_stream.h): then the host's clock times the work
  // (emulated links), and holding work back to merge saves nothing.
  virtual bool DoneWhenEnqueued() const { return false; }
};

// The flags WaitValue reads: a counter that only grows (a storage set's use
// count, Storage::NextUse), so a flag reused by the next step needs no reset.
inline bool FlagReached(uint32_t now, uint32_t value) {
  return static_cast<int32_t>(now - value) >= 0;
}
// The host's write: everything the host wrote before it (the proxy's sums)
// is visible to whoever sees the value.
inline void WriteFlag(uint32_t* flag, uint32_t value) {
  __atomic_store_n(flag, value, __ATOMIC_RELEASE);
}
inline uint32_t ReadFlag(const uint32_t* flag) { return __atomic_load_n(flag, __ATOMIC_ACQUIRE); }

// A worker's copy stream's bookkeeping in a storage set (StreamDevice: its
// copies down to a proxy in host memory run on a stream of their own, so
// the worker's stream, XLA's, goes on with the backward pass while they
// run). Touched only by the worker's own calls, one after another.
struct CopyMarks {
  StreamEvent main = nullptr;    // a point of the worker's stream the copy stream waits for
  StreamEvent copied = nullptr;  // a point of the copy stream after its copies
  // The same two for the copies up (a pull's, from the proxy's pinned memory).
  StreamEvent up_main = nullptr;
  StreamEvent up_done = nullptr;
  bool unjoined = false;  // the copy stream has work the worker's stream has not waited for
  // Each direction has a staging ring of its own (CopyRing floats: two
  // calls' worth), handed out from a cursor across calls
  // (StreamDevice::Stage), so neither direction waits for the other, and a
  // call never waits for the previous call's copies. Pushes pack into the
  // device's staging (StreamResources::staging): what the copy stream may
  // still read lies below `cursor`, so the worker's stream waits for the
  // copy stream only when the cursor starts again at 0. Pulls are copied up
  // into `up_staging`: what the worker's unpacks may still read lies below
  // `up_cursor`; the copy-up stream waits for the worker's stream before a
  // call's first copy up and again when the cursor starts again at 0. A call that finds less than a
  // call's worth (staging_len()) left starts at 0, so a wrap never splits a call's pieces into two
  // launches and two copies (double buffering).
  int64_t cursor = 0;
  float* up_staging = nullptr;
  int64_t up_cursor = 0;
};

// The length of a worker's staging rings (CopyMarks), with staging_len()
// floats per call: two calls' worth, so one call fills a half while the
// other's copies run.
inline int64_t CopyRing(int64_t staging_len) { return 2 * staging_len; }

// A worker's device kept in its storage set across its calls
// (KeptStreamDevice, runtime/stream_device.h): `key` names the stream it
// runs on; `busy` while a call holds it.
struct KeptDevice {
  std::unique_ptr<Device> device;
  const void* key = nullptr;
  std::atomic<bool> busy{false};
};

// What a StreamDevice needs of the session's storage besides the arenas and
// scratch: per mesh device, a staging buffer for peer copies, span tables,
// a few scalars of scratch and its event.
class StreamResources {
 public:
  virtual ~StreamResources() = default;
  // staging_len() + 4 floats (alignment shifts); a worker's, where a proxy
  // is in host memory, CopyRing(staging_len()) + 4 (its pushes' ring).
  virtual float* staging(int64_t device) = 0;
  virtual int64_t staging_len() const = 0;
  // kSpanTables * max_runs() spans, and which tables they hold (SpanTables).
  virtual kernels::Span* spans(int64_t device) = 0;
  virtual SpanTables& span_tables(int64_t device) = 0;
  virtual int64_t max_runs() const = 0;
  // kScalarSlots doubles: the sum of squares' partials and result; global-norm
  // clipping's parts, up to kMaxNormParts proxies' (this proxy's own at its
  // index, the others copied beside it) and its clip scalars (two floats, in
  // one slot); the params check's index (as an unsigned long long) in the last.
  static constexpr int64_t kMaxNormParts = 64;
  static constexpr int64_t kNormPartsSlot = kernels::kSumSquaresBlocks + 1;
  static constexpr int64_t kClipSlot = kNormPartsSlot + kMaxNormParts;
  static constexpr int64_t kScalarSlots = kClipSlot + 2;
  virtual double* scalars(int64_t device) = 0;
  virtual StreamEvent event(int64_t device) = 0;
  // Whether mesh device `device` is a proxy in host memory (IsHostOrdinal):
  // its storage is pinned host memory, reached by device-to-host and
  // host-to-device copies instead of peer copies (StreamDevice::PeerCopy).
  virtual bool in_host_memory(int64_t device) const = 0;
  // Whether device `a`'s kernels address device `b`'s memory as their own:
  // the same device, or two mesh devices on one GPU (the shared-device
  // mesh: their platform ordinals are equal). Then a pack or unpack reads or
  // writes the other's memory directly, with no staging buffer or copy
  // (StreamDevice::Addressable).
  virtual bool shares_memory(int64_t a, int64_t b) const = 0;
  // How many times device `d` has published (StreamDevice::Publish bumps it
  // after recording its event): a stream that waited for the event at
  // generation g need not wait again while it is still g.
  virtual std::atomic<uint64_t>& published(int64_t device) = 0;
  // Worker `device`'s copy stream's marks (CopyMarks); null on a device
  // without one (a proxy), whose copies all run on its one stream.
  virtual CopyMarks* copy_marks(int64_t device) = 0;
  // Worker `device`'s kept device (KeptDevice); null on a proxy.
  virtual KeptDevice* kept_device(int64_t device) = 0;
};

// own[i] = (sum_j own[j * n + i]) * scale over `slots` slots on `stream`
// (Device::SumSlots), in slot order, in launches of up to
// kernels::kMaxReduceInputs inputs; its bytes counted (runtime/traffic.h).
// With `rows`, each launch covers every row (ReduceRows).
Status SumSlotsOn(Stream& stream, float* own, int64_t n, int64_t slots, float scale,
                  const Rows& rows = Rows{});

// Whether a proxy of `plan` is in host memory: then the workers copy down
// to it on copy streams of their own (StreamDevice's `copies`).
inline bool HasHostProxy(const Plan& plan, const StreamResources& res) {
  for (int64_t k = 0; k < plan.proxies; ++k)
    if (res.in_host_memory(plan.workers + k)) return true;
  return false;
}

// Which publication of each mesh device (StreamResources::published) a waiter
// last waited for: one that has not published since need not be waited for
// again, since its event covers nothing newer that the waiter can know of (a
// device bumps its count after the record, and before the counters that tell
// a peer to look). StreamDevice and HostProxyDevice wait through it.
class PublicationsSeen {
 public:
  // Calls wait() (the stream's or the host's wait for `device`'s event) unless
  // this waiter has waited since `device` last published.
  template <typename Wait>
  Status WaitOnce(StreamResources& res, int64_t device, Wait&& wait) {
    const uint64_t now = res.published(device).load(std::memory_order_acquire) + 1;
    if (static_cast<int64_t>(seen_.size()) <= device) seen_.resize(device + 1, 0);
    if (seen_[device] == now) return Status::Success();
    Status e = wait();
    if (e.success()) seen_[device] = now;
    return e;
  }

  // As if it had waited for none (keeps the vector's room).
  void Forget() { std::fill(seen_.begin(), seen_.end(), 0); }

 private:
  std::vector<uint64_t> seen_;  // per mesh device: 1 + its count when last waited for; 0 none
};

// A staging buffer holds the largest piece, the workers' leading layers, and
// a call's pieces side by side up to kMergeFloats (16 MiB of f32: past it a
// call's transfers through a peer take one pack or unpack per that many);
// a span table the most runs one transfer has (both the same on every platform).
inline constexpr int64_t kMergeFloats = int64_t{4} << 20;
struct StagingSizes {
  int64_t staging_len = 1, max_runs = 1;
};
StagingSizes StagingSizesOf(const Plan& plan);

// `runs` as a span table in `*spans` (its room reused), each at its
// buf_off, begins set; `*total` their elements. For a pack or unpack of
// memory the caller's kernels read where it is (host memory on the host).
Status SpansOf(const LeafRun* runs, int64_t num_runs, std::vector<kernels::Span>* spans,
               int64_t* total);

}  // namespace coarse
