// coarse_jax._coarse_cuda: the CUDA handlers and the kernel benchmark.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>

#include "cuda/cuda_selftest.h"
#include "cuda/cuda_storage.h"
#include "cuda/kernel_bench.h"
#include "runtime/session.h"
#include "selftest_binding.h"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;

namespace coarse::cuda {
XLA_FFI_DECLARE_HANDLER_SYMBOL(Pack);
XLA_FFI_DECLARE_HANDLER_SYMBOL(Unpack);
XLA_FFI_DECLARE_HANDLER_SYMBOL(Reduce);
XLA_FFI_DECLARE_HANDLER_SYMBOL(Push);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ProxyRing);
XLA_FFI_DECLARE_HANDLER_SYMBOL(WorkerRing);
XLA_FFI_DECLARE_HANDLER_SYMBOL(Pull);
}  // namespace coarse::cuda

template <typename T>
static nb::capsule Encapsulate(T* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

NB_MODULE(_coarse_cuda, m) {
  m.doc() = "coarse_jax CUDA runtime: XLA FFI handlers for the CUDA platform.";
  // This module's sessions keep their storage on the mesh's GPUs.
  coarse::cuda::InstallCudaStoragePool();
  m.def("registrations", []() {
    nb::dict d;
    d["coarse_pack"] = Encapsulate(coarse::cuda::Pack);
    d["coarse_unpack"] = Encapsulate(coarse::cuda::Unpack);
    d["coarse_reduce"] = Encapsulate(coarse::cuda::Reduce);
    d["coarse_push"] = Encapsulate(coarse::cuda::Push);
    d["coarse_proxy_ring"] = Encapsulate(coarse::cuda::ProxyRing);
    d["coarse_worker_ring"] = Encapsulate(coarse::cuda::WorkerRing);
    d["coarse_pull"] = Encapsulate(coarse::cuda::Pull);
    return d;
  }, "Target name -> FFI handler capsule, for jax.ffi.register_ffi_target(platform='CUDA').");
  m.def("bench_kernels", &coarse::cuda::BenchKernels, nb::arg("nelems"), nb::arg("dtype"),
        nb::arg("num_leaves"), nb::arg("iters"),
        "Median microseconds and bytes moved of copy/pack/unpack/reduce on the current GPU "
        "(CUDA events). See ffi/cuda/kernel_bench.h.");
  m.def(
      "ring_selftest",
      [](nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu> values,
         int64_t steps, int ordinal) {
        const std::vector<int64_t> ordinals(2 * values.shape(0), ordinal);
        return coarse::RunRingSelfTest(values, steps, ordinals,
                                       coarse::cuda::CudaSelfTestMembers(ordinal));
      },
      nb::arg("values"), nb::arg("steps"), nb::arg("ordinal") = 0,
      "Testing: the workers' ring all-reduce (mean) of values[p, n], every member on its own "
      "stream of GPU `ordinal`, for `steps` sessions; returns [steps, p, n]. See "
      "ffi/ring_selftest.h.");
  m.def("live_sessions", &coarse::LiveSessions,
        "Number of synchronization sessions the CUDA runtime holds right now.");
}
