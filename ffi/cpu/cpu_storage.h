// Host memory for the sessions of the CPU module (cpu_storage.cc): the
// mirror image of cuda/cuda_storage.h.
#pragma once

namespace coarse {

// Installs the host pool as this module's storage pool (the CPU module's
// initializer calls it once, through LoadCpuBackend). `streams`: the sets also hold what a
// StreamDevice needs (runtime/stream.h: per device staging, a span table,
// scalars, an event), and freeing a set or a state buffer first waits for
// every host stream (as cudaFree waits for the GPU).
void InstallHostStoragePool(bool streams = false);

}  // namespace coarse
