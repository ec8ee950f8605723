// coarse_jax._coarse_cuda: the CUDA handlers (registrations()), live_sessions,
// the memory limits and the Ctrl-C hook (xla/runtime_binding.h). The kernel
// benchmarks and the sync self-test are the lab module's
// (lab/module_lab_cuda.cc). The CPU twin: cpu/module_cpu.cc.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>

#include "cuda/cuda_storage.h"
#include "runtime/interrupt.h"
#include "runtime/session.h"
#include "xla/encapsulate.h"
#include "xla/ffi/api/ffi.h"
#include "xla/runtime_binding.h"

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
  m.def("live_sessions", &coarse::LiveSessions,
        "Number of synchronization sessions the CUDA runtime holds right now.");
  // No SIGINT hook here when the CPU module is loaded: extension.py hands
  // this module the CPU module's state (use_interrupt_state).
  coarse::DefineRuntimeFunctions(m);
}
