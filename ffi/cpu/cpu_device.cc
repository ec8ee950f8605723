// CpuDevice (see cpu_device.h): each Device operation as a cpu_backend loop
// or a memcpy in the one address space.
#include "cpu/cpu_device.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/cpu_traffic.h"
#include "cpu/host_pool.h"
#include "runtime/dtype.h"
#include "runtime/stream.h"

namespace coarse {
namespace ffi = xla::ffi;

namespace {

constexpr int64_t kF32 = sizeof(float);

// The bytes `runs` hold in their leaves' dtypes, and as f32.
struct RunBytes {
  int64_t leaf = 0, f32 = 0;
};
RunBytes BytesOf(const LeafRun* runs, int64_t num_runs) {
  RunBytes b;
  for (int64_t r = 0; r < num_runs; ++r) {
    b.leaf += runs[r].len * xla::ffi::ByteWidth(runs[r].dtype);
    b.f32 += runs[r].len * kF32;
  }
  return b;
}

}  // namespace

ffi::Error CpuDevice::Gather(const LeafRun* runs, int64_t num_runs, float* dst, int64_t, int64_t) {
  for (int64_t r = 0; r < num_runs; ++r)
    cpu::WidenToF32(runs[r].dtype, runs[r].leaf, dst + runs[r].buf_off, runs[r].len);
  const RunBytes b = BytesOf(runs, num_runs);
  cpu::CountTraffic(cpu::TrafficOp::kGather, b.leaf, b.f32);
  return ffi::Error::Success();
}

ffi::Error CpuDevice::Scatter(const float* src, int64_t, int64_t, const LeafRun* runs,
                              int64_t num_runs) {
  for (int64_t r = 0; r < num_runs; ++r)
    cpu::NarrowFromF32(runs[r].dtype, src + runs[r].buf_off, runs[r].leaf, runs[r].len);
  const RunBytes b = BytesOf(runs, num_runs);
  cpu::CountTraffic(cpu::TrafficOp::kScatter, b.f32, b.leaf);
  return ffi::Error::Success();
}

ffi::Error CpuDevice::SumSlots(float* own, int64_t n, int64_t slots, float scale) {
  if (slots == 0) {
    std::memset(own, 0, n * sizeof(float));
    cpu::CountTraffic(cpu::TrafficOp::kSum, 0, n * kF32);
  }
  if (slots == 1 && scale != 1.0f) {
    cpu::ScaleF32(own, scale, n);
    cpu::CountTraffic(cpu::TrafficOp::kScale, n * kF32, n * kF32);
  }
  if (slots <= 1) return ffi::Error::Success();
  // One pass over every slot (each read once, `own` written once), block by
  // block, in slot order: the same bits as adding one slot per pass, which
  // read and wrote `own` again for every slot after the second.
  constexpr int64_t kInline = 16;
  const float* inline_srcs[kInline];
  std::vector<const float*> more;
  const float** srcs = inline_srcs;
  if (slots > kInline) {
    more.resize(slots);
    srcs = more.data();
  }
  for (int64_t j = 0; j < slots; ++j) srcs[j] = own + j * n;
  cpu::SumInOrderF32(own, srcs, slots, n, scale);
  cpu::CountTraffic(cpu::TrafficOp::kSum, slots * n * kF32, n * kF32);
  return ffi::Error::Success();
}

ffi::Error CpuDevice::AddFrom(float* own, const float* peer, int64_t, int64_t n, float scale) {
  if (scale != 1.0f)
    cpu::AddScaleF32(own, peer, scale, n);
  else
    cpu::AddF32(own, peer, n);
  cpu::CountTraffic(cpu::TrafficOp::kRingStep, 2 * n * kF32, n * kF32);
  return ffi::Error::Success();
}

ffi::Error CpuDevice::CopyFrom(float* own, const float* peer, int64_t, int64_t n) {
  std::memcpy(own, peer, n * sizeof(float));
  cpu::CountTraffic(cpu::TrafficOp::kRingStep, n * kF32, n * kF32);
  return ffi::Error::Success();
}

ffi::Error CpuDevice::Scale(float* x, int64_t n, float scale) {
  cpu::ScaleF32(x, scale, n);
  cpu::CountTraffic(cpu::TrafficOp::kScale, n * kF32, n * kF32);
  return ffi::Error::Success();
}

ffi::Error CpuDevice::ApplyOptimizer(const OptScalars& o, const OptBuffers& b, int64_t n) {
  // A large share (a host proxy's of a big model) on the bounded host pool:
  // element-wise, so the same bits however it is split.
  cpu::ParallelFor(n, cpu::kParallelMinElems, [&](int64_t lo, int64_t hi) {
    cpu::OptimizerF32(o, cpu::AdvanceBuffers(b, lo), hi - lo);
  });
  // The gradient, the master and each state slot read; the master, the
  // gradient's buffer (the updated params, for the pull) and each slot written.
  const int64_t slots = OptSlots(o.kind, o.momentum);
  cpu::CountTraffic(cpu::TrafficOp::kOptimizer, (2 + slots) * n * kF32, (2 + slots) * n * kF32);
  return ffi::Error::Success();
}

ffi::ErrorOr<double> CpuDevice::SumSquares(const float* x, int64_t n) {
  cpu::CountTraffic(cpu::TrafficOp::kCheck, n * kF32, 0);
  return cpu::SumSquaresF32(x, n);
}

ffi::ErrorOr<Mismatch> CpuDevice::FirstMismatch(const float* master, const LeafRun* runs,
                                                int64_t num_runs, float*, int64_t, int64_t) {
  // One address space: the params are read where they are, run by run.
  Mismatch m;
  for (int64_t r = 0; r < num_runs && m.run < 0; ++r) {
    const LeafRun& run = runs[r];
    const float* held = master + run.buf_off;
    m.index = cpu::FirstMismatchIn(held, run.leaf, run.len, run.dtype);
    // Read up to the first mismatch (all of it when none): the master and the params.
    const int64_t compared = m.index >= 0 ? m.index + 1 : run.len;
    cpu::CountTraffic(cpu::TrafficOp::kCheck, compared * (kF32 + xla::ffi::ByteWidth(run.dtype)),
                      0);
    if (m.index < 0) continue;
    m.run = r;
    cpu::WidenToF32(run.dtype, ElementPtr(run.leaf, run.dtype, m.index), &m.given, 1);
    float narrow = 0;  // room for one element of any supported dtype
    cpu::NarrowFromF32(run.dtype, held + m.index, &narrow, 1);
    cpu::WidenToF32(run.dtype, &narrow, &m.held, 1);
  }
  return m;
}

ffi::Error CpuDevice::ZeroBytes(void* dst, size_t bytes) {
  std::memset(dst, 0, bytes);
  cpu::CountTraffic(cpu::TrafficOp::kBytes, 0, static_cast<int64_t>(bytes));
  return ffi::Error::Success();
}

ffi::Error CpuDevice::CopyBytes(void* dst, const void* src, size_t bytes) {
  if (dst != src) {
    std::memcpy(dst, src, bytes);
    cpu::CountTraffic(cpu::TrafficOp::kBytes, static_cast<int64_t>(bytes),
                      static_cast<int64_t>(bytes));
  }
  return ffi::Error::Success();
}

// One address space: host memory is this device's memory.
ffi::Error CpuDevice::CopyToHost(void* host, const void* own, size_t bytes) {
  return CopyBytes(host, own, bytes);
}

ffi::Error CpuDevice::CopyFromHost(void* own, const void* host, size_t bytes) {
  return CopyBytes(own, host, bytes);
}

// No backend's storage gives the CPU backend flags (Storage::ready_flags):
// this serves the self-test and any future caller, waiting on the host.
ffi::Error CpuDevice::WaitFlag(const uint32_t* flag, uint32_t value,
                               std::chrono::milliseconds timeout, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!FlagReached(ReadFlag(flag), value)) {
    if (std::chrono::steady_clock::now() >= deadline)
      return ffi::Error::Internal(what + ": timed out after " + std::to_string(timeout.count()) +
                                  " ms waiting for its flag to reach " + std::to_string(value));
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return ffi::Error::Success();
}

}  // namespace coarse
