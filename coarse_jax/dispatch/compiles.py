"""What XLA compiled for a step, and why it compiled again.

A `coarse.sync` step keeps one jitted program per binding and Config; ``jax.jit``
compiles that program once per argument *type and placement* it meets. A weak
type that became strong (a ``TrainState.step`` restored from a checkpoint as
``int32``) or an argument placed elsewhere compiles the program again, as long
as the first time (about 20 s for a ResNet-18 step). `Compiles` counts those
compiles from jit's own cache and, the first time one happens after the first,
warns naming the argument and what changed, as ``jax.config.update(
"jax_explain_cache_misses", True)`` would.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax

from coarse_jax import _jax_compat

Entry = tuple[str, tuple[Any, ...]]


def _leaf_type(x: Any) -> tuple[Any, ...]:
    if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
        sharding = x.sharding if x.committed else "uncommitted"
        return (tuple(x.shape), str(x.dtype), bool(getattr(x, "weak_type", False)), sharding)
    if isinstance(x, (bool, int, float, complex)):
        return ((), type(x).__name__, True, "a Python scalar")
    shape = getattr(x, "shape", None)
    dtype = getattr(x, "dtype", None)
    return (tuple(shape) if shape is not None else None, str(dtype), False, "host")


def signature(named: Sequence[tuple[str, Any]]) -> list[Entry]:
    """(argument and key path, (shape, dtype, weak type, placement)) of every leaf."""
    out: list[Entry] = []
    for what, tree in named:
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            out.append((what + jax.tree_util.keystr(path), _leaf_type(leaf)))
    return out


def _change(before: tuple[Any, ...], now: tuple[Any, ...]) -> str:
    shape0, dtype0, weak0, where0 = before
    shape1, dtype1, weak1, where1 = now
    if shape0 != shape1:
        return (
            f"its shape changed from {dtype0}{list(shape0 or ())} to {dtype1}{list(shape1 or ())}"
        )
    if dtype0 != dtype1:
        return (
            f"its dtype changed from {dtype0}{list(shape0 or ())} to {dtype1}{list(shape1 or ())}"
        )
    if weak0 != weak1:
        return (
            f"its weak type changed ({dtype0}, weak_type={weak0} -> weak_type={weak1}): a Python "
            "number or an array made from one is weakly typed"
        )
    return f"its placement changed from {where0} to {where1}"


def _fix(what: str, before: tuple[Any, ...], now: tuple[Any, ...]) -> str:
    """The fix for the first change `_change` names: shape, dtype, weak type, placement."""
    batch = what.startswith("batch ")
    if before[0] != now[0]:
        if batch:
            return (
                "Fix: give every batch one shape (drop or pad the last, smaller batch, e.g. "
                "drop_remainder=True), or expect one compile per batch shape, as jax.jit does"
            )
        return "Fix: keep its shape the same every call (one compile per shape, as jax.jit)"
    if before[1] != now[1]:
        return (
            f"Fix: give it one dtype every call, e.g. x.astype(jnp.{before[1]}) where it is made "
            "(a data loader that yields float64 or int64 numpy arrays, say)"
        )
    if before[2] != now[2]:
        return (
            f"Fix: give it one type every call, e.g. jnp.asarray(x, jnp.{now[1]}) where it is "
            "made (a TrainState's step, a DynamicScale's scale, a restored checkpoint)"
        )
    if batch:
        return (
            "Fix: pass the batch the same way every call: host arrays (numpy), or arrays "
            'placed with NamedSharding(mesh, P("data")) on the mesh coarse.make_mesh returned'
        )
    return (
        "Fix: pass the step's own outputs back, or place the argument as the step's outputs "
        "are (NamedSharding(mesh, P()) on the mesh coarse.make_mesh returned)"
    )


class Compiles:
    """A step's programs' compiles, from jit's cache; warns once on a recompile."""

    def __init__(self, step: str) -> None:
        self._step = step
        self._sizes: dict[Hashable, int] = {}
        self._first: dict[Hashable, list[Entry]] = {}
        self._warned = False

    @staticmethod
    def total(programs: Sequence[Any]) -> int:
        """What XLA compiled for ``programs`` (the step's jitted programs) so far: one
        executable per argument type and placement each met (at least one each)."""
        return sum(_jax_compat.jit_cache_size(jitted) or 1 for jitted in programs)

    def first_call(self, key: Hashable, named: Sequence[tuple[str, Any]]) -> None:
        """Remembers the arguments a program was first called with."""
        self._first[key] = signature(named)

    def after_call(
        self, key: Hashable, jitted: Any, named: Callable[[], Sequence[tuple[str, Any]]]
    ) -> None:
        """After a call of program ``key``: a new compile of it is warned about (once per
        step) with the first argument that differs from its first call's. ``named``
        gives the call's (label, argument) pairs; it runs only after a new compile."""
        size = _jax_compat.jit_cache_size(jitted)
        if size is None:
            return
        known = self._sizes.get(key, 0)
        self._sizes[key] = max(known, size)
        if size <= known or known == 0 or self._warned:
            return
        first = dict(self._first.get(key, []))
        for what, now in signature(named()):
            before = first.get(what)
            if before is not None and before != now:
                self._warned = True
                warnings.warn(
                    f"coarse.sync({self._step}): XLA compiled the step again ({size} "
                    f"executables of one program): {what} is not what the first call passed: "
                    f"{_change(before, now)}. jax.jit compiles once per argument type and "
                    f"placement, as long as the first time. {_fix(what, before, now)}.",
                    RuntimeWarning,
                    stacklevel=3,
                )
                return
