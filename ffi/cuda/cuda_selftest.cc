// Sync self-test members on one GPU (see cuda_selftest.h): a StreamDevice on
// its own non-blocking stream, cudaMalloc'd buffers.
#include "cuda/cuda_selftest.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "cuda/cuda_storage.h"
#include "cuda/cuda_stream.h"
#include "cuda/cuda_util.h"
#include "runtime/stream_device.h"

namespace coarse::cuda {
namespace ffi = xla::ffi;

namespace {

class CudaMember final : public SelfTestMember {
 public:
  CudaMember(int ordinal, int64_t device, CudaStorage& storage) {
    cudaSetDevice(ordinal);
    cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    dev_ = std::make_unique<StreamDevice>(
        std::make_unique<CudaStream>(stream_, ordinal, storage.ordinals()), device, storage);
  }
  ~CudaMember() override {
    cudaStreamSynchronize(stream_);
    for (void* b : buffers_) cudaFree(b);
    cudaStreamDestroy(stream_);
  }
  Device& device() override { return *dev_; }
  float* Buffer(int64_t n) override {
    void* b = nullptr;
    if (cudaMalloc(&b, std::max<int64_t>(n, 1) * sizeof(float)) != cudaSuccess)
      throw std::runtime_error("sync self-test: cudaMalloc failed");
    buffers_.push_back(b);
    return static_cast<float*>(b);
  }
  ffi::Error Load(float* buffer, const float* host, int64_t n) override {
    return Check(cudaMemcpyAsync(buffer, host, n * sizeof(float), cudaMemcpyHostToDevice, stream_),
                 "self-test load");
  }
  ffi::Error Store(float* host, const float* buffer, int64_t n) override {
    ffi::Error e =
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

}  // namespace

MakeMember CudaSelfTestMembers(int ordinal) {
  return [ordinal](int64_t device, Session& session) {
    auto& storage = static_cast<CudaStorage&>(session.storage());
    if (!storage.error().empty()) throw std::runtime_error(storage.error());
    return std::unique_ptr<SelfTestMember>(new CudaMember(ordinal, device, storage));
  };
}

}  // namespace coarse::cuda
