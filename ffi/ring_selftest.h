// A self-test of the ring protocol on a platform's device backend, outside
// XLA: p worker threads, each with its own Device, run the workers' ring
// all-reduce (WorkerRingAllReduce, the code coarse_worker_ring runs) over
// runtime storage for several steps, each step a new session reusing the
// storage of the one before. On one GPU every member gets its own stream, so
// the CUDA backend's events, staging and peer-copy paths race as they would
// across GPUs; a single GPU cannot run an XLA mesh of 2p devices, so this is
// how the CUDA transport is exercised there (tests/test_cuda_ring.py).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/session.h"

namespace coarse {

// One member's device plus host <-> storage copies in its device's order.
class SelfTestMember {
 public:
  virtual ~SelfTestMember() = default;
  virtual Device& device() = 0;
  // Enqueues storage <- host (the host buffer outlives the step).
  virtual xla::ffi::Error Load(float* storage, const float* host, int64_t n) = 0;
  // storage -> host, finished on return.
  virtual xla::ffi::Error Store(float* host, const float* storage, int64_t n) = 0;
};

using MakeMember = std::function<std::unique_ptr<SelfTestMember>(int64_t worker, Session&)>;

// values: p rows of n floats (worker w's gradient in row w). Returns
// steps * p rows: every worker's mean after every step. `ordinals` as for
// StoragePool::Take (2p entries, or empty on CPU). Throws std::runtime_error
// with the runtime's message if a member fails.
std::vector<float> RingSelfTest(int64_t p, int64_t n, const float* values, int64_t steps,
                                const std::vector<int64_t>& ordinals, const MakeMember& make);

// Members on the CPU backend (host memory, memcpy).
MakeMember CpuSelfTestMembers();

}  // namespace coarse
