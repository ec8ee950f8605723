// coarse_jax._coarse_cuda: the CUDA handlers (registrations()), the kernel
// benchmark, the testing hooks (sync_selftest, live_sessions), the memory
// limits and the Ctrl-C hook (xla/runtime_binding.h). The CPU
// twin: cpu/module_cpu.cc.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>

#include "cuda/cuda_selftest.h"
#include "cuda/cuda_storage.h"
#include "cuda/kernel_bench.h"
#include "runtime/interrupt.h"
#include "runtime/session.h"
#include "xla/encapsulate.h"
#include "xla/ffi/api/ffi.h"
#include "xla/runtime_binding.h"
#include "xla/selftest_binding.h"

namespace nb = nanobind;

namespace coarse::cuda {
XLA_FFI_DECLARE_HANDLER_SYMBOL(Pack);
XLA_FFI_DECLARE_HANDLER_SYMBOL(Unpack);
XLA_FFI_DECLARE_HANDLER_SYMBOL(Reduce);
XLA_FFI_DECLARE_HANDLER_SYMBOL(Begin);
XLA_FFI_DECLARE_HANDLER_SYMBOL(Push);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ProxyRing);
XLA_FFI_DECLARE_HANDLER_SYMBOL(OptCount);
XLA_FFI_DECLARE_HANDLER_SYMBOL(WorkerRing);
XLA_FFI_DECLARE_HANDLER_SYMBOL(Pull);
}  // namespace coarse::cuda

NB_MODULE(_coarse_cuda, m) {
  m.doc() = "coarse_jax CUDA runtime: XLA FFI handlers for the CUDA platform.";
  // This module's sessions keep their storage on the mesh's GPUs.
  coarse::cuda::InstallCudaStoragePool();
  m.def(
      "registrations",
      []() {
        nb::dict d;
        d["coarse_pack"] = coarse::Encapsulate(coarse::cuda::Pack);
        d["coarse_unpack"] = coarse::Encapsulate(coarse::cuda::Unpack);
        d["coarse_reduce"] = coarse::Encapsulate(coarse::cuda::Reduce);
        d["coarse_begin"] = coarse::Encapsulate(coarse::cuda::Begin);
        d["coarse_push"] = coarse::Encapsulate(coarse::cuda::Push);
        d["coarse_proxy_ring"] = coarse::Encapsulate(coarse::cuda::ProxyRing);
        d["coarse_opt_count"] = coarse::Encapsulate(coarse::cuda::OptCount);
        d["coarse_worker_ring"] = coarse::Encapsulate(coarse::cuda::WorkerRing);
        d["coarse_pull"] = coarse::Encapsulate(coarse::cuda::Pull);
        return d;
      },
      "Target name -> FFI handler capsule, for jax.ffi.register_ffi_target(platform='CUDA').");
  m.def("bench_kernels", &coarse::cuda::BenchKernels, nb::arg("nelems"), nb::arg("dtype"),
        nb::arg("num_leaves"), nb::arg("iters"),
        "Median microseconds and bytes moved of copy/pack/unpack/reduce on the current GPU "
        "(CUDA events). See ffi/cuda/kernel_bench.h.");
  m.def("bench_host_copy", &coarse::cuda::BenchHostCopy, nb::arg("bytes"), nb::arg("iters"),
        "Median microseconds of cudaMemcpyAsync between the current GPU and pinned host "
        "memory, each way (CUDA events). See ffi/cuda/kernel_bench.h.");
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
        "Number of synchronization sessions the CUDA runtime holds right now.");
  // No SIGINT hook here when the CPU module is loaded: extension.py hands
  // this module the CPU module's state (use_interrupt_state).
  coarse::DefineRuntimeFunctions(m);
}
