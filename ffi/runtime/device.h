// The device backend: everything the protocol does to memory, behind one
// interface, so push / proxy ring / worker ring / pull are written once for
// every platform. Two implementations: StreamDevice (runtime/stream_device.h),
// the one orchestration over the stream API of every platform (CUDA, the
// CPU's inline stream, its threaded streams), and HostProxyDevice
// (runtime/host_proxy_device.h), a proxy in host memory beside them.
//
// Storage pointers (arenas, scratch) belong to a mesh device; an operation
// that reads or writes another device's storage names that device, so a
// backend that needs to (CUDA) turns it into a peer copy. The protocol's
// host-side counters say *that* a peer's data is ready; Publish/Acquire make
// the device's own work respect it:
//   producer: enqueue writes; Publish(); bump the counter; Notify
//   consumer: Wait for the counter; Acquire(producer); enqueue reads
// On the CPU's inline stream every operation is finished when it returns,
// so the events Publish records mark nothing left to do; on CUDA operations are enqueued on XLA's
// stream and Publish/Acquire are an event record / a stream wait on it: a handler never waits on
// the host for GPU work, only for other handlers' host progress.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/optimizer_math.h"
#include "kernels/span.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace coarse {

// One optimizer update of n elements on a proxy's own storage (see
// ApplyOptimizer): the mean gradient in, the new parameters out in the same
// place (the ring's all-gather then circulates them), the master weights and
// state slots read from the committed buffer and written to the other one.
struct OptBuffers {
  float* grad_io;
  const float* w_in;
  float* w_out;
  const float* s_in[2];  // OptSlots(kind) of them are used
  float* s_out[2];
};

// A run of consecutive elements of one of this device's leaves and where it
// sits in an f32 piece (or scratch) buffer.
struct LeafRun {
  void* leaf;       // first element of the run inside the leaf
  DType dtype;      // the leaf's element type
  int64_t len;      // elements
  int64_t buf_off;  // offset in the f32 buffer
};

// What a worker pushed of one piece when the proxies read it in place
// (PushesInPlace, phases.h; runtime/shared_memory.h): its runs, sorted by buf_off (the offset in
// the piece), pointing into the worker's gradient buffers.
using PushedRuns = std::vector<LeafRun>;

// Rows of equal length spread at fixed pitches (floats): the same chunk of
// each piece of a group (the proxies' ring steps a group in one copy and one
// launch, runtime/ring.h). Device::AddFrom / CopyFrom / SumSlots take `count`
// rows: row i of `own` at own + i * own_pitch, of the peer's buffer at
// peer + i * peer_pitch. One row by default.
struct Rows {
  int64_t count = 1;
  int64_t own_pitch = 0;
  int64_t peer_pitch = 0;
};

// Row i of an optimizer update over rows (Stream::OptimizerRows): the
// gradient's pointer `grad_pitch` floats on per row, the store's (weights
// and state) `buf_pitch`; unused state slots stay null.
inline OptBuffers OptRow(const OptBuffers& b, int64_t i, int64_t grad_pitch, int64_t buf_pitch) {
  OptBuffers r = b;
  r.grad_io += i * grad_pitch;
  r.w_in += i * buf_pitch;
  r.w_out += i * buf_pitch;
  for (int j = 0; j < 2; ++j) {
    if (r.s_in[j] != nullptr) r.s_in[j] += i * buf_pitch;
    if (r.s_out[j] != nullptr) r.s_out[j] += i * buf_pitch;
  }
  return r;
}

// Where the rows of a Stream::ReduceRows lie: `count` rows, consecutive rows
// of the output `out` floats apart, of input k `in[k]` apart.
struct RowPitches {
  int64_t count = 1;
  int64_t out = 0;
  int64_t in[kernels::kMaxReduceInputs] = {};
};

struct Mismatch {
  int64_t run = -1;           // which of the runs checked (Device::FirstMismatch), -1 if none
  int64_t index = -1;         // the element in it
  float given = 0, held = 0;  // the params' value, the master's rounded value
};

