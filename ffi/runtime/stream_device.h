// The device backend of every platform with GPU semantics: one orchestration
// over the stream API (runtime/stream.h), the same code on CUDA and on the
// host streams of the stream-semantics CPU backend (COARSE_JAX_BACKEND=streams).
// It decides what is enqueued on the caller's stream, which copies go where
// (a peer's memory only through Copy, via this device's staging buffer where
// a kernel must read or write it), which event a stream waits for (Publish
// records this device's event, Acquire waits for a peer's) and where the host
// synchronizes (SumSquares, FirstMismatch: their results are read on the
// host). No other call blocks the host. A proxy in host memory
// (StreamResources::in_host_memory) is reached by device-to-host and
// host-to-device copies instead of peer copies (PeerCopy decides); it runs
// on a HostProxyDevice (runtime/host_proxy_device.h), not on this. A
// worker's copies down to it run on a copy stream of their own where the
// platform gives one (see StreamDevice's constructor), so the worker's
// stream goes on with the backward pass while they run.
#pragma once

#include <memory>
#include <vector>

#include "runtime/device.h"
#include "runtime/stream.h"

namespace coarse {

class StreamDevice final : public Device, public NormOnDevice {
 public:
  // `self`: the caller's mesh device index (worker i -> i, proxy k -> p + k).
  // `copies` (a worker's, where a proxy is in host memory; else null): the
  // stream its copies down to host memory run on. Ordering: the copy stream
  // waits for a mark of this stream after the pack that filled staging; this
  // stream waits for the copy stream (JoinCopies) before it writes staging
  // again or the host synchronizes; while the copy stream has work this
  // stream has not waited for, Publish records this device's event on the
  // copy stream, after it waits for everything enqueued here, so whoever
  // waits for the event (the host proxy's HostWait, the next session's
  // first call) waits for both (StreamResources::copy_marks).
  //
  // `ups` (with `copies`): the stream its copies up from a proxy in host
  // memory run on, with the flag waits that gate them (WaitFlag), so this
  // stream does not stall on a flag while it has other work. The copy-up
  // stream waits for this stream before its first copy of a call, and
  // again when its staging ring wraps (past every unpack that read the
  // ring); this stream waits for it before anything held is launched
  // (Flush), so the unpack that reads what it copied, and every later
  // Publish, come after it.
  StreamDevice(std::unique_ptr<Stream> stream, int64_t self, StreamResources& resources,
               std::unique_ptr<Stream> copies = nullptr, std::unique_ptr<Stream> ups = nullptr);

  Status Gather(const LeafRun* runs, int64_t num_runs, float* dst, int64_t dst_device,
                int64_t dst_len) override;
  Status Scatter(const float* src, int64_t src_device, int64_t src_len, const LeafRun* runs,
                 int64_t num_runs) override;
  Status SumSlots(float* own, int64_t n, int64_t slots, float scale,
                  const Rows& rows = Rows{}) override;
  Status AddFrom(float* own, const float* peer, int64_t peer_device, int64_t n, float scale,
                 const Rows& rows = Rows{}) override;
  Status CopyFrom(float* own, const float* peer, int64_t peer_device, int64_t n,
                  const Rows& rows = Rows{}) override;
  Status Scale(float* x, int64_t n, float scale) override;
  Status ApplyOptimizer(const OptScalars& o, const OptBuffers& b, int64_t n) override;
  StatusOr<double> SumSquares(const float* x, int64_t n) override;
  NormOnDevice* norm_on_device() override { return this; }
  Status SumSquaresPart(const float* const* xs, const int64_t* ns, int64_t num,
                        int64_t part) override;
  StatusOr<const float*> ClipScalars(int64_t own, const int64_t* devices, int64_t q,
                                     float clip_norm) override;
  StatusOr<Mismatch> FirstMismatch(const float* master, const LeafRun* runs, int64_t num_runs,
                                   float* scratch, int64_t scratch_device,
                                   int64_t scratch_len) override;
  Status ZeroBytes(void* dst, size_t bytes) override;
  Status CopyBytes(void* dst, const void* src, size_t bytes) override;
  Status CopyToHost(void* host, const void* own, size_t bytes) override;
  Status CopyFromHost(void* own, const void* host, size_t bytes) override;
  Status Publish() override;
  Status Acquire(int64_t device) override;
  // With a copy-up stream, the wait gates that stream: the copies up after
  // it, and (Flush) whatever this stream launches after them.
  Status WaitFlag(const uint32_t* flag, uint32_t value, std::chrono::milliseconds timeout,
                  const std::string& what) override {
    if (ups_ == nullptr) return Enqueue()->WaitValue(flag, value, timeout, what);
    // (It touches no staging: the copy-up stream waits for this one later,
    // before its first copy, StartUps.)
    Status e = ups_->WaitValue(flag, value, timeout, what);
    if (e.success()) ups_unjoined_ = true;
    return e;
  }
  Status SynchronizeHost(const char* what) override {
    Status e = Flush();
    if (e.success()) e = JoinUps();
    if (e.success()) e = JoinCopies();
    return e.failure() ? e : Enqueue()->Synchronize(what);
  }
  // Emulated links are timed on the host around operations that finish when
  // they return: the inline stream's (Stream::DoneWhenEnqueued), not a
  // stream whose work runs later.
  bool SupportsEmulation() const override { return !holds_; }
  Status Flush() override;

