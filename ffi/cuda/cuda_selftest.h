// Ring self-test members on one GPU: each member its own non-blocking stream
// (see ring_selftest.h).
#pragma once

#include "ring_selftest.h"

namespace coarse::cuda {

// Members on GPU `ordinal`, every mesh device mapped to it.
MakeMember CudaSelfTestMembers(int ordinal);

}  // namespace coarse::cuda
