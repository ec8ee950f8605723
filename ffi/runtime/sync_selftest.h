// A self-test of the whole sync protocol on a platform's device backend,
// outside XLA: 2p threads (p workers, p proxies), each with its own Device,
// run the phases the four custom calls run (PushPieces, ReducePieces,
// ReduceLeading, PullPieces: the same code, see phases.h) on one proxy leaf cut
// into pieces and one leading leaf, for several steps, each step a new
// session reusing the storage of the one before.
//
// Why: a single GPU cannot hold an XLA mesh of 2p devices, so this is how the
// CUDA backend runs the protocol on one GPU: every member gets its own
// stream, so events, staging buffers and peer-copy calls race as they would
// across GPUs (the "peers" share one GPU). tests/test_sync_selftest.py.
// Members for each backend: cpu/cpu_selftest.h, cuda/cuda_selftest.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/session.h"

namespace coarse {

// One member's device, buffers it owns, and host <-> buffer copies in its
// device's order.
class SelfTestMember {
 public:
  virtual ~SelfTestMember() = default;
  virtual Device& device() = 0;
  // A buffer of n floats on the member's device, valid while it lives.
  virtual float* Buffer(int64_t n) = 0;
  // Enqueues buffer <- host (the host array outlives the step).
  virtual xla::ffi::Error Load(float* buffer, const float* host, int64_t n) = 0;
  // buffer -> host, finished on return.
  virtual xla::ffi::Error Store(float* host, const float* buffer, int64_t n) = 0;
};

// `device`: mesh device index (worker i -> i, proxy k -> p + k).
using MakeMember = std::function<std::unique_ptr<SelfTestMember>(int64_t device, Session&)>;

struct SyncSelfTestSpec {
  int64_t workers = 2;
  int64_t proxy_elems = 0;  // the proxy leaf: pieces of `piece` elements (the last shorter)
  int64_t piece = 1;
  int64_t leading_elems = 0;    // the leading leaf, reduced among the workers
  std::string route = "local";  // worker w sends piece s to: local w, cross (w+s)%p, dense s%p
  int64_t steps = 1;
};

// values: p rows of proxy_elems + leading_elems floats (worker w's gradient
// in row w). Returns steps x 2p rows of that length: what every device (all
// workers, then all proxies) holds after every step. `ordinals` as for
// StoragePool::Take (2p entries, or empty on CPU). Throws std::runtime_error
// with the runtime's message if a member fails.
std::vector<float> SyncSelfTest(const SyncSelfTestSpec& spec, const float* values,
                                const std::vector<int64_t>& ordinals, const MakeMember& make);

}  // namespace coarse
