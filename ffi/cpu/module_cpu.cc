// coarse_jax._coarse_cpu: the CPU handlers (registrations()) and the testing
// hooks (inject_dropped_push, live_sessions, take_virtual_spans, the NUMA
// helpers: numa_*, canonical_pci_bus_id), the memory limits and the Ctrl-C
// hook (xla/runtime_binding.h). The self-tests and benchmarks are the lab
// module's (lab/module_lab_cpu.cc). The CUDA twin: cuda/module_cuda.cc.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <unistd.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "cpu/cpu_backend_choice.h"
#include "cpu/host_stream_check.h"
#include "host/host_pool.h"
#include "runtime/faults.h"
#include "runtime/hand_out.h"
#include "runtime/interrupt.h"
#include "runtime/numa.h"
#include "runtime/session.h"
#include "runtime/traffic.h"
#include "xla/encapsulate.h"
#include "xla/ffi/api/ffi.h"
#include "xla/runtime_binding.h"

namespace nb = nanobind;

namespace coarse {
XLA_FFI_DECLARE_HANDLER_SYMBOL(Begin);
XLA_FFI_DECLARE_HANDLER_SYMBOL(Push);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ProxyRing);
XLA_FFI_DECLARE_HANDLER_SYMBOL(WorkerRing);
XLA_FFI_DECLARE_HANDLER_SYMBOL(Pull);
XLA_FFI_DECLARE_HANDLER_SYMBOL(Probe);
XLA_FFI_DECLARE_HANDLER_SYMBOL(OptCount);
XLA_FFI_DECLARE_HANDLER_SYMBOL(Pack);
XLA_FFI_DECLARE_HANDLER_SYMBOL(Unpack);
XLA_FFI_DECLARE_HANDLER_SYMBOL(Reduce);
XLA_FFI_DECLARE_HANDLER_SYMBOL(HostGather);  // xla/host_gather.cc
XLA_FFI_DECLARE_HANDLER_SYMBOL(RouteJoin);   // cpu/route_split.cc
XLA_FFI_DECLARE_HANDLER_SYMBOL(RouteSplit);  // cpu/route_split.cc
}  // namespace coarse

