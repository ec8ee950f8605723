"""`coarse.diagnostics.memory_report`: each tier's bytes in a step, XLA's plus the runtime's.

A `coarse.sync` step's XLA program spans the workers only, so XLA's part
(arguments, outputs, temporaries: the compiled program's
``memory_analysis()``, per device) is a worker's alone; the batch, the
params and the activations live there. A proxy runs no XLA program: its
work is the runtime's service (ffi/runtime/service.h), and everything it
holds is the runtime's own, allocated by the runtime on the proxy's device:
the session storage (one f32 slot per client and piece, `Plan`) and, under
`coarse.value_and_update`, its share of the f32 master parameters and
optimizer state, both buffers (double buffering, so a failed step keeps the
previous version), plus the snapshot copy when snapshots are on. With the
proxies in host memory (``make_mesh(..., proxies_on="host")``) all of that
is host memory and the devices hold the workers' part alone
(``MemoryReport.proxies_on``). The workers
hold only the leading layers' scratch besides XLA's buffers. That is the
paper's memory argument: parameter storage moves to the proxies, and the
workers' memory is what the forward and backward passes need.

Where a proxy's memory comes from, and why: the runtime allocates it (on
CPU, process memory from the storage pool, bounded by
`coarse_jax._ffi.set_memory_limits`; on GPU, ``cudaMalloc`` on the proxy's
GPU). The state must outlive any one XLA execution (the master copy and the
optimizer state between steps, the previous version kept until a step
commits), and with no program on the proxies there is no XLA buffer that
could hold it; arrays JAX allocated there would need a program of their own
to be written.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from coarse_jax import _ffi
from coarse_jax.plan import Plan

TIERS = ("worker", "proxy")


@dataclasses.dataclass(frozen=True)
class TierMemory:
    """Peak bytes on one device of a tier (the largest of the tier's devices).

    Part of a `MemoryReport`; every field is in bytes per device.

    Attributes:
      tier: ``"worker"`` or ``"proxy"``.
      xla_argument_bytes: the compiled program's arguments (on a proxy: the
        arguments the user placed on the whole mesh, which a proxy's device
        holds too).
      xla_output_bytes: its outputs (on a proxy: the outputs that follow
        those arguments onto the whole mesh, `coarse.sync`).
      xla_alias_bytes: outputs written into donated arguments, counted once.
      xla_temp_bytes: XLA's temporaries.
      runtime_storage_bytes: the runtime's per-step sync storage (the proxies'
        slots, the workers' scratch).
      optimizer_bytes: master parameters and optimizer state, both buffers
        (proxies under `coarse.value_and_update`; 0 on workers).

    Example:
      >>> t = coarse.diagnostics.TierMemory("worker", 100, 100, 100, 20, 0, 0)
      >>> t.xla_bytes, t.total_bytes
      (120, 120)
    """

    tier: str
    xla_argument_bytes: int
    xla_output_bytes: int
    xla_alias_bytes: int  # outputs written into donated arguments, counted once
    xla_temp_bytes: int
    runtime_storage_bytes: int  # per-step sync storage (proxy slots / worker scratch)
    optimizer_bytes: int  # master parameters + optimizer state, both buffers

    @property
    def xla_bytes(self) -> int:
        """The bytes of XLA's buffers, arguments + outputs - aliased + temporaries."""
        return (
            self.xla_argument_bytes
            + self.xla_output_bytes
            - self.xla_alias_bytes
            + self.xla_temp_bytes
        )

    @property
    def total_bytes(self) -> int:
        """XLA's buffers plus the runtime's storage and the optimizer state."""
        return self.xla_bytes + self.runtime_storage_bytes + self.optimizer_bytes


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """Per tier, what one device holds while the step runs; made by `memory_report`.

    Attributes:
      worker: a worker's bytes, as a `TierMemory`.
      proxy: a proxy's bytes, as a `TierMemory`.
      proxies_on: where the proxies live (``coarse.make_mesh``'s
        ``proxies_on``): ``"devices"``, the proxy row is one proxy device's
        memory; ``"host"``, it is one proxy's host memory, on no device (its
        XLA parts are 0), and the devices hold the worker row alone.

    Example:
      >>> step = coarse.sync(lambda x: coarse.all_reduce(x), mesh=mesh)
      >>> report = coarse.diagnostics.memory_report(step, jnp.ones((8, 1024)))
      >>> report.worker.tier, report.proxy_bytes >= report.proxy.runtime_storage_bytes
      ('worker', True)
    """

    worker: TierMemory
    proxy: TierMemory
    proxies_on: str = "devices"

    @property
    def worker_bytes(self) -> int:
        """The peak bytes on a worker, XLA's buffers plus the runtime's."""
        return self.worker.total_bytes

    @property
    def proxy_bytes(self) -> int:
        """The peak bytes on a proxy, XLA's buffers plus the runtime's (host memory with
        ``proxies_on="host"``)."""
        return self.proxy.total_bytes

    def table(self) -> str:
        """A fixed-width table in MiB, one row per tier.

        Returns:
          The table as a string, with columns args, outputs, aliased (negative,
          counted once), temp, runtime, optimizer and total.

        Example:
          >>> tier = coarse.diagnostics.TierMemory
          >>> report = coarse.diagnostics.MemoryReport(tier("worker", 2**20, 0, 0, 0, 0, 0),
          ...                                          tier("proxy", 2**20, 0, 0, 0, 0, 0))
          >>> print(report.table())  # doctest: +ELLIPSIS
          tier           args    outputs    aliased       temp    runtime  optimizer ...
          worker          1.0        0.0        0.0        0.0        0.0        0.0        1.0
          proxy           1.0        0.0        0.0        0.0        0.0        0.0        1.0
        """
        cols = ("args", "outputs", "aliased", "temp", "runtime", "optimizer", "total")
        unit = "(MiB per device)" if self.proxies_on != "host" else "(MiB per device; proxy: host)"
        lines = [f"{'tier':<8}" + "".join(f"{c:>11}" for c in cols) + "   " + unit]
        for t in (self.worker, self.proxy):
            vals = (
                t.xla_argument_bytes,
                t.xla_output_bytes,
                -t.xla_alias_bytes,
                t.xla_temp_bytes,
                t.runtime_storage_bytes,
                t.optimizer_bytes,
                t.total_bytes,
            )
            lines.append(f"{t.tier:<8}" + "".join(f"{v / 2**20:>11.1f}" for v in vals))
        return "\n".join(lines)


