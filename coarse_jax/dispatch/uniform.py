"""Every device of the program runs every coarse call: checked on the traced step.

A coarse synchronization is a collective: every device of the mesh takes
part in each of its custom calls, and the runtime waits (up to
``Config.timeout_s``) for the ones that do not come. A coarse call that only
some devices run therefore never completes: the devices that run it wait
for the others, and the others may meanwhile enter an XLA collective of their
own, whose rendezvous (XLA:CPU's ``xla_cpu_collective_call_terminate_timeout_seconds``,
40 s by default, a process-wide flag) aborts the whole process before the
runtime's wait gives up. So `coarse.sync` refuses such a step while tracing,
before anything runs.

Which calls only some devices run is read from the step's jaxpr: a call
inside a ``lax.cond`` / ``lax.switch`` whose branch index varies over a mesh
axis (it depends on ``lax.axis_index``, or on a per-worker value), or inside
a ``lax.while_loop`` whose predicate varies so (devices would run different
numbers of iterations). A predicate that is the same on every device (a
step count, a loss that went through `coarse.all_reduce`) is fine: every
device takes the same branch. shard_map's varying-axes types say which is
which, so the check needs no guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.extend.core as jax_core

from coarse_jax import _jax_compat
from coarse_jax._ffi.calls import site_of

_COARSE_CALL = "coarse_custom_call"  # coarse_jax._ffi.primitive.custom_call_p
_ROUTE = "coarse_latency_route"  # coarse_jax._ffi.primitive.route_p (api/_latency_route.py)


def _varying(var: Any) -> tuple[str, ...]:
    """The mesh axes a jaxpr variable varies over (a literal varies over none)."""
    mat = getattr(getattr(var, "aval", None), "mat", None)
    return tuple(sorted(getattr(mat, "varying", ()) or ()))


class _Split:
    """An equation whose parts only some devices run, and the axes it splits them by."""

    def __init__(self, what: str, axes: tuple[str, ...], eqn: Any) -> None:
        self.what, self.axes, self.eqn = what, axes, eqn


def _split_of(eqn: Any) -> _Split | None:
    name = eqn.primitive.name
    if name == "cond":
        axes = _varying(eqn.invars[0])
        return _Split("a lax.cond / lax.switch", axes, eqn) if axes else None
    if name == "while":
        cond = eqn.params["cond_jaxpr"]
        axes = _varying(getattr(cond, "jaxpr", cond).outvars[0])
        return _Split("a lax.while_loop", axes, eqn) if axes else None
    return None


def _error(call: Any, split: _Split, site_names: Mapping[int, str], step: str) -> TypeError:
    attrs = call.params["attributes"].attrs
    name = site_names.get(site_of(attrs), "a coarse synchronization")
    return _split_error(
        name,
        f"its custom call {call.params['target']}",
        ", or the ones that do wait for the others until Config.timeout_s, and an XLA "
        "collective the others enter meanwhile may abort the process",
        split,
        step,
    )


def _route_error(marker: Any, split: _Split, step: str) -> TypeError:
    return _split_error(
        marker.params["target"],
        "its tree is on the latency route, Config.xla_below_bytes: one psum, which XLA would "
        "wait for until it aborts the process",
        "",
        split,
        step,
    )


def _split_error(name: str, what: str, unless: str, split: _Split, step: str) -> TypeError:
    """The TypeError for ``name`` (a coarse call, ``what`` it runs) under ``split``."""
    where = _jax_compat.user_location(split.eqn)
    at = f" (at {where})" if where else ""
    axes = ", ".join(repr(a) for a in split.axes)
    return TypeError(
        f"coarse.sync({step}): {name} is traced inside {split.what}{at} whose predicate "
        f"varies over the mesh axis {axes}, so only some devices of the program would run it "
        f"({what}). A coarse synchronization is a collective: every worker of the program must "
        f"run each of its calls{unless}. Fix: call it outside the conditional or loop, on every "
        "device, and select its result afterwards (jnp.where on the predicate); or make the "
        "predicate the same on every device (pass a per-worker value through coarse.all_reduce "
        "first)."
    )


def _walk(jaxpr: Any, splits: tuple[_Split, ...], sites: Mapping[int, str], step: str) -> None:
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in inner.eqns:
        if eqn.primitive.name == _COARSE_CALL:
            if splits:
                raise _error(eqn, splits[0], sites, step)
            continue
        if eqn.primitive.name == _ROUTE:
            if splits:
                raise _route_error(eqn, splits[0], step)
            continue
        split = _split_of(eqn)
        below = (*splits, split) if split is not None else splits
        for sub in jax_core.jaxprs_in_params(eqn.params):
            _walk(sub, below, sites, step)


def check(jaxpr: Any, site_names: Mapping[int, str], step: str) -> None:
    """Raises TypeError if a coarse call of ``jaxpr`` runs on only some devices.

    ``jaxpr``: the traced step (a Jaxpr or ClosedJaxpr); ``site_names``: the
    public name of each synchronization site (`coarse.all_reduce`, ...),
    for the message; ``step``: the step's name.
    """
    _walk(jaxpr, (), site_names, step)
