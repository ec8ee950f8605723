// Where a session's f32 buffers live: the proxies' arenas (per-client slots,
// see Plan) and the workers' scratch for the leading layers.
//
// Storage is reused across steps of one plan (allocating hundreds of MB per
// step would cost more than the sync), so sessions take it from a pool and
// give it back when the last device leaves. Each extension module owns one
// pool and installs it when it loads: the CPU module host memory
// (cpu/cpu_storage.cc), the CUDA module GPU memory on the mesh's devices
// (cuda/cuda_storage.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/plan.h"

namespace coarse {

class Storage {
 public:
  virtual ~Storage() = default;
  virtual float* arena(int64_t proxy) = 0;     // plan.arena_nelems[proxy] floats
  virtual float* scratch(int64_t worker) = 0;  // plan.leading_nelems floats
};

class StoragePool {
 public:
  virtual ~StoragePool() = default;
  // `ordinals`: the platform's device number of every mesh device (worker i
  // at i, proxy k at p + k); empty where the platform does not need it.
  virtual std::unique_ptr<Storage> Take(const Plan& plan, const std::vector<int64_t>& ordinals) = 0;
  virtual void Give(const Plan& plan, const std::vector<int64_t>& ordinals,
                    std::unique_ptr<Storage> storage) = 0;
};

// This module's pool, which SetStoragePool installed (once, when the module
// loads, before any session exists).
StoragePool& TheStoragePool();
void SetStoragePool(StoragePool* pool);

}  // namespace coarse