def arena_bytes(plan: Plan) -> list[int]:
    """Each proxy's session storage for ``plan``, as the runtime lays it out (read from it)."""
    return [4 * n for n in _ffi.plan_layout(plan.ffi_attrs()).arena_nelems]


def optimizer_bytes(store: Any) -> int:
    """The largest per-proxy bytes of a value_and_update store: measured, or before its first
    step the runtime's layout of it (what each proxy owns of the parameters, master plus
    slots, two buffers)."""
    measured = store.runtime.proxy_bytes()
    if measured:
        return int(max(measured))
    layout = _ffi.plan_layout(
        store.plan.ffi_attrs(),
        param_leaves=store.updated_sync_ids(),
        optimizer={**store.optimizer.ffi_attrs(), "opt_delayed": int(store.delayed)},
    )
    return 4 * max(layout.state_floats)


def memory_report(step: Any, *args: Any, **kwargs: Any) -> MemoryReport:
    """Per device and tier, the bytes ``step`` holds when called with ``args``.

    Compiles the step for ``args`` (nothing runs) and reads XLA's memory
    analysis of the program, which runs on the workers only; adds the
    runtime's storage for the
    synchronizations the program makes and, for `coarse.value_and_update`,
    the proxies' master parameters and optimizer state (measured once a step
    has run, computed before). Several syncs in one step are summed, an
    upper bound (the runtime holds one session set per sync in flight).

    Args:
      step: a `coarse.sync` step (`SyncedStep`).
      *args: arguments as for a call (arrays or ``jax.ShapeDtypeStruct``
        values).
      **kwargs: keyword arguments as for a call.

    Returns:
      A `MemoryReport` with ``.worker_bytes``, ``.proxy_bytes`` (peak per device of
      each tier), ``.worker`` / ``.proxy`` (`TierMemory` parts), ``.table()``.

    Raises:
      TypeError: ``args`` do not fit the step, as a call would raise.
      ValueError: ``args`` do not fit the step, as a call would raise (a batch
        not divisible by the workers, say).

    Example:
      >>> opt = coarse.optim.adam(1e-3)
      >>> @coarse.sync(mesh)
      ... def train_step(params, batch):
      ...     f = lambda p, b: jnp.mean((b @ p["w"]) ** 2)
      ...     loss, params = coarse.value_and_update(f, opt)(params, batch)
      ...     return params, loss
      >>> params = {"w": jnp.zeros((1024, 256))}        # 1 MiB of f32
      >>> report = coarse.diagnostics.memory_report(train_step, params, jnp.ones((8, 1024)))
      >>> report.proxy.optimizer_bytes  # 1/4 of master + 2 moments, twice; 2x lr, bc1, bc2
      1572896
      >>> report.worker.optimizer_bytes
      0
    """
    if not hasattr(step, "memory_report"):
        raise TypeError(
            "coarse.diagnostics.memory_report: step must be a coarse.sync step, got "
            f"{type(step).__name__}. Fix: decorate the train step with @coarse.sync(mesh)."
        )
    return step.memory_report(*args, **kwargs)


@dataclasses.dataclass(frozen=True)
class StepMemory:
    """What a compiled step says of itself for `memory_report` (`SyncedStep.memory_report`)."""

    compiled: Any  # XLA's memory analysis of the workers' program
    plans: list[Plan]  # the synchronizations it makes
    proxies: int  # q
    stores: list[Any]  # its value_and_update stores (`coarse_jax.api._stores.ProxyStore`)
    proxy_argument_bytes: int  # the user's arrays on a proxy's device (placed on the mesh)
    proxy_output_bytes: int  # the outputs that follow them there
    proxies_on: str = "devices"  # the mesh's (coarse_jax.mesh.proxies_on)


def tally(parts: StepMemory) -> MemoryReport:
    """Per tier, the bytes of one device while the step runs."""
    arena = [0] * parts.proxies
    scratch = 0
    for plan in parts.plans:
        for k, b in enumerate(arena_bytes(plan)):
            arena[k] += b
        scratch += sum(plan.leaves[i].size for i in plan.leading_leaves) * 4
    opt = sum(optimizer_bytes(s) for s in parts.stores)
    m = parts.compiled
    worker = TierMemory(
        "worker",
        int(m.argument_size_in_bytes),
        int(m.output_size_in_bytes),
        int(m.alias_size_in_bytes),
        int(m.temp_size_in_bytes),
        scratch,
        0,
    )
    # A proxy runs no XLA program (the runtime's service): no temporaries.
    # Its device holds the user's arrays placed on the whole mesh, and the
    # step's outputs that follow them there (coarse.sync's placement); a
    # proxy in host memory has no device, so none of XLA's buffers.
    on_device = parts.proxies_on != "host"
    proxy = TierMemory(
        "proxy",
        parts.proxy_argument_bytes if on_device else 0,
        parts.proxy_output_bytes if on_device else 0,
        0,
        0,
        max(arena, default=0),
        opt,
    )
    return MemoryReport(worker, proxy, parts.proxies_on)
