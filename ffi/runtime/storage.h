// Where a session's f32 buffers live: the proxies' arenas (per-client slots,
// see Plan) and the workers' scratch for the leading layers.
//
// Storage is reused across steps of one plan (allocating hundreds of MB per
// step would cost more than the sync), so sessions take it from a pool and
// give it back when the last device leaves. Each extension module owns one
// pool and installs it when it loads: the CPU module host memory
// (cpu/cpu_storage.cc), the CUDA module GPU memory on the mesh's devices
// (cuda/cuda_storage.cc). Both keep their spare sets in a SpareSets, within
// limits (SpareLimits) that Python can change (coarse.diagnostics.set_memory_limits).
#pragma once

#include <cstdint>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/plan.h"

namespace coarse {

class SharedMemory;  // runtime/shared_memory.h

// A mesh device's ordinal (the "ordinals" attribute) is the platform's
// device number, except for a proxy in host memory
// (make_mesh(..., proxies_on="host")): it is no device, and proxy k's
// ordinal is -1 - k. Its storage is host memory on every platform.
inline bool IsHostOrdinal(int64_t ordinal) { return ordinal < 0; }
inline int64_t HostProxyOfOrdinal(int64_t ordinal) { return -1 - ordinal; }

class Storage {
 public:
  virtual ~Storage() = default;
  virtual float* arena(int64_t proxy) = 0;     // plan.arena_nelems[proxy] floats
  virtual float* scratch(int64_t worker) = 0;  // plan.leading_nelems floats
  virtual int64_t bytes() const = 0;           // what the set holds, all devices together
  // On a platform with device streams, a proxy in host memory's ready flags,
  // one per piece in its pinned memory: the proxy writes the session's
  // value (NextUse) once the piece is final there, the workers' streams wait
  // for it before they pull (Stream::WaitValue). Null where the pull waits
  // on the host instead (CPU, device proxies).
  virtual uint32_t* ready_flags(int64_t /*proxy*/) { return nullptr; }
  // The shared-memory strategy (runtime/shared_memory.h) where every
  // device's buffers of this set are this process's memory and host loops
  // may read them in place (the CPU platform's host storage); null, the
  // default, where the protocol must copy (device streams, GPUs).
  virtual SharedMemory* shared_memory() const { return nullptr; }
  // A new value for the flags, one per session that takes the set (from 1,
  // growing): the last session's value never satisfies the next one's wait.
  uint32_t NextUse() { return ++uses_; }
  // Testing (InjectStaleFlags): the previous session's value again, as a
  // set whose use count was not advanced would give.
  uint32_t SameUse() { return uses_ == 0 ? NextUse() : uses_; }

 private:
  uint32_t uses_ = 0;
};

// What a pool may keep between steps. Spare sets are kept most recently
// given first; a set is freed when it falls outside these limits:
//   plans: sets of at most this many distinct plans (0: keep none);
//   bytes: at most this many bytes in all, except that the sets of the most
//          recently used plan are always kept whatever their size (so that
//          a single plan larger than the limit still reuses its storage
//          every step), unless plans is 0.
// Besides, at most kMaxSetsPerPlan sets of one plan are kept.
//
// The defaults keep the last few plans a program alternates between (a train
// and an eval step, a loop's body, a re-plan) and free what a process that
// builds plan after plan (a sweep, a benchmark suite, a notebook) leaves
// behind: without limits, 200 distinct plans of 1 MiB per worker on 4
// workers held about 900 MB.
struct SpareLimits {
  int64_t bytes = int64_t{512} << 20;
  int64_t plans = 4;
};
inline constexpr int64_t kMaxSetsPerPlan = 2;

struct PoolStats {
  int64_t bytes = 0;  // held by spare sets
  int64_t sets = 0;   // spare sets
  int64_t plans = 0;  // distinct plans among them
};

// The spare sets of one pool: a list, most recently given first.
class SpareSets {
 public:
  // A spare set of (key, ordinals), or null.
  std::unique_ptr<Storage> Take(int64_t key, const std::vector<int64_t>& ordinals);
  // Keeps `set` and frees what falls outside the limits.
  void Give(int64_t key, const std::vector<int64_t>& ordinals, std::unique_ptr<Storage> set);
  void SetLimits(const SpareLimits& limits);
  SpareLimits limits();
  PoolStats Stats();

 private:
  struct Entry {
    int64_t key;
    std::vector<int64_t> ordinals;
    std::unique_ptr<Storage> set;
    int64_t bytes;
  };
  // Moves the sets outside the limits to `evicted` (freed by the caller once
  // the lock is released: cudaFree waits for the device).
  void TrimLocked(std::vector<std::unique_ptr<Storage>>* evicted);

  std::mutex mu_;
  SpareLimits limits_;
  std::list<Entry> spare_;
};

// Runtime-owned memory that outlives sessions: the proxy optimizer's master
// weights and state (runtime/param_store.h), on one mesh device.
class StateBuffer {
 public:
  virtual ~StateBuffer() = default;
  virtual float* data() = 0;
  virtual int64_t nelems() const = 0;
  // Host copies of [off, off + n), blocking (export / import between steps).
  virtual bool ToHost(float* dst, int64_t off, int64_t n) = 0;
  virtual bool FromHost(const float* src, int64_t off, int64_t n) = 0;
  // this[dst_off, +n) = src[src_off, +n), both on the same device, blocking.
  virtual bool CopyWithin(StateBuffer& src, int64_t src_off, int64_t dst_off, int64_t n) = 0;
};

// A StateBuffer in memory the host addresses directly (the CPU backend's
// mappings, a host proxy's pinned memory): its copies are memcpy.
class HostAddressedStateBuffer : public StateBuffer {
 public:
  bool ToHost(float* dst, int64_t off, int64_t n) override {
    std::memcpy(dst, data() + off, n * sizeof(float));
    return true;
  }
  bool FromHost(const float* src, int64_t off, int64_t n) override {
    std::memcpy(data() + off, src, n * sizeof(float));
    return true;
  }
  bool CopyWithin(StateBuffer& src, int64_t src_off, int64_t dst_off, int64_t n) override {
    std::memcpy(data() + dst_off, src.data() + src_off, n * sizeof(float));
    return true;
  }
};

class StoragePool {
 public:
  // `nelems` floats on mesh device `device` (ordinals as for Take); null if
  // the allocation failed.
  virtual std::unique_ptr<StateBuffer> NewStateBuffer(const std::vector<int64_t>& ordinals,
                                                      int64_t device, int64_t nelems) = 0;
  virtual ~StoragePool() = default;
  // `ordinals`: the platform's device number of every mesh device (worker i
  // at i, proxy k at p + k; IsHostOrdinal for a proxy in host memory);
  // empty where the platform does not need it.
  virtual std::unique_ptr<Storage> Take(const Plan& plan, const std::vector<int64_t>& ordinals) = 0;
  virtual void Give(const Plan& plan, const std::vector<int64_t>& ordinals,
                    std::unique_ptr<Storage> storage) = 0;
  // The pool's spare sets (SpareSets above).
  virtual SpareSets& spares() = 0;
};

// This module's pool, which SetStoragePool installed (once, when the module
// loads, before any session exists).
StoragePool& TheStoragePool();
void SetStoragePool(StoragePool* pool);

}  // namespace coarse
