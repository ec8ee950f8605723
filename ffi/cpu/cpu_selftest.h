// Sync self-test members on the CPU backend: host buffers and memcpy (see
// runtime/sync_selftest.h). The mirror image of cuda/cuda_selftest.h.
#pragma once

#include "runtime/sync_selftest.h"

namespace coarse {

// Members on the CPU backend (host memory, memcpy).
MakeMember CpuSelfTestMembers();

}  // namespace coarse
