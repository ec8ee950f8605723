// Sync self-test members on one GPU: each member its own non-blocking stream
// and buffers (see sync_selftest.h).
#pragma once

#include "runtime/sync_selftest.h"

namespace coarse::cuda {

// Members on GPU `ordinal`, every mesh device mapped to it.
MakeMember CudaSelfTestMembers(int ordinal);

}  // namespace coarse::cuda
