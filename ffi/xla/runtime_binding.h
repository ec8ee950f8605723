// The nanobind functions both modules define over their own runtime state:
// memory limits and statistics (set_memory_limits, memory_stats) and the
// Ctrl-C hook (arm_interrupt_hook, interrupt_state, use_interrupt_state);
// and the layouts the runtime derives from a plan (plan_layout, host_plan_key).
// coarse_jax/_ffi/extension.py wraps them (coarse.diagnostics.set_memory_limits,
// coarse.diagnostics.runtime_stats).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "runtime/interrupt.h"
#include "runtime/mailbox.h"
#include "runtime/param_store.h"
#include "runtime/ring_groups.h"
#include "runtime/service.h"
#include "runtime/session.h"
#include "runtime/storage.h"
#include "runtime/stream_ops.h"
#include "runtime/trace.h"
#include "runtime/wakeups.h"
#include "xla/plan_attrs.h"

namespace coarse {
namespace ffi = xla::ffi;

inline nanobind::dict MemoryLimitsDict() {
  nanobind::dict d;
  const SpareLimits spare = TheStoragePool().spares().limits();
  d["spare_storage_bytes"] = spare.bytes;
  d["spare_plans"] = spare.plans;
  d["cached_plans"] = PlanCacheLimit();
  return d;
}

// Python's acknowledgement that it handled a SIGINT (runtime/interrupt.h): a
// pending call, which CPython runs on its main thread only after the pending
// signals (so after the KeyboardInterrupt that the default handler raises).
// It checks the signals itself first, so that a flag the interpreter loop has
// not looked at yet raises its KeyboardInterrupt here (returning -1 with it
// set, as a pending call reports an exception) before the step is abandoned.
inline int AcknowledgeInterruptFromPython(void* count) {
  const int raised = PyErr_CheckSignals();
  AcknowledgeInterrupt(static_cast<int64_t>(reinterpret_cast<intptr_t>(count)));
  return raised;
}

// The AckRequester: asks for that pending call (no GIL needed). False while
// Python is not running (before initialization, or finalizing past its exit
// hooks) or its queue of pending calls is full; the runtime then asks again,
// and lets the SIGINT take effect after kInterruptGrace regardless.
inline bool RequestInterruptAcknowledgement(int64_t count) {
  if (!Py_IsInitialized()) return false;
  return Py_AddPendingCall(&AcknowledgeInterruptFromPython,
                           reinterpret_cast<void*>(static_cast<intptr_t>(count))) == 0;
}

inline void DefineRuntimeFunctions(nanobind::module_& m) {
  SetInterruptAckRequester(&RequestInterruptAcknowledgement);
  namespace nb = nanobind;
  m.def(
      "set_memory_limits",
      [](std::optional<int64_t> spare_storage_bytes, std::optional<int64_t> spare_plans,
         std::optional<int64_t> cached_plans) {
        for (auto [name, v] : {std::make_pair("spare_storage_bytes", spare_storage_bytes),
                               std::make_pair("spare_plans", spare_plans),
                               std::make_pair("cached_plans", cached_plans)})
          if (v.has_value() && *v < 0)
            throw std::invalid_argument(std::string(name) + " must be >= 0, got " +
                                        std::to_string(*v));
        SpareLimits spare = TheStoragePool().spares().limits();
        if (spare_storage_bytes) spare.bytes = *spare_storage_bytes;
        if (spare_plans) spare.plans = *spare_plans;
        TheStoragePool().spares().SetLimits(spare);
        if (cached_plans) SetPlanCacheLimit(*cached_plans);
        return MemoryLimitsDict();
      },
      nb::arg("spare_storage_bytes").none() = nb::none(),
      nb::arg("spare_plans").none() = nb::none(), nb::arg("cached_plans").none() = nb::none(),
      "Sets this module's memory limits (None: unchanged); returns those in force. See "
      "coarse_jax.set_memory_limits.");
  m.def(
      "memory_stats",
      []() {
        nb::dict d;
        const PoolStats pool = TheStoragePool().spares().Stats();
        const RegistryStats reg = TheRegistryStats();
        d["spare_storage_bytes"] = pool.bytes;
        d["spare_sets"] = pool.sets;
        d["spare_plans"] = pool.plans;
        d["cached_plans"] = CachedPlans();
        d["live_sessions"] = reg.live_sessions;
        d["runs_remembered"] = reg.runs_remembered;
        d["step_counters"] = reg.step_counters;
        return d;
      },
      "What this module's runtime holds now. See coarse_jax.memory_stats.");
  m.def(
      "arm_interrupt_hook",
      [](bool aborts) {
        SetInterruptAborts(aborts);
        return ArmInterruptHook();
      },
      nb::arg("aborts") = true,
      "(Re)installs the SIGINT hook that lets Ctrl-C stop a step waiting in the runtime "
      "(ffi/runtime/interrupt.h), chained to the current handler; `aborts`: whether an "
      "interrupt abandons a waiting step. Returns whether the hook is installed.");
  // The proxy optimizer's stores (runtime/param_store.h), for
  // coarse_jax/api/update.py: export / load between steps, reset, forget.
  auto state_tuple = [](const HostState& h) -> nb::object {
    nb::list values;
    for (const auto& slot : h.values) {
      nb::list leaves;
      for (const auto& v : slot)
        leaves.append(nb::bytes(reinterpret_cast<const char*>(v.data()), v.size() * 4));
      values.append(leaves);
    }
    return nb::make_tuple(h.count, h.leaves, values);
  };
  m.def(
      "store_export",
      [state_tuple](int64_t id, bool snapshot, bool for_writer) -> nb::object {
        auto store = FindParamStore(id);
        if (!store) return nb::none();
        auto state = snapshot ? store->ExportSnapshot(for_writer) : store->Export();
        if (state.has_error()) throw std::runtime_error(state.error().message());
        if (!state.value().has_value()) return nb::none();
        return state_tuple(*state.value());
      },
      nb::arg("store"), nb::arg("snapshot") = false, nb::arg("for_writer") = false,
      "(count, plan leaf ids, [slot][leaf] f32 bytes) of a store's committed state (slot 0 the "
      "master), or of its newest complete snapshot; None if it holds none. for_writer: the "
      "snapshot writer takes the snapshot (see store_attach_writer).");
  m.def(
      "store_attach_writer",
      // Creates the store if no update has yet (the step's first call runs
      // asynchronously, and may not have reached its update when the writer
      // attaches): the update that creates it otherwise would find no writer,
      // and copy over a snapshot the writer has not taken.
      [](int64_t id, const std::string& name) { GetParamStore(id, name)->AttachWriter(); },
      nb::arg("store"), nb::arg("name"),
      "A writer takes the store's snapshots: an update defers a due snapshot rather than copy "
      "over one the writer has not taken (store_export(for_writer=True)). Creates the store "
      "(empty, named `name`) if no update has yet.");
  m.def(
      "store_snapshot_now",
      [](int64_t id) {
        auto store = FindParamStore(id);
        if (!store) throw std::runtime_error("coarse_jax: no such optimizer store");
        Status e = store->SnapshotNow();
        if (e.failure()) throw std::runtime_error(e.message());
        return store->snapshot_count();
      },
      nb::arg("store"),
      "Snapshots a store's committed state now (between steps); returns its step count.");
  m.def(
      "store_snapshot_serial",
      [](int64_t id) -> int64_t {
        auto store = FindParamStore(id);
        return store ? store->snapshot_serial() : 0;
      },
      nb::arg("store"), "How many snapshots completed (0: none valid now).");
  m.def(
      "store_snapshot_due",
      [](int64_t id) -> bool {
        auto store = FindParamStore(id);
        return store && store->snapshot_due();
      },
      nb::arg("store"), "Whether the store's next update takes a snapshot (between steps).");
  m.def(
      "store_load",
      [](int64_t id, const std::string& name, int64_t count, std::vector<int64_t> leaves,
         std::vector<std::vector<nb::bytes>> values) {
        HostState h;
        h.count = count;
        h.slots = static_cast<int32_t>(values.size()) - 1;
        h.leaves = std::move(leaves);
        for (const auto& slot : values) {
          std::vector<std::vector<float>> vs;
          for (const auto& b : slot) {
            const float* f = reinterpret_cast<const float*>(b.c_str());
            vs.emplace_back(f, f + b.size() / 4);
          }
          h.values.push_back(std::move(vs));
        }
        GetParamStore(id, name)->Load(std::move(h));
      },
      nb::arg("store"), nb::arg("name"), nb::arg("count"), nb::arg("leaves"), nb::arg("values"),
      "Makes the next update of a store start from this state (see store_export).");
  m.def(
      "store_reset",
      [](int64_t id) {
        if (auto store = FindParamStore(id)) store->Reset();
      },
      nb::arg("store"), "The next update of the store seeds it from the params it gets.");
  m.def("store_drop", &DropParamStore, nb::arg("store"), "Frees a store.");
  m.def(
      "store_bytes",
      [](int64_t id) {
        auto store = FindParamStore(id);
        return store ? store->ProxyBytes() : std::vector<int64_t>{};
      },
      nb::arg("store"), "Bytes of a store on each proxy (both buffers).");
  m.def(
      "take_trace",
      []() {
        nb::list out;
        for (const TraceEvent& e : TakeTrace())
          out.append(nb::make_tuple(e.device, e.workers, e.name, e.piece, e.bytes, e.step, e.site,
                                    e.iteration, e.begin_ns, e.end_ns));
        return out;
      },
      "The timeline spans recorded since the last call (Config(trace=True)): tuples (device, "
      "workers, name, piece, bytes, step, site, iteration, begin_ns, end_ns); forgets them.");
  // What the runtime derives from a plan (FinishPlan, ExchangeRanges,
  // OwnedRanges, StateFloats, HostPlanKey), for coarse_jax/_ffi/layout.py:
  // Python reads these sizes and keys here instead of computing them again.
  m.def("host_plan_key", &HostPlanKey, nb::arg("plan_key"),
        "The 32-bit plan key the hosts of a mesh compare (coarse_proxy_ring's keys operand).");
  m.def(
      "plan_layout",
      [](int64_t workers, int64_t proxies, std::vector<int64_t> piece_nelems,
         std::vector<int64_t> piece_dest, std::vector<int64_t> segments,
         std::optional<std::vector<int64_t>> leaf_flags, int64_t opt_kind, double momentum,
         bool delayed) {
        const int64_t p = workers, q = proxies, S = static_cast<int64_t>(piece_nelems.size());
        auto bad = [](const std::string& what) { throw std::invalid_argument(what); };
        if (p < 1 || q < 1 || p % q != 0)
          bad("plan_layout: workers must be >= 1 and divisible by proxies >= 1");
        if (static_cast<int64_t>(piece_dest.size()) != S * p)
          bad("plan_layout: piece_dest must hold pieces x workers entries");
        if (segments.size() % 5 != 0) bad("plan_layout: segments must be 5-tuples");
        Plan plan;
        plan.workers = p;
        plan.proxies = q;
        plan.piece_nelems = piece_nelems;
        for (int64_t d : piece_dest) {
          if (d < 0 || d >= q) bad("plan_layout: piece_dest names a proxy outside [0, q)");
          plan.piece_dest.push_back(static_cast<int32_t>(d));
        }
        // As ffi/xla/plan_attrs.cc lays them out: sorted by piece, each piece's first.
        plan.piece_seg_begin.assign(S + 1, 0);
        for (size_t g = 0; g < segments.size() / 5; ++g) {
          const int64_t* v = &segments[5 * g];
          if (v[3] < 0 || v[3] >= S || (g > 0 && v[3] < plan.segments.back().piece))
            bad("plan_layout: segments must name pieces in [0, S), sorted");
          plan.segments.push_back(Segment{v[0], v[1], v[2], v[3], v[4]});
          plan.piece_seg_begin[v[3] + 1] = static_cast<int64_t>(g) + 1;
        }
        for (int64_t s = 1; s <= S; ++s)
          plan.piece_seg_begin[s] = std::max(plan.piece_seg_begin[s], plan.piece_seg_begin[s - 1]);
        for (int64_t s = 0; s < S; ++s)
          if (plan.piece_seg_begin[s + 1] == plan.piece_seg_begin[s])
            bad("plan_layout: every piece needs a segment");
        FinishPlan(&plan);
        nb::dict out;
        std::vector<int64_t> exchange(q, 0), state;
        for (int64_t k = 0; k < q; ++k)
          for (const OwnedRange& r : ExchangeRanges(plan, k)) exchange[k] += r.hi - r.lo;
        if (leaf_flags) {  // a value_and_update store: its optimizer state per proxy
          OptimizerSpec spec;
          spec.kind = static_cast<OptKind>(opt_kind);
          spec.momentum = static_cast<float>(momentum);
          spec.leaf_flags.assign(leaf_flags->begin(), leaf_flags->end());
          for (const Segment& g : plan.segments)
            if (g.leaf < 0 || g.leaf >= static_cast<int64_t>(spec.leaf_flags.size()))
              bad("plan_layout: leaf_flags must cover every leaf the segments name");
          for (int64_t k = 0; k < q; ++k) {
            int64_t owned = 0;
            for (const OwnedRange& r : OwnedRanges(plan, spec, k)) owned += r.hi - r.lo;
            state.push_back(StateFloats(spec.slots(), owned, delayed));
          }
        }
        out["arena_nelems"] = plan.arena_nelems;
        out["exchange_nelems"] = exchange;
        out["state_floats"] = state;
        return out;
      },
      nb::arg("workers"), nb::arg("proxies"), nb::arg("piece_nelems"), nb::arg("piece_dest"),
      nb::arg("segments"), nb::arg("leaf_flags").none() = nb::none(), nb::arg("opt_kind") = 0,
      nb::arg("momentum") = 0.0, nb::arg("delayed") = false,
      "The runtime's layout of a plan (the attributes of coarse_jax.plan.Plan.ffi_attrs): "
      "arena_nelems (each proxy's session storage, f32), exchange_nelems (what each proxy hands "
      "to the sum over hosts) and, given leaf_flags (bit 0: a parameter leaf, sync order), "
      "state_floats (each proxy's optimizer state, both buffers).");
  m.def(
      "wakeup_stats",
      []() {
        const WakeupStats w = TheWakeupStats();
        nb::dict d;
        d["thread_starts"] = w.thread_starts;
        d["parks"] = w.parks;
        d["woke_with_work"] = w.woke_with_work;
        d["spin_found"] = w.spin_found;
        d["notify_sleeper"] = w.notify_sleeper;
        d["notify_no_sleeper"] = w.notify_no_sleeper;
        d["jobs_started"] = w.jobs_started;
        d["jobs_late"] = w.jobs_late;
        d["jobs_queued_at_push"] = w.jobs_queued_at_push;
        d["parked_ns"] = w.parked_ns;
        d["job_start_ns"] = w.job_start_ns;
        return d;
      },
      "This module's thread starts, parks and wake-ups since the last reset "
      "(runtime/wakeups.h). See coarse_jax._ffi.wakeups.");
  m.def("reset_wakeup_stats", &ResetWakeupStats, "Zeroes wakeup_stats().");
  m.def(
      "stream_ops",
      []() {
        nb::dict d;
        for (const auto& [name, count] : StreamOpCounts()) d[name.c_str()] = count;
        return d;
      },
      "What this module's stream devices asked of their streams since the last reset, per "
      "kind (runtime/stream_ops.h). See coarse_jax.testing.stream_ops.");
  m.def("reset_stream_ops", &ResetStreamOps, "Zeroes stream_ops().");
  m.def("set_ring_group_floats", &SetRingGroupFloats, nb::arg("floats"),
        "Testing: the most floats the proxies' ring steps as one group of pieces; 0 steps it "
        "piece by piece, negative restores the default. Returns the previous value "
        "(runtime/ring_groups.h).");
  m.def("set_service_idle_ms", &SetServiceIdleMs, nb::arg("ms"),
        "Testing: how long a service thread beyond the reservation waits idle before it exits "
        "(default 30000, at least 1); returns the previous value (runtime/service.h).");
  m.def("set_wait_spin_ns", &SetSpinNs, nb::arg("ns"),
        "How long the runtime's waits spin before they park (runtime/mailbox.h); a negative "
        "value restores the default for this host's cores. Returns the previous value.");
  m.def(
      "service_threads", []() { return TheServiceStats().threads; },
      "Threads the proxies' service pool holds now (runtime/service.h).");
  m.def("interrupt_count", &InterruptsSeen, "SIGINTs the hook has seen (testing).");
  m.def("set_exiting", &SetExiting,
        "The interpreter is exiting: after a SIGINT every wait stops (runtime/interrupt.h).");
  m.def(
      "take_interrupts",
      []() {
        // On Python's main thread: a SIGINT counted here has set Python's
        // flag (the hook counts after), so once PyErr_CheckSignals returns,
        // each has raised its KeyboardInterrupt, here or before.
        const int64_t seen = InterruptsSeen();
        const int raised = PyErr_CheckSignals();
        AcknowledgeInterrupt(seen);
        if (raised != 0) throw nanobind::python_error();
      },
      "Python's main thread only: runs Python's pending signal handlers (a Ctrl-C not yet "
      "raised raises KeyboardInterrupt here), then lets the SIGINTs seen so far stop the "
      "runtime's waits (runtime/interrupt.h), without waiting for the pending call.");
  m.def(
      "interrupt_state",
      []() { return nb::capsule(OwnInterruptState(), "coarse_jax.interrupt_state"); },
      "This module's interrupt state, for use_interrupt_state of the other module.");
  m.def(
      "use_interrupt_state",
      [](nb::capsule state) {
        if (std::string(state.name()) != "coarse_jax.interrupt_state")
          throw std::invalid_argument("expected the capsule of interrupt_state()");
        UseInterruptState(static_cast<InterruptState*>(state.data()));
      },
      nb::arg("state"),
      "Reads another module's interrupt state (interrupt_state()) and installs no hook: one "
      "SIGINT hook per process.");
}

}  // namespace coarse
