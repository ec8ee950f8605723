"""Flax NNX objects as `coarse.sync` arguments and `coarse.value_and_grad` inputs.

`coarse.sync` treats modules, optimizers, metrics and ``nnx.Rngs`` like
``nnx.jit`` does: they are split into a graph definition (static) and a state
(arrays) at the call, merged back inside the step, and the caller's objects
are updated in place with the state the step ends with. Mutable state the
step changed per worker (batch statistics, metrics, RNG counters) is made the
same on every device: float state is averaged over the workers (as Flax's
data-parallel examples average batch statistics), integer state too (it must
be equal on every worker, as counters are). Each worker draws its own random
numbers: inside the step every RNG stream's key is folded with the worker's
index (worker 0 keeps the key itself, so one worker draws what ``nnx.jit``
draws on one device), and restored before the state leaves the step.

flax is imported only when the caller already did: without it no NNX object
can reach here.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from coarse_jax import _ffi
from coarse_jax.mesh import DATA, HOST, traced_axes


def _nnx() -> Any:
    from flax import nnx

    return nnx


def is_graph_node(x: Any) -> bool:
    return "flax" in sys.modules and bool(_nnx().graph.is_graph_node(x))


def graph_positions(args: Sequence[Any]) -> tuple[int, ...]:
    """Indices of the top-level arguments that are NNX graph nodes (modules, optimizers, ...)."""
    if "flax" not in sys.modules:
        return ()
    return tuple(i for i, a in enumerate(args) if is_graph_node(a))


@dataclasses.dataclass(frozen=True)
class OtherNodes:
    """NNX objects passed to a loss but not differentiated: where they were, and their state."""

    positions: tuple[int, ...]  # positional arguments
    names: tuple[str, ...]  # keyword arguments
    nodes: tuple[Any, ...]  # the caller's objects, positions then names
    graphdef: Any
    state: Any

    def without(self, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict]:
        """The arguments with the objects taken out (None in their places)."""
        a = [None if i in self.positions else x for i, x in enumerate(args)]
        return a, {k: v for k, v in kwargs.items() if k not in self.names}

    def put(
        self, args: Sequence[Any], kwargs: dict[str, Any], nodes: tuple[Any, ...]
    ) -> tuple[list[Any], dict]:
        """The arguments with ``nodes`` (merged from the state) back in their places."""
        a, k = list(args), dict(kwargs)
        for i, node in zip(self.positions, nodes, strict=False):
            a[i] = node
        for name, node in zip(self.names, nodes[len(self.positions) :], strict=True):
            k[name] = node
        return a, k


def other_nodes(
    args: Sequence[Any], kwargs: dict[str, Any], differentiated: Sequence[int]
) -> OtherNodes | None:
    """The NNX objects among ``args`` and ``kwargs`` outside ``differentiated``, or None."""
    if "flax" not in sys.modules:
        return None
    positions = tuple(i for i, a in enumerate(args) if i not in differentiated and is_graph_node(a))
    names = tuple(k for k, v in kwargs.items() if is_graph_node(v))
    if not positions and not names:
        return None
    nodes = tuple(args[i] for i in positions) + tuple(kwargs[k] for k in names)
    graphdef, state = split(nodes)
    return OtherNodes(positions, names, nodes, graphdef, state)


def split(nodes: tuple[Any, ...]) -> tuple[Any, Any]:
    """(graphdef, state) of ``nodes`` together, so objects they share are shared after merge."""
    return _nnx().split(nodes)


def merge(graphdef: Any, *states: Any) -> Any:
    """The objects ``graphdef`` and ``states`` describe, as fresh copies.

    copy=True: new Variables owned by the current trace (the step's, the
    loss's, the conditional's), so code there may mutate them; the caller's
    objects are updated afterwards from the state that comes out.
    """
    return _nnx().merge(graphdef, *states, copy=True)


def update(nodes: Any, state: Any) -> None:
    """Writes ``state`` into ``nodes`` (objects, or a tuple of them) in place."""
    _nnx().update(nodes, state)


def fold_rngs_by_worker(nodes: tuple[Any, ...]) -> Callable[[], None]:
    """Folds the worker index into every RNG stream's key; returns what restores them."""
    nnx = _nnx()
    streams = [n for _, n in nnx.iter_graph(nodes) if isinstance(n, nnx.RngStream)]
    saved = [s.key.get_value() for s in streams]
    me = lax.axis_index(DATA)
    if HOST in traced_axes():  # the worker's index over all hosts
        me = lax.axis_index(HOST) * lax.axis_size(DATA) + me
    for s in streams:
        s.key.set_value(_fold_unless_first(s.key.get_value(), me))

    def restore() -> None:
        for s, key in zip(streams, saved, strict=True):
            s.key.set_value(key)

    return restore


