// Sync self-test members on the CPU backend (see cpu_selftest.h): a
// CpuDevice, host buffers, memcpy loads and stores.
#include "cpu/cpu_selftest.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "cpu/cpu_device.h"

namespace coarse {
namespace ffi = xla::ffi;

namespace {

class CpuMember final : public SelfTestMember {
 public:
  Device& device() override { return dev_; }
  float* Buffer(int64_t n) override {
    buffers_.emplace_back(new float[std::max<int64_t>(n, 1)]);
    return buffers_.back().get();
  }
  ffi::Error Load(float* buffer, const float* host, int64_t n) override {
    std::memcpy(buffer, host, n * sizeof(float));
    return ffi::Error::Success();
  }
  ffi::Error Store(float* host, const float* buffer, int64_t n) override {
    std::memcpy(host, buffer, n * sizeof(float));
    return ffi::Error::Success();
  }

 private:
  CpuDevice dev_;
  std::vector<std::unique_ptr<float[]>> buffers_;
};

}  // namespace

MakeMember CpuSelfTestMembers() {
  return [](int64_t, Session&) { return std::unique_ptr<SelfTestMember>(new CpuMember); };
}

}  // namespace coarse
