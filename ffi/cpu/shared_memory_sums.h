// The CPU platform's shared-memory strategy (runtime/shared_memory.h): its
// host storage is this process's memory, so the sums read every device's
// buffers (peers' arenas, the workers' pushed leaves) in place, in host loops.
#pragma once

#include "runtime/shared_memory.h"

namespace coarse {

class HostSharedMemory final : public SharedMemory {
 public:
  Status SumInRingOrder(float* dst, const float* const* srcs, int64_t num, int64_t n,
                        float scale) override;
  Status SumPushesInRingOrder(float* dst, int64_t lo, int64_t hi,
                              const std::vector<std::vector<const PushedRuns*>>& groups,
                              float scale) override;
};

// The one instance (stateless), which the host storage offers its sessions.
SharedMemory& TheHostSharedMemory();

}  // namespace coarse
