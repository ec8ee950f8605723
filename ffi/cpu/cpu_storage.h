// Host memory for the sessions of the CPU module (cpu_storage.cc): the
// mirror image of cuda/cuda_storage.h.
#pragma once

namespace coarse {

// Installs the host pool as this module's storage pool (the CPU module's
// initializer calls it once).
void InstallHostStoragePool();

}  // namespace coarse
