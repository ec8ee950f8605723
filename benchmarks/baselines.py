"""The baselines the benchmarks measure coarse against: a data-parallel step with
``jax.value_and_grad`` + ``lax.pmean`` + an optax update (test_memory.py,
test_snapshots.py), and ``lax.psum`` over the first devices (the all-reduce
benchmarks); imported from this folder, as pytest puts it on ``sys.path``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import PartitionSpec as P


def pmean_optax_step(
    workers: int, loss: Callable[..., Any], tx: optax.GradientTransformation
) -> Callable[..., Any]:
    """``(params, opt_state, batch) -> (params, opt_state, loss)`` over a flat ("data",)
    mesh of the first ``workers`` devices, not jitted (callers jit and donate)."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:workers]), ("data",))

    @jax.shard_map(mesh=mesh, in_specs=(P(), P(), P("data")), out_specs=P())
    def step(params, opt_state, batch):
        # Varying params: otherwise their gradients come back already summed.
        value, grads = jax.value_and_grad(loss)(jax.lax.pcast(params, "data", to="varying"), batch)
        value, grads = jax.lax.pmean((value, grads), "data")
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return step


def psum_over(workers: int) -> tuple[Callable[[Any], Any], jax.sharding.Mesh]:
    """``(psum, mesh)``: a jitted ``lax.psum`` over a flat ("data",) mesh of the first
    ``workers`` devices, its input split over "data" (place it on ``mesh``)."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:workers]), ("data",))
    fn = jax.shard_map(
        lambda x: jax.lax.psum(x, "data"), mesh=mesh, in_specs=P("data"), out_specs=P()
    )
    return jax.jit(fn), mesh
