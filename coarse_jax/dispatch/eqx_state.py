"""Equinox's ``eqx.nn.State`` through a coarse step: each worker's own, then their mean.

``eqx.nn.BatchNorm`` (``mode="batch"``) keeps its running statistics in an
``eqx.nn.State`` that the step passes in and gets back (``out, state =
model(x, state)``). Inside the step each worker computes its statistics from
its own rows, so the new state differs per worker; ``State.set`` refuses a new
value whose type differs from the old one's, varying axes included
("Old and new values have different structures/shapes/dtypes"), though under
``jax.jit`` the same code runs. So, as `coarse.sync` does for Flax NNX state
(`coarse_jax.dispatch.nnx`): a ``State`` argument's floating arrays enter the
step cast to vary over the workers (each worker's own copy, equal at the
start; integer leaves, counters, stay as they are), and every
``State`` the step returns leaves as the workers' mean (floats through
`coarse.all_reduce`, as Flax's data-parallel examples average batch
statistics; integers and flags as XLA's psum, divided).

equinox is imported only when the caller already did: without it no State
can reach here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from coarse_jax import _ffi
from coarse_jax.dispatch import nnx


def is_state(x: Any) -> bool:
    """Whether ``x`` is an ``eqx.nn.State``."""
    eqx = sys.modules.get("equinox")
    return eqx is not None and isinstance(x, eqx.nn.State)


def _has_state(tree: Any) -> bool:
    return "equinox" in sys.modules and any(
        is_state(x) for x in jax.tree.leaves(tree, is_leaf=is_state)
    )


def _vary_floats(state: Any) -> Any:
    return jax.tree.map(
        lambda x: _ffi.vary(x) if jnp.issubdtype(jnp.result_type(x), jnp.inexact) else x, state
    )


def per_worker(tree: Any) -> Any:
    """``tree`` with every ``State``'s floating arrays cast to vary over the workers (an
    integer leaf, a counter, stays the same on every worker, and keeps its weak type)."""
    if not _has_state(tree):
        return tree
    return jax.tree.map(lambda x: _vary_floats(x) if is_state(x) else x, tree, is_leaf=is_state)


def mean_over_workers(tree: Any, all_reduce: Callable[[Any], Any], workers: int) -> Any:
    """``tree`` with every ``State``'s per-worker leaves replaced by the workers' mean."""
    if not _has_state(tree):
        return tree
    return jax.tree.map(
        lambda x: nnx.mean_of_varying(x, all_reduce, workers) if is_state(x) else x,
        tree,
        is_leaf=is_state,
    )
