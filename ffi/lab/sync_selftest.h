// A self-test of the whole sync protocol on a platform's device backend,
// outside XLA: p threads, one per worker, each run exactly what the workers'
// custom calls run in a step's program order (coarse_opt_count in a
// value_and_update, coarse_push, coarse_proxy_ring, coarse_worker_ring,
// coarse_pull: the same phases, runtime/phases.h, and the same first and last
// steps, runtime/call.h), and the first worker to arrive starts the proxies'
// jobs (StartProxies, runtime/service.h), which run on the devices and
// streams the runtime owns for them, as they do under XLA. One proxy leaf
// cut into pieces and one leading leaf, several steps, each step a new
// session reusing the storage of the one before; optionally the proxy
// optimizer (sgd, with momentum) on a store that lives across the steps.
//
// Why: a single GPU cannot hold an XLA mesh of p + q devices, so this is
// how the CUDA backend runs the whole protocol, workers' and proxies'
// streams, on one GPU: every member gets its own stream, so events, staging
// buffers and peer-copy calls race as they would across GPUs (the "peers"
// share one GPU). The CPU module runs the same test on its backend, plain
// or with stream semantics (COARSE_JAX_BACKEND=streams, with
// COARSE_JAX_STREAM_CHAOS). tests/test_sync_selftest.py. The platforms:
// lab/cpu_selftest.h, lab/cuda_selftest.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/call.h"
#include "runtime/device.h"
#include "runtime/service.h"
#include "runtime/status.h"

namespace coarse {

// A worker's device (the platform's stand-in for XLA's stream of it) and
// buffers it owns (standing for the XLA buffers of the calls' operands and
// results), with host <-> buffer copies in the device's order.
class SelfTestWorker {
 public:
  virtual ~SelfTestWorker() = default;
  virtual Device& device() = 0;
  // A buffer of n floats on the worker's device, valid while it lives.
  virtual float* Buffer(int64_t n) = 0;
  // Enqueues buffer <- host (the host array outlives the step).
  virtual Status Load(float* buffer, const float* host, int64_t n) = 0;
  // buffer -> host, finished on return.
  virtual Status Store(float* host, const float* buffer, int64_t n) = 0;
  // What the platform's handler does as a custom call returns to XLA (the
  // stream-semantics CPU backend drains the device's stream).
  virtual void CallReturns() {}
};

struct SelfTestPlatform {
  // Worker `call.who.index`'s device and buffers. May throw std::runtime_error.
  std::function<std::unique_ptr<SelfTestWorker>(const Call& call)> make_worker;
  // The device a proxy's job runs on (StartProxies).
  MakeProxyDevice make_proxy_device;
  // As for StoragePool::Take: p + q entries, or empty on CPU.
  std::vector<int64_t> ordinals;
};

struct SyncSelfTestSpec {
  int64_t workers = 2;
  int64_t proxies = 0;      // q, dividing workers; 0: one per worker
  int64_t proxy_elems = 0;  // the proxy leaf: pieces of `piece` elements (the last shorter)
  int64_t piece = 1;
  int64_t leading_elems = 0;  // the leading leaf, reduced among the workers
  // Worker w sends piece s to proxy: local w / (p / q), cross (w + s) % q, dense s % q.
  std::string route = "local";
  int64_t steps = 1;
  bool in_place = false;  // push_in_place: the proxies may read the pushes in place
  // The proxy optimizer on the proxy leaf when lr > 0: sgd (w -= lr * trace,
  // trace = g + momentum * trace), seeded from `params` at the first step;
  // each later step passes the params the one before returned.
  float lr = 0, momentum = 0;
};

// values: steps x p rows of proxy_elems + leading_elems floats (worker w's
// gradient at step t in row t * p + w); params: proxy_elems floats (with
// lr > 0 only). Returns steps x p rows of that length: what each worker's
// pull and worker ring wrote at each step (with the optimizer: the new
// params, then the mean leading gradient). Throws std::invalid_argument for
// a bad spec, std::runtime_error with the runtime's message if a step fails.
std::vector<float> SyncSelfTest(const SyncSelfTestSpec& spec, const float* values,
                                const float* params, const SelfTestPlatform& platform);

}  // namespace coarse
