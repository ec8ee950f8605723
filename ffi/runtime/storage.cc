// This module's storage pool (see storage.h): installed once by the module's
// initializer, host memory on CPU (cpu/cpu_storage.cc), GPU memory on CUDA
// (cuda/cuda_storage.cc).
#include "runtime/storage.h"

#include <cstdio>
#include <cstdlib>

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

}  // namespace coarse
