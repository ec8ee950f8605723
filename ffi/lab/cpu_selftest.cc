// The sync self-test's CPU platform (see cpu_selftest.h).
#include "lab/cpu_selftest.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/cpu_devices.h"

namespace coarse {

namespace {

// A worker's buffers are host memory (XLA:CPU's are too): the step's
// operands are written before its first call, as XLA writes them, and its
// results read after the last call returned. With the streams backend every
// call drains the worker's stream as it returns, as the handlers do
// (handlers_cpu.cc RunCpuCall).
class CpuWorker final : public SelfTestWorker {
 public:
  explicit CpuWorker(const Call& call) {
    auto dev = MakeCpuDevice(call, &queue_);
    if (dev.has_error()) throw std::runtime_error(std::string(dev.error().message()));
    dev_ = std::move(dev.value());
  }
  ~CpuWorker() override { CallReturns(); }  // no task of a failed step outlives the buffers
  Device& device() override { return *dev_; }
  float* Buffer(int64_t n) override {
    buffers_.emplace_back(new float[std::max<int64_t>(n, 1)]);
    return buffers_.back().get();
  }
  Status Load(float* buffer, const float* host, int64_t n) override {
    std::memcpy(buffer, host, n * sizeof(float));
    return Status::Success();
  }
  Status Store(float* host, const float* buffer, int64_t n) override {
    std::memcpy(host, buffer, n * sizeof(float));
    return Status::Success();
  }
  void CallReturns() override {
    if (queue_ != nullptr) queue_->Drain();
  }

 private:
  HostQueue* queue_ = nullptr;
  std::unique_ptr<Device> dev_;
  std::vector<std::unique_ptr<float[]>> buffers_;
};

}  // namespace

SelfTestPlatform CpuSelfTestPlatform() {
  SelfTestPlatform platform;
  platform.make_worker = [](const Call& call) {
    return std::unique_ptr<SelfTestWorker>(new CpuWorker(call));
  };
  platform.make_proxy_device = CpuProxies();
  return platform;
}

}  // namespace coarse
