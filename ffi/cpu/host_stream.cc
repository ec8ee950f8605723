// HostQueue, HostStream and the streams of the mesh's devices (see host_stream.h).
#include "cpu/host_stream.h"

#include <pthread.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cpu/cpu_backend_choice.h"
#include "host/host_kernels.h"
#include "runtime/host_memory.h"
#include "runtime/storage.h"
#include "runtime/wakeups.h"

namespace coarse {

HostQueue::HostQueue(std::string name, std::optional<uint64_t> chaos_seed)
    : name_(std::move(name)), chaos_(chaos_seed.has_value()) {
  if (chaos_) {
    // Seeded per stream: the same seed gives each stream the same draws.
    const uint64_t salt = std::hash<std::string>{}(name_);
    host_rng_.seed(*chaos_seed ^ salt);
    stream_rng_.seed(*chaos_seed ^ (salt * 0x9e3779b97f4a7c15ull));
  }
  CountWakeup(Wakeup::kThreadStart);
  std::thread([this] { Loop(); }).detach();
}

uint64_t HostQueue::Enqueue(std::function<void()> task, bool record) {
  bool yield = false;
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Task{std::move(task), record});
    ticket = ++enqueued_;
    if (chaos_) yield = host_rng_() % 4 == 0;
  }
  work_.notify_one();
  // Let the stream (or anyone) run before the host goes on, now and then.
  if (yield) std::this_thread::yield();
  return ticket;
}

void HostQueue::WaitFor(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return done_ >= ticket; });
}

bool HostQueue::WaitUntil(uint64_t ticket, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return done_cv_.wait_until(lock, deadline, [&] { return done_ >= ticket; });
}

void HostQueue::SetError(const std::string& error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.empty()) error_ = error;
}

std::string HostQueue::TakeError() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string e;
  e.swap(error_);
  return e;
}

void HostQueue::Drain() {
  uint64_t last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = enqueued_;
  }
  WaitFor(last);
}

bool HostQueue::DrainUntil(std::chrono::steady_clock::time_point deadline) {
  uint64_t last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = enqueued_;
  }
  return WaitUntil(last, deadline);
}

void HostQueue::ChaosBeforeTask(bool record) {
  // Delays long enough to outlast a host's round of counters and wake-ups
  // (tens of microseconds), short enough that a step stays well inside its
  // timeout: an operation sleeps up to 0.5 ms one time in five, an event
  // record up to 2 ms one time in two, and a third of the rest yield.
  const uint64_t draw = stream_rng_();
  const uint64_t micros = (draw >> 8) % (record ? 2000 : 500);
  if (draw % (record ? 2 : 5) == 0)
    std::this_thread::sleep_for(std::chrono::microseconds(micros));
  else if (draw % 3 == 0)
    std::this_thread::yield();
}

void HostQueue::Loop() {
  // The thread's name in top -H, gdb, py-spy (at most 15 characters): "coarse " and
  // the stream's initials and ordinal ("worker copy stream 3": "coarse wcs3").
  std::string short_name = "coarse ";
  for (size_t i = 0; i < name_.size(); ++i)
    if (std::isdigit(static_cast<unsigned char>(name_[i])) ||
        ((i == 0 || name_[i - 1] == ' ' || name_[i - 1] == '-') &&
         std::isalpha(static_cast<unsigned char>(name_[i]))))
      short_name += name_[i];
  pthread_setname_np(pthread_self(), short_name.substr(0, 15).c_str());
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_.wait(lock, [&] { return !queue_.empty(); });
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    if (chaos_) ChaosBeforeTask(task.record);
    task.run();
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++done_;
    }
    done_cv_.notify_all();
  }
}

namespace {

struct Registry {
  std::mutex mu;
  std::map<std::pair<int, int64_t>, HostQueue*>
      queues;  // (0 worker / 1 proxy / 2 copy / 3 copy-up, ordinal)
};

Registry& TheRegistry() {
  static Registry* r = new Registry;  // never destroyed, as the queues
  return *r;
}

// A proxy in host memory has no device: its stream is named by its index.
std::string QueueName(int kind, int64_t ordinal) {
  if (kind == 0) return "worker stream " + std::to_string(ordinal);
  if (kind == 2) return "worker copy stream " + std::to_string(ordinal);
  if (kind == 3) return "worker copy-up stream " + std::to_string(ordinal);
  if (IsHostOrdinal(ordinal))
    return "host proxy stream " + std::to_string(HostProxyOfOrdinal(ordinal));
  return "proxy stream " + std::to_string(ordinal);
}

HostQueue& QueueFor(int kind, int64_t ordinal) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  HostQueue*& q = r.queues[{kind, ordinal}];
  if (q == nullptr) q = new HostQueue(QueueName(kind, ordinal), StreamChaosSeed());
  return *q;
}

}  // namespace

