// This module's storage pool (see storage.h): installed once by the module's
// initializer, host memory on CPU (cpu/cpu_storage.cc), GPU memory on CUDA
// (cuda/cuda_storage.cc); and the spare sets both keep, within limits.
#include "runtime/storage.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <utility>

namespace coarse {
namespace {

StoragePool* g_pool = nullptr;

}  // namespace

StoragePool& TheStoragePool() {
  if (g_pool == nullptr) {
    // A module that creates sessions installs its pool when it loads.
    std::fprintf(stderr, "coarse_jax: no storage pool installed (SetStoragePool)\n");
    std::abort();
  }
  return *g_pool;
}

void SetStoragePool(StoragePool* pool) { g_pool = pool; }

std::unique_ptr<Storage> SpareSets::Take(int64_t key, const std::vector<int64_t>& ordinals) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = spare_.begin(); it != spare_.end(); ++it) {
    if (it->key != key || it->ordinals != ordinals) continue;
    std::unique_ptr<Storage> set = std::move(it->set);
    spare_.erase(it);
    return set;
  }
  return nullptr;
}

void SpareSets::Give(int64_t key, const std::vector<int64_t>& ordinals,
                     std::unique_ptr<Storage> set) {
  std::vector<std::unique_ptr<Storage>> evicted;  // freed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t bytes = set->bytes();
  spare_.push_front(Entry{key, ordinals, std::move(set), bytes});
  TrimLocked(&evicted);
}

void SpareSets::TrimLocked(std::vector<std::unique_ptr<Storage>>* evicted) {
  // Walk from the most recent: a set stays if its plan is among the first
  // `plans` distinct ones, fewer than kMaxSetsPerPlan of its plan are kept
  // already, and it fits in `bytes` or belongs to the most recent plan.
  using Id = std::pair<int64_t, std::vector<int64_t>>;  // plan key, ordinals
  std::map<Id, int64_t> kept;                           // sets kept per plan
  int64_t bytes = 0;
  const Id newest = spare_.empty() ? Id{} : Id{spare_.front().key, spare_.front().ordinals};
  for (auto it = spare_.begin(); it != spare_.end();) {
    const Id id{it->key, it->ordinals};
    auto found = kept.find(id);
    const int64_t same = found == kept.end() ? 0 : found->second;
    const bool keep = limits_.plans > 0 &&
                      (found != kept.end() || static_cast<int64_t>(kept.size()) < limits_.plans) &&
                      same < kMaxSetsPerPlan &&
                      (id == newest || bytes + it->bytes <= limits_.bytes);
    if (!keep) {
      evicted->push_back(std::move(it->set));
      it = spare_.erase(it);
      continue;
    }
    ++kept[id];
    bytes += it->bytes;
    ++it;
  }
}

void SpareSets::SetLimits(const SpareLimits& limits) {
  std::vector<std::unique_ptr<Storage>> evicted;
  std::lock_guard<std::mutex> lock(mu_);
  limits_ = limits;
  TrimLocked(&evicted);
}

SpareLimits SpareSets::limits() {
  std::lock_guard<std::mutex> lock(mu_);
  return limits_;
}

PoolStats SpareSets::Stats() {
  std::lock_guard<std::mutex> lock(mu_);
  PoolStats out;
  std::set<std::pair<int64_t, std::vector<int64_t>>> plans;
  for (const Entry& e : spare_) {
    out.bytes += e.bytes;
    ++out.sets;
    plans.insert(std::make_pair(e.key, e.ordinals));
  }
  out.plans = static_cast<int64_t>(plans.size());
  return out;
}

}  // namespace coarse