  // The stream itself, for a caller's own small copies (xla/stream_host_io.h):
  // only between operations of this device, with nothing held back (Flush).
  Stream& stream() { return *Enqueue(); }

  // A kept device (KeptStreamDevice) starts another call as a new one
  // would: nothing held (a failed call's held work is dropped, as a
  // device built per call dropped it), no wait or mark of this call yet,
  // nothing of the copy-up stream to join (a failed call may leave flag
  // waits there for a session that failed: joining them would stall the
  // next call's stream until they time out; the copies up it makes itself
  // queue behind them on that in-order stream, and its unpack joins those).
  // Only the vectors' room outlives a call.
  void BeginCall();

 private:
  // Work held back to merge (Device::Flush): packs into, or unpacks out of,
  // f32 buffers (a peer's this device addresses, its own, its staging), in
  // one launch over one span table; and optimizer updates of consecutive
  // elements with the same scalars, in one launch. Work per call, not per
  // piece: a push of a bucket's pieces is one pack, a pull's unpacks one.
  struct Queued {
    enum class Kind { kNone, kPack, kUnpack, kOptimizer };
    Kind kind = Kind::kNone;
    std::vector<kernels::Span> spans;  // kPack, kUnpack: leaf, len, dtype (buf_off by Flush)
    std::vector<float*> at;            // per span: where its f32 elements are
    OptScalars o;                      // kOptimizer
    OptBuffers b{};
    int64_t n = 0;
    // kOptimizer over rows (Stream::OptimizerRows): `rows` of n elements,
    // row i's buffers OptRow(b, i, grad_pitch, buf_pitch).
    int64_t rows = 1, grad_pitch = 0, buf_pitch = 0;
  };
  // Holds `runs` back as a pack into (or unpack out of) `buf`, `buf_len`
  // floats, merged with what is held if it is of the same kind; a run's
  // place in `buf` is its buf_off - `lo`.
  Status QueueRuns(Queued::Kind kind, const LeafRun* runs, int64_t num_runs, float* buf,
                   int64_t buf_len, int64_t lo = 0);
  // `n` floats of this device's staging buffer for held work of `kind`
  // (Flush first where held work of another kind, or too little room or
  // span table, is left); they stay its own until the next Flush. Work per
  // call through a peer's memory: a push's pieces are packed side by side in
  // staging by one launch, then copied out (Outbound), a pull's pieces copied
  // in side by side and unpacked by one launch.
  StatusOr<float*> Stage(Queued::Kind kind, int64_t n, int64_t num_runs);
  // A copy out of staging, issued by Flush after the held pack that fills it
  // (or into staging, before the held unpack that reads it: `src_device`
  // then names the peer; -1 is this device).
  struct Outbound {
    float* dst;
    int64_t dst_device;
    const float* src;
    int64_t n;
    int64_t src_device = -1;
  };
  // `copies` in order, merged: ranges contiguous at both ends into one copy,
  // rows of equal length at fixed pitches into one CopyRows; down to a proxy
  // in host memory on the copy stream (CopyDown).
  Status IssueCopies(const std::vector<Outbound>& copies, const char* what);
  // The stream, for work about to be enqueued: the next Publish records.
  Stream* Enqueue();
  // Where a launch reads `spans` (`num` of them, `begin` filled): a span
  // table of this device's, uploaded unless a slot holds it (SpanTables),
  // or, on a stream whose work is done when enqueued, `spans` itself.
  Status Table(const kernels::Span* spans, int64_t num, const kernels::Span** table);
  // Whether this device's kernels read and write `device`'s memory directly.
  bool Addressable(int64_t device) const { return res_.shares_memory(self_, device); }

