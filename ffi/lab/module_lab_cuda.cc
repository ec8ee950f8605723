// coarse_jax._coarse_lab_cuda: the CUDA lab module, for tests/, benchmarks/ and
// tools/ only (coarse_jax/_lab.py; no product code imports it): the kernels'
// and host copies' benchmarks (bench_kernels, bench_host_copy,
// lab/kernel_bench.h) and the sync self-test on one GPU (sync_selftest,
// lab/cuda_selftest.h). It links _coarse_cuda's libraries (coarse_cuda,
// coarse_handlers, coarse_runtime, coarse_kernels) but holds its own copy of
// their state: its sessions and storage pool. The CPU twin: lab/module_lab_cpu.cc.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>

#include "cuda/cuda_storage.h"
#include "lab/cuda_selftest.h"
#include "lab/kernel_bench.h"
#include "lab/selftest_binding.h"
#include "runtime/session.h"

namespace nb = nanobind;

NB_MODULE(_coarse_lab_cuda, m) {
  m.doc() = "coarse_jax's CUDA lab: kernel benchmarks and the sync self-test, for tests only.";
  // This module's sessions keep their storage on the GPU, as _coarse_cuda's do.
  coarse::cuda::InstallCudaStoragePool();
  m.def("bench_kernels", &coarse::cuda::BenchKernels, nb::arg("nelems"), nb::arg("dtype"),
        nb::arg("num_leaves"), nb::arg("iters"),
        "Median microseconds and bytes moved of copy/pack/unpack/reduce on the current GPU "
        "(CUDA events). See ffi/lab/kernel_bench.h.");
  m.def("bench_host_copy", &coarse::cuda::BenchHostCopy, nb::arg("bytes"), nb::arg("iters"),
        "Median microseconds of cudaMemcpyAsync between the current GPU and pinned host "
        "memory, each way (CUDA events). See ffi/lab/kernel_bench.h.");
  m.def(
      "sync_selftest",
      [](coarse::SelfTestValues values, int64_t leading_elems, int64_t piece,
         const std::string& route, int64_t proxies, std::optional<coarse::SelfTestParams> params,
         float lr, float momentum, bool in_place, int ordinal) {
        const int64_t workers = static_cast<int64_t>(values.shape(1));
        return coarse::RunSyncSelfTest(
            values, leading_elems, piece, route, proxies, params, lr, momentum, in_place,
            coarse::cuda::CudaSelfTestPlatform(ordinal, workers, proxies));
      },
      COARSE_SELFTEST_ARGS, nb::arg("ordinal") = 0,
      COARSE_SELFTEST_DOC " Every worker and proxy gets a stream of its own on GPU `ordinal`.");
  m.def("live_sessions", &coarse::LiveSessions,
        "Number of synchronization sessions this module's runtime holds right now.");
}
