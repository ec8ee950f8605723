// Bytes the device operations read and write (the bytes per path, counted
// where they are moved, not read off the code). Every Device operation of
// StreamDevice and HostProxyDevice adds what its work touches to the counter
// of its kind (the helpers below), on every platform; the CPU module reports
// them (the CUDA module does not: on a GPU the bytes are the profiler's):
// a sum of k sources over n floats reads 4kn bytes and writes 4n; widening a
// bf16 run reads 2 bytes an element and writes 4. Relaxed atomics, one add
// per operation (an operation covers a piece or a run, never one element),
// so counting costs nothing measurable. The counters cover every session of
// the process since it started; a reader takes their difference around one
// sync (coarse_jax._ffi.traffic).
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "runtime/device.h"

namespace coarse {

// One counter per kind of operation; TrafficOpName gives its name.
enum class TrafficOp : int {
  kGather,     // leaves widened into f32 storage (a copying push, a ring's scratch)
  kScatter,    // f32 storage narrowed into leaves (a pull, the leading layers' outputs)
  kSum,        // the one-pass sums (the proxies', the leading layers')
  kRingStep,   // one peer's chunk added or copied (the rings on emulated links)
  kScale,      // a separate scaling pass
  kOptimizer,  // the proxies' optimizer
  kCheck,      // the params check and the global norm's sum of squares
  kBytes,      // plain byte copies and zero fills (tokens, pass-through outputs, host chunks)
  kCount
};
const char* TrafficOpName(TrafficOp op);

struct TrafficCount {
  int64_t read = 0, written = 0;  // bytes
};

void CountTraffic(TrafficOp op, int64_t read, int64_t written);
// Indexed by TrafficOp.
std::vector<TrafficCount> Traffic();

// What one Device operation moves, by kind (StreamDevice, HostProxyDevice):
// leaves widened into f32 (kGather) or narrowed out of it (kScatter).
void CountGather(const LeafRun* runs, int64_t num_runs);
void CountScatter(const LeafRun* runs, int64_t num_runs);
// A sum of `slots` slots of n floats into one (Device::SumSlots): zeros
// written for none; a scaling pass for one scaled; else one pass.
void CountSumSlots(int64_t n, int64_t slots, float scale);
// One optimizer update of n elements (Device::ApplyOptimizer): the
// gradient, the master and each state slot read; the master, the gradient's
// buffer (the updated params, for the pull) and each slot written.
void CountOptimizer(const OptScalars& o, int64_t n);
// The params check over `runs` (in buf_off order) that found its first
// mismatch at buffer offset `first` (none: past every run): the master and
// the params read up to it.
void CountCheck(const LeafRun* runs, int64_t num_runs, unsigned long long first);

}  // namespace coarse
