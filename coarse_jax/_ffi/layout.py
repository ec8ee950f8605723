"""What the runtime derives from a plan, read from the extension: one definition, in C++.

Each proxy's session storage (the arena, ffi/runtime/plan.cc ``FinishPlan``),
what each proxy hands to the sum over hosts (``ExchangeRanges``), the
optimizer state a store takes on each proxy (``OwnedRanges``,
``StateFloats``, ffi/runtime/param_store.h) and the 32-bit plan key the hosts
compare (``HostPlanKey``, ffi/runtime/plan.h) are the runtime's decisions.
Python asks for them here and never computes them again, so a change on the
C++ side cannot silently disagree with Python. Pure functions of a plan's FFI
attributes (`coarse_jax.plan.Plan.ffi_attrs`); the CPU module answers for
every platform (both modules compile the same runtime).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from coarse_jax._ffi.extension import cpu_module


@dataclasses.dataclass(frozen=True)
class PlanLayout:
    """Per proxy, in f32 elements: the runtime's layout of one plan."""

    arena_nelems: tuple[int, ...]  # the session storage: one slot per client and piece
    exchange_nelems: tuple[int, ...]  # owned after the reduce-scatter, every piece
    state_floats: tuple[int, ...]  # a store's master and state, both buffers (if asked)


def plan_layout(
    attrs: Mapping[str, Any],
    *,
    param_leaves: Sequence[int] | None = None,
    optimizer: Mapping[str, Any] | None = None,
) -> PlanLayout:
    """The runtime's layout of the plan whose FFI attributes are ``attrs``.

    ``param_leaves`` (plan leaf ids, sync order) and ``optimizer`` (its FFI
    attributes, ``opt_kind``, ``opt_momentum`` and, for a delayed update,
    ``opt_delayed``) describe a `coarse.value_and_update` store: then
    ``state_floats`` is filled in.
    """
    flags = None
    kind, momentum, delayed = 0, 0.0, False
    if param_leaves is not None:
        flags = [0] * len(attrs["leaf_nelems"])
        for s in param_leaves:
            flags[s] = 1
        assert optimizer is not None, "a store's layout needs its optimizer"
        kind, momentum = int(optimizer["opt_kind"]), float(optimizer.get("opt_momentum", 0.0))
        delayed = bool(optimizer.get("opt_delayed", 0))
    got = cpu_module().plan_layout(
        int(attrs["workers"]),
        int(attrs["proxies"]),
        [int(x) for x in attrs["piece_nelems"]],
        [int(x) for x in attrs["piece_dest"]],
        [int(x) for x in attrs["segments"]],
        flags,
        kind,
        momentum,
        delayed,
    )
    return PlanLayout(
        tuple(int(x) for x in got["arena_nelems"]),
        tuple(int(x) for x in got["exchange_nelems"]),
        tuple(int(x) for x in got["state_floats"]),
    )


def host_plan_key(plan_key: int) -> int:
    """The 32-bit key by which the hosts of a mesh check that they run one plan."""
    return int(cpu_module().host_plan_key(int(plan_key)))
