// CUDA errors as runtime errors, the pinned, never-waiting host->device upload
// and the runtime's own streams (see cuda_util.h).
#include "cuda/cuda_util.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace coarse::cuda {

Status Check(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return Status::Success();
  return Status::Internal("coarse_jax: " + what + ": " + cudaGetErrorName(err) + " (" +
                          cudaGetErrorString(err) + ")");
}

namespace {

struct PinnedBlock {
  void* host = nullptr;
  size_t capacity = 0;
  cudaEvent_t done = nullptr;  // recorded after the last copy out of `host`
  bool in_flight = false;
};

// One list per device: an event can only be recorded on its own device's streams.
class PinnedBlocks {
 public:
  cudaError_t Upload(int device, void* dst, const void* src, size_t bytes, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& blocks = by_device_[device];
    PinnedBlock* free = nullptr;
    for (auto& b : blocks) {
      if (b->capacity < bytes) continue;
      if (b->in_flight) {
        const cudaError_t q = cudaEventQuery(b->done);
        if (q == cudaErrorNotReady) continue;
        if (q != cudaSuccess) return q;
        b->in_flight = false;
      }
      free = b.get();
      break;
    }
    if (free == nullptr) {  // all busy or too small: grow (freed at exit only)
      auto b = std::make_unique<PinnedBlock>();
      b->capacity = std::max<size_t>(bytes, 64 << 10);
      cudaError_t err = cudaHostAlloc(&b->host, b->capacity, cudaHostAllocPortable);
      if (err != cudaSuccess) return err;
      err = cudaEventCreateWithFlags(&b->done, cudaEventDisableTiming);
      if (err != cudaSuccess) return err;
      free = b.get();
      blocks.push_back(std::move(b));
    }
    std::memcpy(free->host, src, bytes);
    cudaError_t err = cudaMemcpyAsync(dst, free->host, bytes, cudaMemcpyHostToDevice, stream);
    if (err != cudaSuccess) return err;
    free->in_flight = true;
    return cudaEventRecord(free->done, stream);
  }

 private:
  std::mutex mu_;
  std::map<int, std::vector<std::unique_ptr<PinnedBlock>>> by_device_;
};

}  // namespace

cudaError_t UploadAsync(int device, void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  static PinnedBlocks* blocks = new PinnedBlocks;  // lives for the process
  return blocks->Upload(device, dst, src, bytes, stream);
}

StatusOr<cudaStream_t> OwnedStream(const std::string& key, const std::string& what) {
  static std::mutex mu;
  static auto* streams = new std::map<std::string, cudaStream_t>;  // never destroyed
  std::lock_guard<std::mutex> lock(mu);
  auto it = streams->find(key);
  if (it != streams->end()) return it->second;
  cudaStream_t stream = nullptr;
  Status e = Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "creating " + what);
  if (e.failure()) return e;
  (*streams)[key] = stream;
  return stream;
}

}  // namespace coarse::cuda
