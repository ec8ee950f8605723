// GPU storage for one session: each buffer on the GPU of the mesh device it
// belongs to (arenas on proxies, scratch on workers), plus per-device staging
// for peer copies, span tables and scalars, and one event per device
// (Publish/Acquire): the StreamResources of runtime/stream_device.h. A proxy
// in host memory's arena and ready flags are pinned host memory instead (the
// arena on the NUMA node of the first worker it serves).
// Allocated with cudaMalloc on first use of a plan and then reused by later
// steps through the pool (cuda_storage.cc), so the hot path allocates nothing.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coarse_kernels.h"
#include "runtime/storage.h"
#include "runtime/stream.h"

namespace coarse::cuda {

// Pinned host pages on a NUMA node (cuda_storage.cc).
class PinnedPages;

class CudaStorage final : public Storage, public StreamResources {
 public:
  CudaStorage(const Plan& plan, const std::vector<int64_t>& ordinals);
  ~CudaStorage() override;

  float* arena(int64_t proxy) override { return arenas_[proxy]; }
  float* scratch(int64_t worker) override { return scratch_[worker]; }
  int64_t bytes() const override { return bytes_; }

  // Empty when every allocation succeeded; else what failed, for the error.
  const std::string& error() const { return error_; }
  int ordinal(int64_t device) const { return static_cast<int>(ordinals_[device]); }
  const std::vector<int64_t>& ordinals() const { return ordinals_; }
  // Per mesh device (StreamResources): f32 staging of staging_len() floats
  // (+ 4 for alignment shifts), a span table of max_runs() spans, scalars,
  // the device's event.
  float* staging(int64_t device) override { return staging_[device]; }
  int64_t staging_len() const override { return staging_len_; }
  kernels::Span* spans(int64_t device) override { return spans_[device]; }
  int64_t max_runs() const override { return max_runs_; }
  double* scalars(int64_t device) override { return scalars_[device]; }
  StreamEvent event(int64_t device) override { return events_[device]; }
  bool in_host_memory(int64_t device) const override {
    return device < static_cast<int64_t>(ordinals_.size()) && IsHostOrdinal(ordinals_[device]);
  }
  uint32_t* ready_flags(int64_t proxy) override { return flags_[proxy]; }
  bool shares_memory(int64_t a, int64_t b) const override {
    return a == b || (!in_host_memory(a) && !in_host_memory(b) && ordinals_[a] == ordinals_[b]);
  }
  std::atomic<uint64_t>& published(int64_t device) override { return published_[device]; }
  SpanTables& span_tables(int64_t device) override { return tables_[device]; }
  CopyMarks* copy_marks(int64_t device) override {
    return device < static_cast<int64_t>(marks_.size()) ? &marks_[device] : nullptr;
  }
  KeptDevice* kept_device(int64_t device) override {
    return device < static_cast<int64_t>(marks_.size()) ? &kept_[device] : nullptr;
  }

 private:
  void* Alloc(int64_t device, size_t bytes, const char* what);
  // An event on mesh device `device`'s GPU (null, and error_ set, on failure).
  cudaEvent_t NewEvent(int64_t device);
  void* HostAlloc(size_t bytes, const char* what);
  // Pinned pages on the NUMA node of the GPU with `ordinal` (a proxy's arena).
  void* PinnedAlloc(size_t bytes, int64_t ordinal, const char* what);
  void EnablePeerAccess();

  std::vector<int64_t> ordinals_;
  std::vector<float*> arenas_, scratch_, staging_;
  std::vector<kernels::Span*> spans_;
  std::vector<double*> scalars_;
  std::vector<cudaEvent_t> events_;  // per device; then per worker its CopyMarks' four
  std::vector<CopyMarks> marks_;     // per worker
  std::vector<std::pair<int, void*>> allocations_;      // (ordinal, pointer)
  std::vector<void*> host_allocations_;                 // cudaHostAlloc'd, registered
  std::vector<std::unique_ptr<PinnedPages>> pinned_;    // PinnedAlloc'd, registered
  std::vector<uint32_t*> flags_;                        // per proxy; null on a GPU
  std::unique_ptr<std::atomic<uint64_t>[]> published_;  // per mesh device
  std::unique_ptr<SpanTables[]> tables_;                // per mesh device
  int64_t staging_len_ = 0, max_runs_ = 0;
  int64_t bytes_ = 0;  // allocated, on all GPUs together
  std::string error_;
  // Per worker; last, so a kept device (its streams) goes before the rest.
  std::unique_ptr<KeptDevice[]> kept_;
};

// Installs the GPU pool as this module's storage pool (the CUDA module's
// initializer calls it once).
void InstallCudaStoragePool();

}  // namespace coarse::cuda
