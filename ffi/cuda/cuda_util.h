// What every CUDA handler needs besides the kernels: CUDA errors as runtime
// errors (runtime/status.h) and a host->device upload that
// never waits for the GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "coarse_kernels.h"
#include "runtime/status.h"
#include "runtime/stream.h"

namespace coarse::cuda {

// Success, or an Internal error "coarse_jax: <what>: <CUDA's message>".
Status Check(cudaError_t err, const std::string& what);

// Copies `bytes` from host `src` to device `dst` in stream order, through
// pinned host blocks that are reused once the copy that last used them has
// completed (checked with cudaEventQuery, never waited for), so neither the
// caller nor a later upload blocks on the GPU and `src` may die on return.
// `device` is the ordinal `stream` belongs to.
cudaError_t UploadAsync(int device, void* dst, const void* src, size_t bytes, cudaStream_t stream);

// A non-blocking stream the runtime owns, one per `key`, on the current GPU:
// created on first use and never destroyed (a job may still hold it while
// the process exits). `what` names it in the error if creating it fails.
StatusOr<cudaStream_t> OwnedStream(const std::string& key, const std::string& what);

}  // namespace coarse::cuda