HostQueue& WorkerQueue(int64_t ordinal) { return QueueFor(0, ordinal); }
HostQueue& ProxyQueue(int64_t ordinal) { return QueueFor(1, ordinal); }
HostQueue& CopyQueue(int64_t ordinal) { return QueueFor(2, ordinal); }
HostQueue& CopyUpQueue(int64_t ordinal) { return QueueFor(3, ordinal); }

void DrainAllHostQueues() {
  std::vector<HostQueue*> all;
  {
    Registry& r = TheRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (auto& [key, q] : r.queues) all.push_back(q);
  }
  for (HostQueue* q : all) q->Drain();
}

// Every operation captures its arguments by value: the caller's arrays and
// stack may be gone by the time the stream runs it.

Status HostStream::Pack(const kernels::Span* spans, int64_t num_spans, int64_t, float* buf) {
  q_.Enqueue([=] { host_kernels::Pack(spans, num_spans, buf); });
  return Status::Success();
}

Status HostStream::Unpack(const float* buf, const kernels::Span* spans, int64_t num_spans,
                          int64_t) {
  q_.Enqueue([=] { host_kernels::Unpack(buf, spans, num_spans); });
  return Status::Success();
}

Status HostStream::Reduce(const float* const* inputs, int num_inputs, float* out, int64_t n,
                          float scale) {
  if (Status e = host_kernels::CheckReduceInputs(num_inputs); e.failure()) return e;
  std::array<const float*, kernels::kMaxReduceInputs> in{};
  for (int k = 0; k < num_inputs; ++k) in[k] = inputs[k];
  q_.Enqueue([=] { host_kernels::Reduce(in.data(), num_inputs, out, n, scale); });
  return Status::Success();
}

Status HostStream::ReduceRows(const float* const* inputs, int num_inputs, float* out, int64_t n,
                              float scale, const RowPitches& rows) {
  if (Status e = host_kernels::CheckReduceInputs(num_inputs); e.failure()) return e;
  std::array<const float*, kernels::kMaxReduceInputs> in{};
  for (int k = 0; k < num_inputs; ++k) in[k] = inputs[k];
  q_.Enqueue([=] { host_kernels::ReduceRows(in.data(), num_inputs, out, n, scale, rows); });
  return Status::Success();
}

Status HostStream::Optimizer(const OptScalars& o, const OptBuffers& b, int64_t n) {
  q_.Enqueue([=] { host_kernels::Optimizer(o, b, n); });
  return Status::Success();
}

Status HostStream::OptimizerRows(const OptScalars& o, const OptBuffers& b, int64_t n, int64_t rows,
                                 int64_t grad_pitch, int64_t buf_pitch) {
  q_.Enqueue([=] {
    for (int64_t i = 0; i < rows; ++i)
      host_kernels::Optimizer(o, OptRow(b, i, grad_pitch, buf_pitch), n);
  });
  return Status::Success();
}

Status HostStream::SumSquares(const float* x, int64_t n, double*, double* out) {
  q_.Enqueue([=] { host_kernels::SumSquares(x, n, out); });
  return Status::Success();
}

Status HostStream::SumSquaresSpans(const kernels::Span* spans, int64_t num_spans, int64_t, double*,
                                   double* out, bool accumulate) {
  q_.Enqueue([=] { host_kernels::SumSquaresSpans(spans, num_spans, out, accumulate); });
  return Status::Success();
}

Status HostStream::ClipScalars(const double* parts, int64_t num, float clip_norm, float* out) {
  q_.Enqueue([=] { ClipScalarsOf(parts, num, clip_norm, out); });
  return Status::Success();
}

Status HostStream::FirstMismatch(const float* master, kernels::DType dtype, const void* given,
                                 kernels::DType given_dtype, int64_t n, unsigned long long base,
                                 unsigned long long* first) {
  q_.Enqueue(
      [=] { host_kernels::FirstMismatch(master, dtype, given, given_dtype, n, base, first); });
  return Status::Success();
}

// A device's Copy or Memset on the runtime's host memory is the CUDA
// backend's error (a device-to-device copy of a host pointer): refused here
// too, so that CPU runs catch it (runtime/host_memory.h).
static Status NotHostMemory(const void* p, size_t bytes, const char* what) {
  if (!IsHostMemory(p, bytes)) return Status::Success();
  return Status::Internal(std::string("coarse_jax: ") + what +
                          ": a device copy or memset touched the runtime's host memory "
                          "(use Device::CopyToHost/CopyFromHost, runtime/device.h)");
}

Status HostStream::Memset(void* dst, size_t bytes, const char* what) {
  Status e = NotHostMemory(dst, bytes, what);
  if (e.failure()) return e;
  q_.Enqueue([=] { std::memset(dst, 0, bytes); });
  return Status::Success();
}

