#include "cuda/cuda_selftest.h"

#include <cuda_runtime.h>

#include "cuda/cuda_device.h"
#include "cuda/cuda_util.h"

namespace coarse::cuda {
namespace ffi = xla::ffi;

namespace {

class CudaMember final : public SelfTestMember {
 public:
  CudaMember(int ordinal, int64_t worker, CudaStorage& storage) {
    cudaSetDevice(ordinal);
    cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    dev_ = std::make_unique<CudaDevice>(stream_, worker, storage);
  }
  ~CudaMember() override {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  Device& device() override { return *dev_; }
  ffi::Error Load(float* storage, const float* host, int64_t n) override {
    return Check(cudaMemcpyAsync(storage, host, n * sizeof(float), cudaMemcpyHostToDevice, stream_),
                 "self-test load");
  }
  ffi::Error Store(float* host, const float* storage, int64_t n) override {
    ffi::Error e = Check(
        cudaMemcpyAsync(host, storage, n * sizeof(float), cudaMemcpyDeviceToHost, stream_),
        "self-test store");
    if (e.failure()) return e;
    return Check(cudaStreamSynchronize(stream_), "self-test sync");
  }

 private:
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CudaDevice> dev_;
};

}  // namespace

MakeMember CudaSelfTestMembers(int ordinal) {
  return [ordinal](int64_t worker, Session& session) {
    auto& storage = static_cast<CudaStorage&>(session.storage());
    if (!storage.error().empty()) throw std::runtime_error(storage.error());
    return std::unique_ptr<SelfTestMember>(new CudaMember(ordinal, worker, storage));
  };
}

}  // namespace coarse::cuda
