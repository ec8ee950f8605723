// The host-memory storage pool, which the CPU module installs as its
// storage pool (runtime/storage.h) when it loads.
//
// Spare sets are kept most recent first and the oldest are freed beyond
// kMaxSpareBytes, so a process that ran many large plans (a benchmark
// suite) does not keep them all; the newest set is always kept, whatever
// its size, so a single large plan still reuses its storage.
#include "cpu/cpu_storage.h"

#include <algorithm>
#include <list>
#include <memory>
#include <mutex>

#include "runtime/storage.h"

namespace coarse {
namespace {

class HostStorage : public Storage {
 public:
  explicit HostStorage(const Plan& plan) {
    for (int64_t k = 0; k < plan.workers; ++k) {
      arenas_.emplace_back(new float[std::max<int64_t>(1, plan.arena_nelems[k])]);
      scratch_.emplace_back(new float[std::max<int64_t>(1, plan.leading_nelems)]);
    }
  }
  float* arena(int64_t proxy) override { return arenas_[proxy].get(); }
  float* scratch(int64_t worker) override { return scratch_[worker].get(); }

 private:
  std::vector<std::unique_ptr<float[]>> arenas_, scratch_;
};

class HostPool : public StoragePool {
 public:
  std::unique_ptr<Storage> Take(const Plan& plan, const std::vector<int64_t>&) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = spare_.begin(); it != spare_.end(); ++it) {
        if (it->key != plan.key) continue;
        std::unique_ptr<Storage> set = std::move(it->set);
        bytes_ -= it->bytes;
        spare_.erase(it);
        return set;
      }
    }
    return std::make_unique<HostStorage>(plan);
  }

  void Give(const Plan& plan, const std::vector<int64_t>&, std::unique_ptr<Storage> set) override {
    int64_t bytes = 0;
    for (int64_t k = 0; k < plan.workers; ++k)
      bytes +=
          (std::max<int64_t>(1, plan.arena_nelems[k]) + std::max<int64_t>(1, plan.leading_nelems)) *
          sizeof(float);
    std::lock_guard<std::mutex> lock(mu_);
    spare_.push_front(Entry{plan.key, std::move(set), bytes});
    bytes_ += bytes;
    // Two sets of one plan may be spare at once: the next step's session can
    // be created while the last thread of the previous one still releases.
    while (spare_.size() > 1 && bytes_ > kMaxSpareBytes) {
      bytes_ -= spare_.back().bytes;
      spare_.pop_back();
    }
  }

 private:
  static constexpr int64_t kMaxSpareBytes = int64_t{2} << 30;
  struct Entry {
    int64_t key;
    std::unique_ptr<Storage> set;
    int64_t bytes;
  };
  std::mutex mu_;
  std::list<Entry> spare_;
  int64_t bytes_ = 0;
};

}  // namespace

void InstallHostStoragePool() {
  static StoragePool* host = new HostPool;
  SetStoragePool(host);
}

}  // namespace coarse