Status HostStream::Copy(void* dst, int64_t, const void* src, int64_t, size_t bytes,
                        const char* what) {
  Status e = NotHostMemory(dst, bytes, what);
  if (e.success()) e = NotHostMemory(src, bytes, what);
  if (e.failure()) return e;
  // One address space: a peer copy is a memcpy, but on this stream, in its
  // order, as cudaMemcpyPeerAsync on the caller's stream.
  q_.Enqueue([=] { std::memcpy(dst, src, bytes); });
  return Status::Success();
}

Status HostStream::CopyRows(void* dst, int64_t, size_t dst_pitch, const void* src, int64_t,
                            size_t src_pitch, size_t row_bytes, int64_t rows, const char* what) {
  for (int64_t i = 0; i < rows; ++i) {
    Status e = NotHostMemory(static_cast<char*>(dst) + i * dst_pitch, row_bytes, what);
    if (e.success())
      e = NotHostMemory(static_cast<const char*>(src) + i * src_pitch, row_bytes, what);
    if (e.failure()) return e;
  }
  q_.Enqueue([=] { host_kernels::CopyRows(dst, dst_pitch, src, src_pitch, row_bytes, rows); });
  return Status::Success();
}

Status HostStream::Upload(void* dst, const void* src, size_t bytes, const char*) {
  auto copy = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                  static_cast<const char*>(src) + bytes);
  q_.Enqueue([=] { std::memcpy(dst, copy->data(), bytes); });
  return Status::Success();
}

Status HostStream::Download(void* dst, const void* src, size_t bytes, const char*) {
  q_.Enqueue([=] { std::memcpy(dst, src, bytes); });
  return Status::Success();
}

Status HostStream::UploadPinned(void* dst, const void* src, size_t bytes, const char* what) {
  // Only the runtime's pinned host memory (a host proxy's storage) may be
  // read late: anything else may be gone by then (use Upload).
  if (!IsHostMemory(src, bytes))
    return Status::Internal(std::string("coarse_jax: ") + what +
                            ": a pinned upload from memory that is not the runtime's "
                            "registered host memory (runtime/host_memory.h)");
  q_.Enqueue([=] { std::memcpy(dst, src, bytes); });
  return Status::Success();
}

// A WaitValue that timed out on this stream fails the next call that
// reports the stream's state.
static Status StreamError(HostQueue& q) {
  std::string e = q.TakeError();
  if (e.empty()) return Status::Success();
  return Status::Internal(e);
}

Status HostStream::Record(StreamEvent event) {
  Status err = StreamError(q_);
  if (err.failure()) return err;
  auto* e = static_cast<HostEvent*>(event);
  // The marker task does nothing: the event is done when the stream reaches it.
  const uint64_t ticket = q_.Enqueue([] {}, /*record=*/true);
  std::lock_guard<std::mutex> lock(e->mu);
  e->queue = &q_;
  e->ticket = ticket;
  return Status::Success();
}

Status HostStream::Wait(StreamEvent event, int64_t) {
  auto* e = static_cast<HostEvent*>(event);
  HostQueue* queue;
  uint64_t ticket;
  {
    // What the event marks now, as cudaStreamWaitEvent takes it at the call.
    std::lock_guard<std::mutex> lock(e->mu);
    queue = e->queue;
    ticket = e->ticket;
  }
  if (queue == nullptr || queue == &q_) return Status::Success();  // never recorded / in order
  q_.Enqueue([queue, ticket] { queue->WaitFor(ticket); });
  return Status::Success();
}

Status HostStream::Synchronize(const char*) {
  q_.Drain();
  return StreamError(q_);
}

Status HostStream::HostWait(StreamEvent event, std::chrono::milliseconds timeout,
                            const std::string& what) {
  auto* e = static_cast<HostEvent*>(event);
  HostQueue* queue;
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(e->mu);  // what the event marks now
    queue = e->queue;
    ticket = e->ticket;
  }
  if (queue == nullptr) return Status::Success();  // never recorded
  if (queue->WaitUntil(ticket, std::chrono::steady_clock::now() + timeout))
    return Status::Success();
  return Status::Internal(what + ": timed out after " + std::to_string(timeout.count()) +
                          " ms waiting on the host for an event of " + queue->name());
}

Status HostStream::WaitValue(const uint32_t* flag, uint32_t value,
                             std::chrono::milliseconds timeout, const std::string& what) {
  HostQueue* q = &q_;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  q_.Enqueue([=] {
    uint32_t now = 0;
    if (!host_kernels::PollFlag(flag, value, deadline, &now))
      q->SetError(what + ": " + q->name() + " timed out after " + std::to_string(timeout.count()) +
                  " ms waiting for its flag to reach " + std::to_string(value) + " (it holds " +
                  std::to_string(now) + ")");
  });
  return Status::Success();
}

}  // namespace coarse
