// The sync self-test (lab/sync_selftest.h) on the CPU module's backend:
// the workers' and the proxies' devices as the handlers and the service make
// them (cpu_devices.h), plain or with stream semantics; host buffers. The
// mirror image of lab/cuda_selftest.h.
#pragma once

#include "lab/sync_selftest.h"

namespace coarse {

SelfTestPlatform CpuSelfTestPlatform();

}  // namespace coarse
