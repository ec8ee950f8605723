// HostProxyDevice (see host_proxy_device.h).
#include "runtime/host_proxy_device.h"

#include <functional>
#include <thread>
#include <utility>

#include "kernels/element_math.h"
#include "runtime/dtype.h"
#include "runtime/stream_ops.h"
#include "runtime/traffic.h"

namespace coarse {

HostProxyDevice::HostProxyDevice(std::unique_ptr<Stream> host, std::unique_ptr<Stream> waits,
                                 StreamResources& resources, int64_t workers, std::string who,
                                 std::chrono::milliseconds timeout,
                                 std::optional<uint64_t> chaos_seed)
    : host_(std::move(host)),  // host loops, not device work: not counted (stream_ops.h)
      waits_(Counted(std::move(waits), resources)),
      res_(resources),
      workers_(workers),
      who_(std::move(who)),
      timeout_(timeout) {
  if (chaos_seed) chaos_.emplace(*chaos_seed ^ std::hash<std::string>{}(who_));
}

namespace {
constexpr int64_t kF32 = sizeof(float);
}  // namespace

Status HostProxyDevice::Gather(const LeafRun* runs, int64_t num_runs, float* dst, int64_t,
                               int64_t) {
  int64_t total = 0;
  Status e = SpansOf(runs, num_runs, &spans_, &total);
  if (e.failure() || num_runs == 0) return e;
  CountGather(runs, num_runs);
  return host_->Pack(spans_.data(), num_runs, total, dst);
}

Status HostProxyDevice::Scatter(const float* src, int64_t, int64_t, const LeafRun* runs,
                                int64_t num_runs) {
  int64_t total = 0;
  Status e = SpansOf(runs, num_runs, &spans_, &total);
  if (e.failure() || num_runs == 0) return e;
  CountScatter(runs, num_runs);
  return host_->Unpack(src, spans_.data(), num_runs, total);
}

Status HostProxyDevice::AddFrom(float* own, const float* peer, int64_t, int64_t n, float scale,
                                const Rows& rows) {
  for (int64_t i = 0; i < rows.count && n > 0; ++i) {
    CountTraffic(TrafficOp::kRingStep, 2 * n * kF32, n * kF32);
    float* o = own + i * rows.own_pitch;
    const float* in[2] = {o, peer + i * rows.peer_pitch};
    Status e = host_->Reduce(in, 2, o, n, scale);
    if (e.failure()) return e;
  }
  return Status::Success();
}

Status HostProxyDevice::CopyFrom(float* own, const float* peer, int64_t peer_device, int64_t n,
                                 const Rows& rows) {
  for (int64_t i = 0; i < rows.count && n > 0; ++i) {
    CountTraffic(TrafficOp::kRingStep, n * kF32, n * kF32);
    Status e = host_->Copy(own + i * rows.own_pitch, workers_, peer + i * rows.peer_pitch,
                           peer_device, n * sizeof(float), "ring copy");
    if (e.failure()) return e;
  }
  return Status::Success();
}

Status HostProxyDevice::Scale(float* x, int64_t n, float scale) {
  CountTraffic(TrafficOp::kScale, n * kF32, n * kF32);
  const float* in[1] = {x};
  return n == 0 ? Status::Success() : host_->Reduce(in, 1, x, n, scale);
}

Status HostProxyDevice::ApplyOptimizer(const OptScalars& o, const OptBuffers& b, int64_t n) {
  Stall();
  CountOptimizer(o, n);
  return n <= 0 ? Status::Success() : host_->Optimizer(o, b, n);
}

StatusOr<double> HostProxyDevice::SumSquares(const float* x, int64_t n) {
  CountTraffic(TrafficOp::kCheck, n * kF32, 0);
  double out = 0;
  Status e = host_->SumSquares(x, n, nullptr, &out);
  if (e.failure()) return e;
  return out;
}

StatusOr<Mismatch> HostProxyDevice::FirstMismatch(const float* master, const LeafRun* runs,
                                                  int64_t num_runs, float*, int64_t, int64_t) {
  // Host memory: the params compared where they are, in their dtype.
  Mismatch m;
  unsigned long long first = ~0ull;
  for (int64_t r = 0; r < num_runs; ++r) {
    const LeafRun& run = runs[r];
    const DType t = run.dtype;
    Status e = host_->FirstMismatch(master + run.buf_off, t, run.leaf, t, run.len,
                                    static_cast<unsigned long long>(run.buf_off), &first);
    if (e.failure()) return e;
  }
  CountCheck(runs, num_runs, first);
  for (int64_t r = 0; r < num_runs && m.run < 0; ++r) {
    const LeafRun& run = runs[r];
    if (first >= static_cast<unsigned long long>(run.buf_off + run.len)) continue;
    const DType t = run.dtype;
    m.run = r;
    m.index = static_cast<int64_t>(first) - run.buf_off;
    m.given = kernels::WidenAt(run.leaf, t, m.index);
    m.held = kernels::RoundTrip(master[first], t);
  }
  return m;
}

Status HostProxyDevice::ZeroBytes(void* dst, size_t bytes) {
  CountTraffic(TrafficOp::kBytes, 0, static_cast<int64_t>(bytes));
  return bytes == 0 ? Status::Success() : host_->Memset(dst, bytes, "zeroing a result");
}

Status HostProxyDevice::CopyBytes(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return Status::Success();
  CountTraffic(TrafficOp::kBytes, static_cast<int64_t>(bytes), static_cast<int64_t>(bytes));
  return host_->Copy(dst, workers_, src, workers_, bytes, "copying bytes");
}

void HostProxyDevice::Stall() {
  if (!chaos_) return;
  const uint64_t r = (*chaos_)();
  if (r % 2 == 0) std::this_thread::sleep_for(std::chrono::microseconds((r >> 8) % 1500));
}

Status HostProxyDevice::Acquire(int64_t device) {
  // Another proxy in host memory wrote its storage on the host before its
  // counters said so; a worker's writes are copies on its stream.
  if (device >= workers_) return Status::Success();
  return acquired_.WaitOnce(res_, device, [&] {
    return waits_->HostWait(res_.event(device), timeout_,
                            "coarse_jax: " + who_ + ": worker " + std::to_string(device) +
                                "'s stream to finish its device-to-host copies into this proxy");
  });
}

}  // namespace coarse