// Global-norm clipping kept on a device (StreamDevice): each proxy's sum of
// squares and the clip scalars the optimizer reads stay in the device's
// memory, so the host reads nothing back (phases/update_pieces.cc).
class NormOnDevice {
 public:
  virtual ~NormOnDevice() = default;
  // Proxy `part`'s share of the norm: the sum of squares of `num` ranges of
  // this device's storage (xs[r], ns[r] floats), each summed in f64, the
  // sums added in order from 0, into this device's slot `part`. Enqueued,
  // not waited for: Publish before a peer reads it.
  virtual Status SumSquaresPart(const float* const* xs, const int64_t* ns, int64_t num,
                                int64_t part) = 0;
  // The clip scalars (norm, clip flag: ClipScalarsOf) from the shares of `q`
  // proxies, proxy j's on mesh device devices[j], this device's own at
  // `own`: the others (Acquired by the caller) are copied beside it, then
  // all added in order. Returns where the scalars are, in this device's
  // memory, for OptScalars::clip_at.
  virtual StatusOr<const float*> ClipScalars(int64_t own, const int64_t* devices, int64_t q,
                                             float clip_norm) = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  // dst[run.buf_off + i] = float(run.leaf[i]) for every run; `dst` is storage
  // of mesh device `dst_device` (this one or a peer), `dst_len` elements long.
  virtual Status Gather(const LeafRun* runs, int64_t num_runs, float* dst, int64_t dst_device,
                        int64_t dst_len) = 0;
  // run.leaf[i] = dtype(src[run.buf_off + i]); `src` is storage of `src_device`.
  virtual Status Scatter(const float* src, int64_t src_device, int64_t src_len, const LeafRun* runs,
                         int64_t num_runs) = 0;

  // Local storage: own[i] = (sum_j own[j * n + i]) * scale over `slots`
  // consecutive slots (zeros if slots == 0), in slot order; the scale is the
  // same multiply as a Scale after the sum (the same bits), without its pass.
  // With `rows` (peer_pitch unused), each of rows.count rows of n elements at
  // own + i * own_pitch, its slots n apart, in one pass.
  virtual Status SumSlots(float* own, int64_t n, int64_t slots, float scale,
                          const Rows& rows = Rows{}) = 0;
  // own[i] = (own[i] + peer[i]) * scale, `peer` storage of `peer_device`;
  // with `rows`, for each row (a device with streams: one copy and one
  // launch for all of them).
  virtual Status AddFrom(float* own, const float* peer, int64_t peer_device, int64_t n, float scale,
                         const Rows& rows = Rows{}) = 0;
  // own[i] = peer[i]; with `rows`, for each row (one copy).
  virtual Status CopyFrom(float* own, const float* peer, int64_t peer_device, int64_t n,
                          const Rows& rows = Rows{}) = 0;
  // x[i] *= scale (local).
  virtual Status Scale(float* x, int64_t n, float scale) = 0;

  // The proxy optimizer (kernels/optimizer_math.h), all local storage:
  // b.w_out[i] = b.grad_io[i] = OptStep(o, b.grad_io[i], b.w_in[i], ...).
  virtual Status ApplyOptimizer(const OptScalars& o, const OptBuffers& b, int64_t n) = 0;
  // sum x[i]^2 in f64 over local storage (global-norm clipping). Blocks the
  // host until the value exists (on CUDA: a device-to-host copy).
  virtual StatusOr<double> SumSquares(const float* x, int64_t n) = 0;
  // Where clipping's sums stay on this device (NormOnDevice); null where
  // SumSquares serves (a proxy in host memory: its memory is the host's).
  virtual NormOnDevice* norm_on_device() { return nullptr; }
  // The params check: the first run of `runs` (in order; their buf_off
  // increase), and in it the first i < len, where the params (a leaf's
  // elements, in its dtype) differ bitwise from master[buf_off + i] rounded
  // to the run's dtype, with both values widened to f32 (run -1 if none).
  // `master` and `scratch` are storage of mesh device `scratch_device` (this
  // one or a peer, as Gather's `dst`); `scratch` (`scratch_len` floats,
  // written at each buf_off) may receive the runs widened first; a backend
  // whose host loops read the params where they are (CPU) writes nothing. Blocks the
  // host like SumSquares, once for all the runs (on a GPU, one small read per
  // step: one per run cost an H200 step 8-11% of its time, benchmarks/RESULTS.md).
  virtual StatusOr<Mismatch> FirstMismatch(const float* master, const LeafRun* runs,
                                           int64_t num_runs, float* scratch, int64_t scratch_device,
                                           int64_t scratch_len) = 0;

