"""Pure-JAX twin of the runtime: the test oracle and ``mode="reference"``.

Every custom call ends in the same collective: the mean (or sum) over the
workers of each leaf, accumulated in f32, written on every worker (the step's
program spans the workers; the proxies are the runtime's service). push +
proxy ring + pull computes it through the proxies, the worker ring among the
workers; both are, value for value, a ``psum`` over the workers. This module
says so with JAX collectives and shares no code with the runtime.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from coarse_jax.mesh import HOST, traced_axes


def _reduce_leaf(x: jax.Array, workers: int, mean: bool) -> jax.Array:
    # Across hosts ("host" axis): the workers of every host, `workers` per host.
    axes = traced_axes()
    hosts = HOST in axes
    missing = tuple(a for a in axes if a not in jax.typeof(x).mat.varying)
    x = lax.pcast(x, missing, to="varying") if missing else x
    total = lax.psum(x.astype(jnp.float32), axes)
    if mean:
        total = total * jnp.float32(1.0 / (workers * (lax.axis_size(HOST) if hosts else 1)))
    return total.astype(x.dtype)


def all_reduce(tree: Any, workers: int, mean: bool = True) -> Any:
    """Mean (or sum) over the workers of every leaf, identical on every worker.

    What `coarse.all_reduce` computes, in plain JAX collectives: a ``psum``
    over the workers, accumulated in f32 and cast back to each leaf's dtype.
    Must run inside ``shard_map`` over the workers of the coarse mesh
    (``coarse.sync`` does that).

    Args:
      tree: a pytree of float arrays, each device's values.
      workers: the number of workers per host (the mesh's "data" size).
      mean: divide the sum by the number of workers (over all hosts).

    Returns:
      A tree like ``tree``, holding the workers' mean (or sum) on every device.

    Raises:
      ValueError: called outside a ``shard_map`` over a coarse mesh (jax's
        error: the mesh axes are unbound there).

    Example:
      >>> from coarse_jax import reference
      >>> step = coarse.sync(lambda x: reference.all_reduce(x[0], workers=4), mesh=mesh)
      >>> step(jnp.arange(4.0)).tolist()   # workers hold 0, 1, 2, 3
      1.5
    """
    return jax.tree.map(lambda x: _reduce_leaf(x, workers, mean), tree)
