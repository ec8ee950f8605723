// The stream API (runtime/stream.h) on the host: the stream-semantics CPU
// backend (COARSE_JAX_BACKEND=streams). Each device has one in-order stream,
// a thread and a task queue (as XLA's host platform in StreamExecutor has):
// an operation returns when it is enqueued, not when it is done. An event
// marks a point of one stream; waiting for it blocks the waiting stream's
// thread, never the host. Synchronize is the only host wait.
//
// A WaitValue blocks the waiting stream's thread too (polling the flag, as
// cuStreamWaitValue32 polls memory), never the caller's.
//
// With COARSE_JAX_STREAM_CHAOS=<seed> every stream sleeps or yields at
// random (seeded per stream) before its operations and its event records,
// and the host yields at random after enqueuing: a missing Acquire or host
// synchronization then reads data that is not there yet.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <string>

#include "runtime/stream.h"

namespace coarse {

// One device's stream: a thread running tasks in order. Never destroyed
// (a session's work may still be queued while the process exits).
class HostQueue {
 public:
  HostQueue(std::string name, std::optional<uint64_t> chaos_seed);
  HostQueue(const HostQueue&) = delete;
  HostQueue& operator=(const HostQueue&) = delete;

  // Appends `task`; returns its ticket (1, 2, ...). `record`: the task marks
  // an event (chaos delays those longer).
  uint64_t Enqueue(std::function<void()> task, bool record = false);
  // Blocks the calling thread until every task up to `ticket` has run.
  void WaitFor(uint64_t ticket);
  // WaitFor, at most until `deadline`; false if it passed first.
  bool WaitUntil(uint64_t ticket, std::chrono::steady_clock::time_point deadline);
  // WaitFor(the last ticket given out so far).
  void Drain();
  // Drain, at most until `deadline`; false if it passed first.
  bool DrainUntil(std::chrono::steady_clock::time_point deadline);
  // The stream's error (a WaitValue that timed out), set by its thread;
  // TakeError returns it once ("" if none).
  void SetError(const std::string& error);
  std::string TakeError();
  const std::string& name() const { return name_; }

 private:
  void Loop();
  void ChaosBeforeTask(bool record);  // the stream's thread only

  std::string name_;
  std::mutex mu_;
  std::condition_variable work_, done_cv_;
  struct Task {
    std::function<void()> run;
    bool record;
  };
  std::deque<Task> queue_;
  uint64_t enqueued_ = 0, done_ = 0;
  std::string error_;
  bool chaos_ = false;
  std::mt19937_64 host_rng_;    // under mu_: the enqueuers' yields
  std::mt19937_64 stream_rng_;  // the stream's thread only
};

// A host event: the stream and ticket of its last record.
struct HostEvent {
  std::mutex mu;
  HostQueue* queue = nullptr;
  uint64_t ticket = 0;
};

// The stream of a mesh device. Workers' streams stand for XLA's stream of
// their device, proxies' for the stream the runtime owns on a proxy's device
// (as on CUDA, a proxy sharing its worker's device has a stream of its own):
// both are keyed by the platform's device number and live for the process.
HostQueue& WorkerQueue(int64_t ordinal);
HostQueue& ProxyQueue(int64_t ordinal);
// A worker's copy stream (StreamDevice's `copies`: its copies down to a proxy
// in host memory), as a GPU's copy engine runs beside its compute.
HostQueue& CopyQueue(int64_t ordinal);
// Its copy-up stream (StreamDevice's `ups`: a pull's copies from a proxy in
// host memory and the flag waits that gate them).
HostQueue& CopyUpQueue(int64_t ordinal);
// Waits until every stream has run what was enqueued on it so far (before
// memory a stream may still touch is freed, as cudaFree waits for the GPU).
void DrainAllHostQueues();

// Stream (runtime/stream.h) over one HostQueue; `self` is the caller's mesh device.
class HostStream final : public Stream {
 public:
  explicit HostStream(HostQueue& queue) : q_(queue) {}

  Status Pack(const kernels::Span* spans, int64_t num_spans, int64_t total, float* buf) override;
  Status Unpack(const float* buf, const kernels::Span* spans, int64_t num_spans,
                int64_t total) override;
  Status Reduce(const float* const* inputs, int num_inputs, float* out, int64_t n,
                float scale) override;
  Status ReduceRows(const float* const* inputs, int num_inputs, float* out, int64_t n, float scale,
                    const RowPitches& rows) override;
  Status Optimizer(const OptScalars& o, const OptBuffers& b, int64_t n) override;
  Status OptimizerRows(const OptScalars& o, const OptBuffers& b, int64_t n, int64_t rows,
                       int64_t grad_pitch, int64_t buf_pitch) override;
  Status SumSquares(const float* x, int64_t n, double* partial, double* out) override;
  Status SumSquaresSpans(const kernels::Span* spans, int64_t num_spans, int64_t total,
                         double* partial, double* out, bool accumulate) override;
  Status ClipScalars(const double* parts, int64_t num, float clip_norm, float* out) override;
  Status FirstMismatch(const float* master, kernels::DType dtype, const void* given,
                       kernels::DType given_dtype, int64_t n, unsigned long long base,
                       unsigned long long* first) override;
  Status Memset(void* dst, size_t bytes, const char* what) override;
  Status Copy(void* dst, int64_t dst_device, const void* src, int64_t src_device, size_t bytes,
              const char* what) override;
  Status CopyRows(void* dst, int64_t dst_device, size_t dst_pitch, const void* src,
                  int64_t src_device, size_t src_pitch, size_t row_bytes, int64_t rows,
                  const char* what) override;
  Status Upload(void* dst, const void* src, size_t bytes, const char* what) override;
  Status Download(void* dst, const void* src, size_t bytes, const char* what) override;
  Status UploadPinned(void* dst, const void* src, size_t bytes, const char* what) override;
  Status Record(StreamEvent event) override;
  Status Wait(StreamEvent event, int64_t device) override;
  Status Synchronize(const char* what) override;
  Status HostWait(StreamEvent event, std::chrono::milliseconds timeout,
                  const std::string& what) override;
  Status WaitValue(const uint32_t* flag, uint32_t value, std::chrono::milliseconds timeout,
                   const std::string& what) override;

  HostQueue& queue() { return q_; }

 private:
  HostQueue& q_;
};

}  // namespace coarse
