// coarse_jax._coarse_lab_cpu: the lab module, for tests/, benchmarks/ and tools/
// only (coarse_jax/_lab.py; no product code imports it). The self-tests: the
// whole sync protocol without XLA (sync_selftest, lab/sync_selftest.h) and the
// mailboxes under seeded delays (wakeup_selftest, lab/wakeup_selftest.h); the
// host optimizer's benchmark (HostOptimizerBench, lab/host_bench.h).
//
// It links the product module's libraries (coarse_cpu, coarse_handlers,
// coarse_runtime) but holds its own copy of their state: its sessions, storage
// pool, service threads and backend (chosen from COARSE_JAX_BACKEND when it
// loads, as _coarse_cpu chooses its own). The CUDA twin: lab/module_lab_cuda.cc.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "cpu/cpu_backend_choice.h"
#include "lab/cpu_selftest.h"
#include "lab/host_bench.h"
#include "lab/selftest_binding.h"
#include "lab/wakeup_selftest.h"
#include "runtime/session.h"

namespace nb = nanobind;

NB_MODULE(_coarse_lab_cpu, m) {
  m.doc() = "coarse_jax's CPU lab: self-tests and benchmarks of the runtime, for tests only.";
  // The backend as _coarse_cpu chooses it; a value not understood makes
  // backend() raise.
  static const std::string backend_error = coarse::LoadCpuBackend();
  m.def(
      "backend",
      []() {
        if (!backend_error.empty()) throw std::invalid_argument(backend_error);
        return std::string(coarse::CpuBackendName(coarse::ActiveCpuBackend()));
      },
      "The device backend this module's self-tests run on: 'cpu' or 'streams' "
      "(COARSE_JAX_BACKEND, read when the module loaded).");
  m.def("live_sessions", &coarse::LiveSessions,
        "Number of synchronization sessions this module's runtime holds right now.");
  m.def(
      "sync_selftest",
      [](coarse::SelfTestValues values, int64_t leading_elems, int64_t piece,
         const std::string& route, int64_t proxies, std::optional<coarse::SelfTestParams> params,
         float lr, float momentum, bool in_place) {
        return coarse::RunSyncSelfTest(values, leading_elems, piece, route, proxies, params, lr,
                                       momentum, in_place, coarse::CpuSelfTestPlatform());
      },
      COARSE_SELFTEST_ARGS, COARSE_SELFTEST_DOC " Runs on this module's backend (backend()).");
  nb::class_<coarse::HostOptimizerBench>(
      m, "HostOptimizerBench",
      "Benchmarks: the host optimizer and a STREAM triad over n f32 elements in page-aligned "
      "memory (ffi/lab/host_bench.h): 32 bytes per element per optimizer pass, 12 per triad.")
      .def(nb::init<int64_t>(), nb::arg("n"))
      .def("adam", &coarse::HostOptimizerBench::Adam, nb::arg("adamw"), nb::arg("vectorized"),
           nb::arg("parallel") = false,
           "One Adam (adamw: AdamW) pass; vectorized: the AVX2 loop where the CPU has it; "
           "parallel: on the bounded host pool, as a proxy runs it.")
      .def("triad", &coarse::HostOptimizerBench::Triad, "One pass of a[i] = b[i] + s * c[i].")
      .def("first_mismatch_with_scalar", &coarse::HostOptimizerBench::FirstMismatchWithScalar,
           nb::arg("adamw"), nb::arg("offset"), nb::arg("count"),
           "Testing: the AVX2 pass over [offset, offset + count) against the scalar pass, on "
           "copies of the state: the first element differing in any bit, or -1.")
      .def_prop_ro("n", &coarse::HostOptimizerBench::n);
  m.def(
      "wakeup_selftest",
      [](int64_t threads, int64_t rounds, uint64_t seed, int64_t timeout_ms, int64_t spin_ns) {
        coarse::WakeupSelfTestResult r;
        {
          nb::gil_scoped_release release;
          r = coarse::RunWakeupSelfTest(threads, rounds, seed, timeout_ms, spin_ns);
        }
        nb::dict d;
        d["waits"] = r.waits;
        d["lost"] = r.lost;
        d["max_wait_ms"] = r.max_wait_ms;
        return d;
      },
      nb::arg("threads"), nb::arg("rounds"), nb::arg("seed"), nb::arg("timeout_ms"),
      nb::arg("spin_ns"),
      "Testing: the mailboxes' stress test (lab/wakeup_selftest.h): `threads` threads meet "
      "at `rounds` barriers with seeded delays; returns waits, lost (waits that timed out) and "
      "max_wait_ms.");
}
