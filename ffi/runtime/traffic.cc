// The byte counters (see traffic.h).
#include "runtime/traffic.h"

#include <algorithm>

#include "runtime/dtype.h"

namespace coarse {
namespace {

constexpr int64_t kF32 = sizeof(float);
constexpr int kOps = static_cast<int>(TrafficOp::kCount);
std::atomic<int64_t> read_bytes[kOps], written_bytes[kOps];

}  // namespace

const char* TrafficOpName(TrafficOp op) {
  switch (op) {
    case TrafficOp::kGather: return "gather";
    case TrafficOp::kScatter: return "scatter";
    case TrafficOp::kSum: return "sum";
    case TrafficOp::kRingStep: return "ring_step";
    case TrafficOp::kScale: return "scale";
    case TrafficOp::kOptimizer: return "optimizer";
    case TrafficOp::kCheck: return "check";
    case TrafficOp::kBytes: return "bytes";
    default: return "?";
  }
}

void CountTraffic(TrafficOp op, int64_t read, int64_t written) {
  const int i = static_cast<int>(op);
  read_bytes[i].fetch_add(read, std::memory_order_relaxed);
  written_bytes[i].fetch_add(written, std::memory_order_relaxed);
}

std::vector<TrafficCount> Traffic() {
  std::vector<TrafficCount> out(kOps);
  for (int i = 0; i < kOps; ++i)
    out[i] = TrafficCount{read_bytes[i].load(std::memory_order_relaxed),
                          written_bytes[i].load(std::memory_order_relaxed)};
  return out;
}

namespace {

struct RunBytes {
  int64_t leaf = 0, f32 = 0;
};
RunBytes BytesOf(const LeafRun* runs, int64_t num_runs) {
  RunBytes b;
  for (int64_t r = 0; r < num_runs; ++r) {
    b.leaf += runs[r].len * ByteWidth(runs[r].dtype);
    b.f32 += runs[r].len * kF32;
  }
  return b;
}

}  // namespace

void CountGather(const LeafRun* runs, int64_t num_runs) {
  const RunBytes b = BytesOf(runs, num_runs);
  CountTraffic(TrafficOp::kGather, b.leaf, b.f32);
}

void CountScatter(const LeafRun* runs, int64_t num_runs) {
  const RunBytes b = BytesOf(runs, num_runs);
  CountTraffic(TrafficOp::kScatter, b.f32, b.leaf);
}

void CountOptimizer(const OptScalars& o, int64_t n) {
  const int64_t moved = (2 + OptSlots(o.kind, o.momentum)) * n * kF32;
  CountTraffic(TrafficOp::kOptimizer, moved, moved);
}

void CountCheck(const LeafRun* runs, int64_t num_runs, unsigned long long first) {
  for (int64_t r = 0; r < num_runs; ++r) {
    const LeafRun& run = runs[r];
    const bool here = first < static_cast<unsigned long long>(run.buf_off + run.len);
    const int64_t compared =
        here ? std::max<int64_t>(0, static_cast<int64_t>(first) - run.buf_off + 1) : run.len;
    CountTraffic(TrafficOp::kCheck, compared * (kF32 + ByteWidth(run.dtype)), 0);
  }
}

void CountSumSlots(int64_t n, int64_t slots, float scale) {
  if (slots == 0) CountTraffic(TrafficOp::kSum, 0, n * kF32);
  if (slots == 1 && scale != 1.0f) CountTraffic(TrafficOp::kScale, n * kF32, n * kF32);
  if (slots > 1) CountTraffic(TrafficOp::kSum, slots * n * kF32, n * kF32);
}

}  // namespace coarse
