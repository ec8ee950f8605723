// The sync self-test's CUDA platform (see cuda_selftest.h).
#include "lab/cuda_selftest.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/cuda_storage.h"
#include "cuda/cuda_stream.h"
#include "cuda/cuda_util.h"
#include "runtime/stream_device.h"

namespace coarse::cuda {

namespace {

CudaStorage& StorageOf(const Call& call) {
  auto& storage = static_cast<CudaStorage&>(call.session->storage());
  if (!storage.error().empty()) throw std::runtime_error(storage.error());
  return storage;
}

// A worker: a stream of its own (standing for XLA's stream of its GPU) and
// cudaMalloc'd buffers (its operands and results).
class CudaWorker final : public SelfTestWorker {
 public:
  CudaWorker(int ordinal, const Call& call) {
    CudaStorage& storage = StorageOf(call);
    cudaSetDevice(ordinal);
    if (cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess)
      throw std::runtime_error("sync self-test: cudaStreamCreateWithFlags failed");
    dev_ = std::make_unique<StreamDevice>(
        std::make_unique<CudaStream>(stream_, ordinal, storage.ordinals()), call.device(), storage);
  }
  ~CudaWorker() override {
    cudaStreamSynchronize(stream_);  // no copy of a failed step outlives the buffers
    for (void* b : buffers_) cudaFree(b);
    cudaStreamDestroy(stream_);
  }
  Device& device() override { return *dev_; }
  float* Buffer(int64_t n) override {
    void* b = nullptr;
    if (cudaMalloc(&b, std::max<int64_t>(n, 1) * sizeof(float)) != cudaSuccess)
      throw std::runtime_error("sync self-test: cudaMalloc of " + std::to_string(n) +
                               " floats failed");
    buffers_.push_back(b);
    return static_cast<float*>(b);
  }
  Status Load(float* buffer, const float* host, int64_t n) override {
    return Check(cudaMemcpyAsync(buffer, host, n * sizeof(float), cudaMemcpyHostToDevice, stream_),
                 "self-test load");
  }
  Status Store(float* host, const float* buffer, int64_t n) override {
    Status e =
        Check(cudaMemcpyAsync(host, buffer, n * sizeof(float), cudaMemcpyDeviceToHost, stream_),
              "self-test store");
    if (e.failure()) return e;
    return Check(cudaStreamSynchronize(stream_), "self-test sync");
  }

 private:
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<StreamDevice> dev_;
  std::vector<void*> buffers_;
};

// Proxy k's stream on GPU `ordinal`: one per proxy, owned by the runtime
// like the service's (handlers_cuda.cc RuntimeStream). The service proper
// keeps one per GPU; here all the proxies share one GPU, and a stream each
// keeps them racing.
StatusOr<cudaStream_t> SelfTestProxyStream(int ordinal, int64_t k) {
  return OwnedStream("self-test " + std::to_string(ordinal) + " " + std::to_string(k),
                     "the self-test's stream of proxy " + std::to_string(k));
}

}  // namespace

SelfTestPlatform CudaSelfTestPlatform(int ordinal, int64_t workers, int64_t proxies) {
  SelfTestPlatform platform;
  // SyncSelfTest checks the counts; a bad one never reaches the storage.
  platform.ordinals.assign(std::max<int64_t>(0, workers + (proxies == 0 ? workers : proxies)),
                           ordinal);
  platform.make_worker = [ordinal](const Call& call) {
    return std::unique_ptr<SelfTestWorker>(new CudaWorker(ordinal, call));
  };
  platform.make_proxy_device = [ordinal](const Call& call) -> StatusOr<std::unique_ptr<Device>> {
    auto& storage = static_cast<CudaStorage&>(call.session->storage());
    if (!storage.error().empty()) return Status::Internal(storage.error());
    Status e = Check(cudaSetDevice(ordinal), "cudaSetDevice");
    if (e.failure()) return e;
    auto stream = SelfTestProxyStream(ordinal, call.who.index);
    if (stream.has_error()) return stream.error();
    return std::unique_ptr<Device>(
        new StreamDevice(std::make_unique<CudaStream>(stream.value(), ordinal, storage.ordinals()),
                         call.device(), storage));
  };
  return platform;
}

}  // namespace coarse::cuda