NB_MODULE(_coarse_cpu, m) {
  m.doc() =
      "coarse_jax CPU runtime: XLA FFI handlers for begin, push, proxy ring, worker ring, pull, "
      "probe, pack, unpack, reduce.";
  // The device backend, chosen once from COARSE_JAX_BACKEND; this module's
  // sessions keep their storage in host memory. A value not understood
  // makes backend() raise the error (the variable, the value, the choices),
  // which coarse_jax's import calls.
  static const std::string backend_error = coarse::LoadCpuBackend();
  // Ctrl-C reaches a step waiting in the runtime (runtime/interrupt.h).
  coarse::ArmInterruptHook();
  m.def(
      "registrations",
      []() {
        nb::dict d;
        d["coarse_begin"] = coarse::Encapsulate(coarse::Begin);
        d["coarse_push"] = coarse::Encapsulate(coarse::Push);
        d["coarse_proxy_ring"] = coarse::Encapsulate(coarse::ProxyRing);
        d["coarse_worker_ring"] = coarse::Encapsulate(coarse::WorkerRing);
        d["coarse_pull"] = coarse::Encapsulate(coarse::Pull);
        d["coarse_probe"] = coarse::Encapsulate(coarse::Probe);
        d["coarse_opt_count"] = coarse::Encapsulate(coarse::OptCount);
        d["coarse_pack"] = coarse::Encapsulate(coarse::Pack);
        d["coarse_unpack"] = coarse::Encapsulate(coarse::Unpack);
        d["coarse_reduce"] = coarse::Encapsulate(coarse::Reduce);
        d["coarse_host_gather"] = coarse::Encapsulate(coarse::HostGather);
        d["coarse_route_join"] = coarse::Encapsulate(coarse::RouteJoin);
        d["coarse_route_split"] = coarse::Encapsulate(coarse::RouteSplit);
        return d;
      },
      "Target name -> FFI handler capsule, for jax.ffi.register_ffi_target.");
  m.def(
      "backend",
      []() {
        if (!backend_error.empty()) throw std::invalid_argument(backend_error);
        // A chaos seed only acts on the streams backend: say so once rather
        // than let a run believe it was adversarially scheduled.
        static bool warned = false;
        if (!warned && coarse::ActiveCpuBackend() == coarse::CpuBackend::kCpu &&
            coarse::StreamChaosSeed().has_value()) {
          warned = true;
          const std::string msg =
              "coarse_jax: COARSE_JAX_STREAM_CHAOS=" + std::to_string(*coarse::StreamChaosSeed()) +
              " is ignored: its random delays act on the stream-semantics backend only, and "
              "COARSE_JAX_BACKEND is 'cpu' (or unset). Set COARSE_JAX_BACKEND=streams to use "
              "it, or unset COARSE_JAX_STREAM_CHAOS.";
          if (PyErr_WarnEx(PyExc_UserWarning, msg.c_str(), 1) < 0) throw nb::python_error();
        }
        return std::string(coarse::CpuBackendName(coarse::ActiveCpuBackend()));
      },
      "The device backend the sessions run on: 'cpu' or 'streams' (COARSE_JAX_BACKEND, read "
      "when the module loaded). ValueError if the variable's value was not understood; the "
      "first call warns (UserWarning) if COARSE_JAX_STREAM_CHAOS is set while the backend is "
      "'cpu', where it has no effect.");
  m.def("live_hand_outs", &coarse::LiveHandOuts,
        "Testing: in-host hand-outs of the inter-host step open now (runtime/hand_out.h).");
  m.def("inject_dropped_push", &coarse::InjectDroppedPush, nb::arg("worker"),
        "Testing: the next session created loses the first push of `worker` (its proxy must "
        "time out, not hang); that session consumes the hook even if its mesh has no such "
        "worker.");
  m.def("set_faults", &coarse::SetFaults, nb::arg("mask"),
        "Testing: the deliberate faults active from now on (a mask: 1, a notify per piece; 2, "
        "a host synchronization per range of the global norm; runtime/faults.h); returns "
        "the previous mask.");
  m.def("inject_stale_flags", &coarse::InjectStaleFlags,
        "Testing: the next session created reuses its storage set's previous ready value "
        "(a stale counter); a proxy in host memory with device streams refuses it.");
  m.def(
      "check_flag_wait",
      [](int64_t timeout_ms, int64_t delay_ms, bool write) {
        const coarse::FlagWaitResult r = coarse::CheckFlagWait(timeout_ms, delay_ms, write);
        return std::make_pair(r.error, r.copied);
      },
      nb::arg("timeout_ms"), nb::arg("delay_ms"), nb::arg("write"),
      "Testing: a host stream waits for a host-written flag (Stream::WaitValue) before an "
      "upload from pinned memory; returns (the stream's error or '', the value the upload "
      "copied: 42 if it ran after the host's write). ffi/cpu/host_stream_check.h.");
  coarse::DefineRuntimeFunctions(m);
  m.def("host_threads", &coarse::cpu::HostThreads,
        "The threads a proxy's optimizer may use on the host, its own included "
        "(min(hardware threads, COARSE_JAX_HOST_THREADS or 8)).");
  m.def(
      "traffic",
      [] {
        nb::dict out;
        const std::vector<coarse::TrafficCount> counts = coarse::Traffic();
        for (size_t i = 0; i < counts.size(); ++i)
          out[coarse::TrafficOpName(static_cast<coarse::TrafficOp>(i))] =
              nb::make_tuple(counts[i].read, counts[i].written);
        return out;
      },
      "Bytes (read, written) by the CPU backend's device operations, per kind of operation, "
      "since the process started, over every session (ffi/runtime/traffic.h): take the "
      "difference around a sync.");
  m.def("numa_node_of_pci_bus", &coarse::numa::NumaNodeOfPciBus, nb::arg("pci_bus_id"),
        nb::arg("sysfs_root") = "/sys",
        "Testing: the NUMA node sysfs gives the PCI device, or -1 (ffi/runtime/numa.h).");
  m.def("numa_node_count", &coarse::numa::NumaNodeCount, nb::arg("sysfs_root") = "/sys",
        "Testing: the NUMA nodes sysfs lists, at least 1 (ffi/runtime/numa.h).");
  m.def("canonical_pci_bus_id", &coarse::numa::CanonicalPciBusId, nb::arg("pci_bus_id"),
        "Testing: a PCI bus id as sysfs names it ('0000:3b:00.0'), or ''.");
  m.def(
      "numa_allocate_check",
      [](int64_t bytes, int node, std::optional<int> node_count) {
        // What a proxy's storage gets from numa::Allocate, checked here where
        // the memory is (Python sees no pointer): page-aligned, zeroed,
        // writable over every byte.
        coarse::numa::HostPages pages =
            node_count
                ? coarse::numa::AllocateOnNodes(static_cast<size_t>(bytes), node, *node_count)
                : coarse::numa::Allocate(static_cast<size_t>(bytes), node);
        nb::dict out;
        auto* mem = static_cast<unsigned char*>(pages.data());
        out["allocated"] = mem != nullptr;
        if (mem == nullptr) return out;
        const size_t n = pages.bytes();
        bool zeroed = true, writable = true;
        for (size_t i = 0; i < n; ++i) zeroed = zeroed && mem[i] == 0;
        for (size_t i = 0; i < n; ++i) mem[i] = static_cast<unsigned char>(i * 7 + 1);
        for (size_t i = 0; i < n; ++i)
          writable = writable && mem[i] == static_cast<unsigned char>(i * 7 + 1);
        out["page_aligned"] = reinterpret_cast<uintptr_t>(mem) % sysconf(_SC_PAGESIZE) == 0;
        out["zeroed"] = zeroed;
        out["writable"] = writable;
        out["bytes"] = static_cast<int64_t>(n);
        out["node"] = pages.requested_node();
        out["bound"] = pages.bound();
        out["why_not_bound"] = pages.why_not_bound();
        out["describe"] = pages.Describe();
        return out;
      },
      nb::arg("bytes"), nb::arg("node"), nb::arg("node_count") = nb::none(),
      "Testing: allocates host pages as a proxy's storage (numa::Allocate; with node_count, as "
      "on a machine with that many nodes) and reports how they came out.");
  m.def("live_sessions", &coarse::LiveSessions,
        "Number of synchronization sessions the runtime holds right now.");
  m.def("take_virtual_spans", &coarse::TakeVirtualSpans,
        "Simulated seconds of each finished sync on a virtual-clock Topology, in completion "
        "order, since the last call (which forgets them).");
}