def _fold_unless_first(key: jax.Array, me: jax.Array) -> jax.Array:
    """``key`` folded with worker ``me``'s index, except on worker 0, which keeps ``key``:
    one worker draws what ``nnx.jit`` on one device draws (the same dropout masks)."""
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    data = jax.random.key_data if typed else (lambda k: k)
    mixed = jnp.where(me == 0, data(key), data(jax.random.fold_in(key, me)))
    return jax.random.wrap_key_data(mixed, impl=jax.random.key_impl(key)) if typed else mixed


def consistent_state(nodes: tuple[Any, ...], all_reduce: Callable[[Any], Any], workers: int) -> Any:
    """The nodes' state with every per-device value replaced by the workers' mean.

    ``all_reduce``: the float mean over workers (`coarse.all_reduce`); integer
    leaves use XLA collectives (the runtime reduces floats only).
    """
    return mean_of_varying(_nnx().state(nodes), all_reduce, workers)


def mean_of_varying(state: Any, all_reduce: Callable[[Any], Any], workers: int) -> Any:
    """``state`` with every leaf that varies over the workers replaced by their mean (floats
    through ``all_reduce``, integers and bools as XLA's psum over the workers, divided)."""
    leaves, treedef = jax.tree.flatten(state)
    axes = traced_axes()  # across hosts: over the workers of every host
    if HOST in axes:
        workers *= lax.axis_size(HOST)
    varying = [
        i
        for i, x in enumerate(leaves)
        if isinstance(x, jax.Array) and set(jax.typeof(x).mat.varying) & set(axes)
    ]
    floats = [i for i in varying if jnp.issubdtype(leaves[i].dtype, jnp.floating)]
    if floats:
        for i, v in zip(floats, all_reduce([leaves[i] for i in floats]), strict=True):
            leaves[i] = v
    for i in varying:
        if i in floats:
            continue
        x = _ffi.vary(leaves[i])
        wide = x.astype(jnp.int32) if x.dtype == jnp.bool_ else x
        total = lax.psum(wide, axes)
        leaves[i] = (total // workers).astype(x.dtype)
    return jax.tree.unflatten(treedef, leaves)


def diff_filter(argnums: Any) -> Any:
    """The filter of an ``nnx.DiffState`` argnums, else None."""
    if "flax" not in sys.modules or not isinstance(argnums, _nnx().DiffState):
        return None
    return argnums.filter


def diff_argnum(argnums: Any) -> int:
    return int(argnums.argnum)


def diff_split(model: Any, wrt: Any = None) -> tuple[Any, Any, Any]:
    """(graphdef, params, rest): what ``nnx.value_and_grad`` differentiates and what it carries.

    RNG keys stay in ``rest`` but never leave the loss: a key cannot be a
    zero-filled output of the workers-only conditional.
    """
    nnx = _nnx()
    return nnx.split(model, nnx.Param if wrt is None else wrt, ...)


def changed_state(before: Any, node: Any) -> Any:
    """What ``node``'s code changed: its variables (not params, not RNG keys) whose value
    is no longer the one ``before`` (a state of ``node`` taken when it was merged) held.

    Only these leave a traced region (the loss, the workers-only conditional):
    unchanged state stays as it was, so `consistent_state` never averages, and
    so never rounds, a value every device already holds.
    """
    nnx = _nnx()
    after = nnx.state(node, nnx.All(nnx.Not(nnx.Param), nnx.Not(nnx.RngKey)))
    old = dict(nnx.to_flat_state(before))
    changed = [
        (path, var)
        for path, var in nnx.to_flat_state(after)
        if path not in old or _value(var) is not _value(old[path])
    ]
    return nnx.from_flat_state(changed)


def _value(v: Any) -> Any:
    return v.get_value() if hasattr(v, "get_value") else v