  // n floats from `src` on mesh device `src_device` to `dst` on `dst_device`:
  // the one place that picks the transport. To a proxy in host memory (a
  // push, or seeding its master) a Download, which the caller's Publish
  // then marks for the proxy's host wait (HostProxyDevice::Acquire); from
  // one (a pull) an UploadPinned, after the caller's WaitFlag; else a peer
  // Copy.
  Status PeerCopy(float* dst, int64_t dst_device, const float* src, int64_t src_device, int64_t n,
                  const char* what);
  // PeerCopy without flushing what is held: for copies that held work does not read or write
  // (a pull's piece into staging the held unpack has not claimed).
  Status Transfer(float* dst, int64_t dst_device, const float* src, int64_t src_device, int64_t n,
                  const char* what);

  // Copies down to a proxy in host memory on the copy stream: this stream
  // marks where the pack that filled staging ends, the copy stream waits for
  // it and copies (Flush).
  Status CopyDown(const Outbound& o);
  // This stream waits for everything the copy stream was asked so far (before
  // staging is written again, and before the host synchronizes).
  Status JoinCopies();
  // `side` waits for everything enqueued on this stream so far (`mark`
  // recorded here); this stream waits for everything `side` was asked so
  // far (`mark` recorded there).
  Status SideWaits(Stream& side, StreamEvent mark);
  Status WaitForSide(Stream& side, StreamEvent mark);
  // SideWaits for the copy stream, unless it has since this stream's last
  // enqueued work (marked_).
  Status MarkForCopies();
  // The copy-up stream waits for everything enqueued on this stream so far
  // (before it writes its staging ring), unless it has since this call
  // began or the ring's cursor last wrapped.
  Status StartUps();
  // This stream waits for everything the copy-up stream was asked so far.
  Status JoinUps();

  std::unique_ptr<Stream> stream_;
  // Whether work is held back to merge (Flush): not on a stream whose work
  // is done when enqueued, where a launch costs nothing to save, and where
  // the host's loops (the shared-memory strategy's sums, runtime/
  // shared_memory.h) then read what every call before them wrote.
  bool holds_;
  std::unique_ptr<Stream> copies_;  // null: every copy on stream_
  CopyMarks* marks_ = nullptr;      // with copies_: its bookkeeping in this storage set
  bool marked_ = false;             // copies_ waited for stream_'s last enqueued work
  std::unique_ptr<Stream> ups_;     // null: every copy up on stream_
  bool ups_started_ = false;        // ups_ waited for stream_ in this call (since the last wrap)
  bool ups_unjoined_ = false;       // ups_ has work stream_ has not waited for
  bool staged_down_ = false;        // this call staged a push in the copy ring (Stage)
  bool staged_up_ = false;          // this call staged a pull in the copy-up ring
  int64_t self_;
  StreamResources& res_;
  Queued queued_;
  std::vector<kernels::Span> norm_spans_;  // SumSquaresPart's runs (kept: no allocation per step)
  std::vector<Outbound> outbound_;         // the held pack's copies out of staging, in order
  std::vector<Outbound> inbound_;          // the held unpack's copies into staging, in order
  int64_t staged_ = 0;                     // floats of staging the held work uses, from its start
  PublicationsSeen acquired_;              // Acquire waits once per publication of a device
  bool dirty_ = true;  // work enqueued since this device's last record (Publish)
};

// The device of worker `device`'s call, kept in its storage set across calls
// (StreamResources::kept_device), so a steady call allocates no device, stream
// wrappers or vectors: `build()` (StatusOr<std::unique_ptr<StreamDevice>>)
// makes one on the worker's first call, when the stream it runs on (`key`)
// changed, and, as the call's own, while another call holds the kept one.
template <typename Build>
StatusOr<DeviceHandle> KeptStreamDevice(StreamResources& res, int64_t device, const void* key,
                                        Build&& build) {
  KeptDevice* kept = res.kept_device(device);
  bool idle = false;
  if (kept == nullptr ||
      !kept->busy.compare_exchange_strong(idle, true, std::memory_order_acq_rel)) {
    auto made = build();
    if (made.has_error()) return made.error();
    return DeviceHandle(std::unique_ptr<Device>(std::move(made.value())));
  }
  if (kept->device == nullptr || kept->key != key) {
    auto made = build();
    if (made.has_error()) {
      kept->busy.store(false, std::memory_order_release);
      return made.error();
    }
    kept->device = std::move(made.value());
    kept->key = key;
  } else {
    static_cast<StreamDevice&>(*kept->device).BeginCall();
  }
  return DeviceHandle(*kept->device, &kept->busy);
}

}  // namespace coarse
