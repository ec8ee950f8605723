"""What a traced `coarse.sync` step knows while its function runs: mesh, config, call sites.

`coarse.sync` pushes a `SyncContext` while it traces the user's step;
`coarse.value_and_grad`, `coarse.value_and_update` and `coarse.all_reduce` read the
innermost one. Only this package reads it: the binding layer below gets what
it needs as a `CallSite`.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np

from coarse_jax import _ffi
from coarse_jax.config import Config
from coarse_jax.mesh import DATA, Tiers, local_tiers, platform
from coarse_jax.plan import Plan
from coarse_jax.plan import plan as make_plan
from coarse_jax.plan.xla_route import xla_below_bytes

# (tree, keyword arguments) of one plan built with the step's own Config.
PlanRequest = tuple[Any, dict[str, Any]]


@dataclasses.dataclass
class SyncContext:
    """One trace of a `coarse.sync` step."""

    mesh: Tiers  # the step's workers and proxies
    config: Config
    # Shared with the step: every plan built with its own Config, so that
    # re-profiling can re-plan them and see whether anything changed.
    plans: list[PlanRequest]
    # Shared with the step: the optimizer store of each value_and_update
    # call, by its position in the step (api/_stores.py).
    stores: dict[int, Any] = dataclasses.field(default_factory=dict)
    step_name: str = "step"
    # mode="reference" value_and_update: the step state it reads and writes
    # (master, optax state) by call position, and the optimizers (_stores.py).
    ref_in: dict[int, Any] = dataclasses.field(default_factory=dict)
    ref_out: dict[int, Any] = dataclasses.field(default_factory=dict)
    ref_optimizers: dict[int, Any] = dataclasses.field(default_factory=dict)
    # Every plan this trace built (memory_report sizes the runtime's storage from them).
    built: list[Plan] = dataclasses.field(default_factory=list)
    next_site: int = 0
    next_update: int = 0
    # Shared with the step: the public name of each synchronization site
    # ("coarse.all_reduce", ...), for errors about the traced program (_uniform.py).
    site_names: dict[int, str] = dataclasses.field(default_factory=dict)
    # Whether the proxies check the params each value_and_update gets
    # (dispatch/params_check.py), and what each one's params and new params are.
    check_params: bool = True
    # The step's Snapshots.every: the proxies snapshot every this many updates.
    snapshot_every: int = 0
    update_io: list[tuple[int, list[Any], list[Any]]] = dataclasses.field(default_factory=list)

    @property
    def workers(self) -> int:
        return int(self.mesh.shape[DATA])

    @property
    def proxies(self) -> int:
        return self.mesh.proxies.count

    @property
    def platform(self) -> str:
        """The workers' platform ("cpu", "gpu")."""
        return platform(self.mesh)

    def plan(self, tree: Any, cfg: Config, **kwargs: Any) -> Plan:
        if cfg is self.config:
            self.plans.append((tree, kwargs))
        xla_route = xla_below_bytes(cfg, self.mesh)
        built = make_plan(
            tree, self.workers, cfg, proxies=self.proxies, xla_route=xla_route, **kwargs
        )
        self.built.append(built)
        return built

    def call_site(self, plan: Plan, what: str, pulls_pushed: bool = False) -> _ffi.CallSite:
        """A new synchronization of this program: its own site, so the runtime
        keys its rendezvous by (execution, site) apart from the others.

        ``what``: the public call it belongs to ("coarse.all_reduce", ...).

        ``pulls_pushed``: the caller hands the pull the very values it pushed
        (not `coarse.value_and_update`, whose gradients die at their push).
        The proxies then read the pushes in place (``CallSite.push_in_place``)
        on CPU, where every device's buffers are this process's memory, unless
        links are emulated (the emulated schedule transfers the pushes).
        """
        site = self.next_site
        self.next_site += 1
        self.site_names[site] = what
        in_place = pulls_pushed and plan.config.topology is None and self.platform == "cpu"
        return _ffi.CallSite(plan.ffi_attrs(), site, self.ordinals, push_in_place=in_place)

    @property
    def ordinals(self) -> np.ndarray:
        # Across hosts the runtime of each process sees only its own host's
        # devices: the plan has p_local workers, ordinals are this host's.
        return _ffi.device_ordinals(local_tiers(self.mesh))


_local = threading.local()


def stack() -> list[SyncContext]:
    """This thread's contexts, innermost last (a step may trace another step)."""
    if not hasattr(_local, "stack"):
        _local.stack = []
    contexts: list[SyncContext] = _local.stack
    return contexts


def current(where: str) -> SyncContext:
    """The innermost context; a clear error naming ``where`` outside `coarse.sync`."""
    if not stack():
        raise RuntimeError(
            f"{where} was called outside a coarse.sync step: it synchronizes over the "
            "'tier' and 'data' axes of a coarse mesh, which only exist inside it. Fix: decorate "
            "the train step with @coarse.sync(mesh) and call it from there."
        )
    return stack()[-1]
