// The CPU backend's byte counters (see cpu_traffic.h).
#include "cpu/cpu_traffic.h"

namespace coarse::cpu {
namespace {

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

}  // namespace coarse::cpu
