#include "ring_selftest.h"

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <cstring>

#include "call.h"
#include "runtime/cpu_device.h"

namespace coarse {
namespace ffi = xla::ffi;

static std::shared_ptr<const Plan> SelfTestPlan(int64_t p, int64_t n) {
  auto plan = std::make_shared<Plan>();
  plan->key = (int64_t{0x5e1f7e57} << 24) ^ (p << 40) ^ n;  // one storage set per (p, n)
  plan->workers = p;
  plan->timeout_ms = 20000;
  plan->mean = true;
  plan->piece_seg_begin = {0};
  plan->leaf_nelems = {n};
  plan->leaf_names = {"selftest"};
  plan->num_proxy_leaves = 0;
  plan->leading_nelems = n;
  plan->leading_nbytes = n * static_cast<int64_t>(sizeof(float));
  plan->arena_nelems.assign(p, 0);
  return plan;
}

std::vector<float> RingSelfTest(int64_t p, int64_t n, const float* values, int64_t steps,
                                const std::vector<int64_t>& ordinals, const MakeMember& make) {
  if (p < 1 || n < 0 || steps < 1) throw std::invalid_argument("p >= 1, n >= 0, steps >= 1");
  auto plan = SelfTestPlan(p, n);
  std::vector<float> out(steps * p * n);
  static std::atomic<int64_t> next_run{int64_t{1} << 50};  // apart from XLA's run ids
  std::mutex error_mu;
  std::string error;
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t run_id = next_run.fetch_add(1);
    std::vector<std::thread> threads;
    for (int64_t w = 0; w < p; ++w) {
      threads.emplace_back([&, w] {
        auto session = JoinSession(plan, run_id, 0, ordinals);
        auto member = make(w, *session);
        Device& dev = member->device();
        const Who who{kWorker, w};
        ffi::Error e = ffi::Error::Success();
        if (session->TakeFirstCall(w))
          for (int64_t d = 0; d < 2 * p && e.success(); ++d)
            if (d != w) e = dev.Acquire(d);
        if (e.success()) e = member->Load(session->scratch(w), values + w * n, n);
        if (e.success()) e = WorkerRingAllReduce(*session, dev, who);
        if (e.success()) e = member->Store(out.data() + (step * p + w) * n, session->scratch(w), n);
        if (e.success()) e = dev.Publish();
        if (e.failure()) {
          session->Poison(e.message());
          std::lock_guard<std::mutex> lock(error_mu);
          if (error.empty()) error = e.message();
        }
        // The proxies never join this session: count them out so it ends.
        for (int64_t k = 0; k < (w == 0 ? p : 0); ++k) session->Leave();
        session->Leave();
      });
    }
    for (auto& t : threads) t.join();
    if (!error.empty()) throw std::runtime_error(error);
  }
  return out;
}

namespace {

class CpuMember final : public SelfTestMember {
 public:
  Device& device() override { return dev_; }
  ffi::Error Load(float* storage, const float* host, int64_t n) override {
    std::memcpy(storage, host, n * sizeof(float));
    return ffi::Error::Success();
  }
  ffi::Error Store(float* host, const float* storage, int64_t n) override {
    std::memcpy(host, storage, n * sizeof(float));
    return ffi::Error::Success();
  }

 private:
  CpuDevice dev_;
};

}  // namespace

MakeMember CpuSelfTestMembers() {
  return [](int64_t, Session&) { return std::unique_ptr<SelfTestMember>(new CpuMember); };
}

}  // namespace coarse
