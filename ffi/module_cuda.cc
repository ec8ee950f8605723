// coarse_jax._coarse_cuda: the CUDA handlers and the kernel benchmark.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>

#include "cuda/kernel_bench.h"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;

namespace coarse::cuda {
XLA_FFI_DECLARE_HANDLER_SYMBOL(Pack);
XLA_FFI_DECLARE_HANDLER_SYMBOL(Unpack);
XLA_FFI_DECLARE_HANDLER_SYMBOL(Reduce);
}  // namespace coarse::cuda

template <typename T>
static nb::capsule Encapsulate(T* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

NB_MODULE(_coarse_cuda, m) {
  m.doc() = "coarse_jax CUDA runtime: XLA FFI handlers for the CUDA platform.";
  m.def("registrations", []() {
    nb::dict d;
    d["coarse_pack"] = Encapsulate(coarse::cuda::Pack);
    d["coarse_unpack"] = Encapsulate(coarse::cuda::Unpack);
    d["coarse_reduce"] = Encapsulate(coarse::cuda::Reduce);
    return d;
  }, "Target name -> FFI handler capsule, for jax.ffi.register_ffi_target(platform='CUDA').");
  m.def("bench_kernels", &coarse::cuda::BenchKernels, nb::arg("nelems"), nb::arg("dtype"),
        nb::arg("num_leaves"), nb::arg("iters"),
        "Median microseconds and bytes moved of copy/pack/unpack/reduce on the current GPU "
        "(CUDA events). See ffi/cuda/kernel_bench.h.");
}
