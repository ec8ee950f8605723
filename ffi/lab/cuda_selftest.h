// The sync self-test (lab/sync_selftest.h) on one GPU: every worker and
// every proxy its own non-blocking stream there, so the members' events,
// staging buffers and peer-copy calls race as they would across GPUs. The
// mirror image of lab/cpu_selftest.h.
#pragma once

#include "lab/sync_selftest.h"

namespace coarse::cuda {

// Every mesh device of p workers and q proxies mapped to GPU `ordinal`.
SelfTestPlatform CudaSelfTestPlatform(int ordinal, int64_t workers, int64_t proxies);

}  // namespace coarse::cuda