  // Plain local bytes: result buffers the protocol fills (tokens, un-aliased
  // pass-through outputs).
  virtual Status ZeroBytes(void* dst, size_t bytes) = 0;
  virtual Status CopyBytes(void* dst, const void* src, size_t bytes) = 0;
  // Between this device's memory and plain host memory (a std::vector of the
  // session's, such as the chunks across hosts): on a GPU a host-to-device or
  // device-to-host copy, never a device-to-device one. Enqueued like the rest:
  // the host reads `host` after SynchronizeHost, and keeps `host` alive until
  // then (ToDevice may read it only when its copy runs).
  virtual Status CopyToHost(void* host, const void* own, size_t bytes) = 0;
  virtual Status CopyFromHost(void* own, const void* host, size_t bytes) = 0;

  // See the top of this file.
  virtual Status Publish() = 0;
  virtual Status Acquire(int64_t device) = 0;
  // Work this device does after this call waits until the host-written
  // `*flag` reaches `value` (Stream::WaitValue): a worker's pull of a piece
  // a proxy in host memory makes final (Session::ready_flag). A device that
  // runs its work as it is called (CPU) waits here, on the host. Either way
  // at most `timeout`, after which the error names `what`.
  virtual Status WaitFlag(const uint32_t* flag, uint32_t value, std::chrono::milliseconds timeout,
                          const std::string& what) = 0;
  // Waits on the host until this device has done everything enqueued so far:
  // before the host reads or frees host memory the device's work touches.
  virtual Status SynchronizeHost(const char* what) = 0;

  // Whether this backend can run an emulated topology (host-timed links).
  virtual bool SupportsEmulation() const = 0;

  // Enqueues what this device holds back to merge: a device with streams
  // merges consecutive packs, unpacks and optimizer updates into one launch
  // each (StreamDevice). Every other operation but Acquire and WaitFlag
  // flushes first (a wait may be passed: the merged work only runs later),
  // and RunCall flushes at the end of each call. A device whose operations
  // are done when they return holds nothing back.
  virtual Status Flush() { return Status::Success(); }
};

// The device one handler call runs on (RunCall, xla/handler.h): its own,
// built for the call, or one kept across calls (a worker's StreamDevice in
// its storage set, KeptStreamDevice in runtime/stream_device.h), so a
// steady call builds nothing. A
// kept one's `busy` flag is cleared when the call lets go of it.
class DeviceHandle {
 public:
  DeviceHandle(std::unique_ptr<Device> owned)  // NOLINT: a call's own device converts
      : owned_(std::move(owned)), device_(owned_.get()) {}
  DeviceHandle(Device& kept, std::atomic<bool>* busy) : device_(&kept), busy_(busy) {}
  DeviceHandle(DeviceHandle&& other) noexcept
      : owned_(std::move(other.owned_)),
        device_(other.device_),
        busy_(std::exchange(other.busy_, nullptr)) {}
  DeviceHandle& operator=(DeviceHandle&&) = delete;
  ~DeviceHandle() {
    if (busy_ != nullptr) busy_->store(false, std::memory_order_release);
  }
  Device& operator*() const { return *device_; }

 private:
  std::unique_ptr<Device> owned_;
  Device* device_;
  std::atomic<bool>* busy_ = nullptr;
};

}  // namespace coarse
