// coarse_jax._coarse_cpu: the CPU handlers and two testing hooks.
#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include "runtime/session.h"
#include "selftest_binding.h"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;

namespace coarse {
XLA_FFI_DECLARE_HANDLER_SYMBOL(Push);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ProxyRing);
XLA_FFI_DECLARE_HANDLER_SYMBOL(WorkerRing);
XLA_FFI_DECLARE_HANDLER_SYMBOL(Pull);
XLA_FFI_DECLARE_HANDLER_SYMBOL(Probe);
XLA_FFI_DECLARE_HANDLER_SYMBOL(Pack);
XLA_FFI_DECLARE_HANDLER_SYMBOL(Unpack);
XLA_FFI_DECLARE_HANDLER_SYMBOL(Reduce);
}  // namespace coarse

template <typename T>
static nb::capsule Encapsulate(T* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

NB_MODULE(_coarse_cpu, m) {
  m.doc() = "coarse_jax CPU runtime: XLA FFI handlers for push, proxy ring, worker ring, pull, probe, pack, unpack, reduce.";
  m.def("registrations", []() {
    nb::dict d;
    d["coarse_push"] = Encapsulate(coarse::Push);
    d["coarse_proxy_ring"] = Encapsulate(coarse::ProxyRing);
    d["coarse_worker_ring"] = Encapsulate(coarse::WorkerRing);
    d["coarse_pull"] = Encapsulate(coarse::Pull);
    d["coarse_probe"] = Encapsulate(coarse::Probe);
    d["coarse_pack"] = Encapsulate(coarse::Pack);
    d["coarse_unpack"] = Encapsulate(coarse::Unpack);
    d["coarse_reduce"] = Encapsulate(coarse::Reduce);
    return d;
  }, "Target name -> FFI handler capsule, for jax.ffi.register_ffi_target.");
  m.def("inject_dropped_push", &coarse::InjectDroppedPush, nb::arg("worker"),
        "Testing: the next push of `worker` is lost (its proxy must time out, not hang).");
  m.def(
      "sync_selftest",
      [](coarse::SelfTestValues values, int64_t leading_elems, int64_t piece,
         const std::string& route, int64_t steps) {
        return coarse::RunSyncSelfTest(values, leading_elems, piece, route, steps,
                                       {}, coarse::CpuSelfTestMembers());
      },
      nb::arg("values"), nb::arg("leading_elems"), nb::arg("piece"), nb::arg("route"),
      nb::arg("steps"), COARSE_SELFTEST_DOC);
  m.def("live_sessions", &coarse::LiveSessions,
        "Number of synchronization sessions the runtime holds right now.");
  m.def("take_virtual_spans", &coarse::TakeVirtualSpans,
        "Simulated seconds of each finished sync on a virtual-clock Topology, in completion "
        "order, since the last call (which forgets them).");
}
