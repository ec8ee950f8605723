"""The baselines the benchmarks measure coarse against: a data-parallel step with
``jax.value_and_grad`` + ``lax.pmean`` + an optax update (test_memory.py,
test_snapshots.py), ``lax.psum`` over the first devices (the all-reduce
benchmarks), a jitted step with optax on one device, and JAX's own host offloading
of the optimizer state (the host proxies' benchmarks); imported from this folder,
as pytest puts it on ``sys.path``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax
from helpers import pmean_optax_body
from jax.sharding import PartitionSpec as P


def pmean_optax_step(
    workers: int, loss: Callable[..., Any], tx: optax.GradientTransformation
) -> Callable[..., Any]:
    """``(params, opt_state, batch) -> (params, opt_state, loss)`` over a flat ("data",)
    mesh of the first ``workers`` devices, not jitted (callers jit and donate): the
    tests' oracle (tests/helpers.py)."""
    return pmean_optax_body(workers, tx, loss)


def psum_over(workers: int) -> tuple[Callable[[Any], Any], jax.sharding.Mesh]:
    """``(psum, mesh)``: a jitted ``lax.psum`` over a flat ("data",) mesh of the first
    ``workers`` devices, its input split over "data" (place it on ``mesh``)."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:workers]), ("data",))
    fn = jax.shard_map(
        lambda x: jax.lax.psum(x, "data"), mesh=mesh, in_specs=P("data"), out_specs=P()
    )
    return jax.jit(fn), mesh


def _optax_step(loss: Callable[..., Any], tx: optax.GradientTransformation) -> Callable[..., Any]:
    def step(params, opt_state, batch):
        value, grads = jax.value_and_grad(loss)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return step


def jit_optax_step(
    loss: Callable[..., Any], tx: optax.GradientTransformation
) -> Callable[..., Any]:
    """``jax.jit`` of ``(params, opt_state, batch) -> (params, opt_state, loss)``:
    ``jax.value_and_grad`` and an optax update, everything on the arguments' device."""
    return jax.jit(_optax_step(loss, tx))


def pinned_host_offload_step(
    loss: Callable[..., Any], tx: optax.GradientTransformation, device: jax.Device
) -> tuple[Callable[..., Any], jax.sharding.Sharding]:
    """JAX's own host offloading of the optimizer state, as its "Memories and Host
    Offloading" guide shows: the optax state lives in ``device``'s ``pinned_host`` memory
    between steps, and each step moves it to the device, updates, and moves it back.

    Returns ``(step, state_sharding)``: ``step(params, opt_state, batch) -> (params,
    opt_state, loss)``, jitted with params and state donated; place the state with
    ``state_sharding`` first."""
    on_device = jax.sharding.SingleDeviceSharding(device)
    on_host = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")

    update = _optax_step(loss, tx)

    def step(params, opt_state, batch):
        params, opt_state, value = update(params, jax.device_put(opt_state, on_device), batch)
        return params, jax.device_put(opt_state, on_host), value

    jitted = jax.jit(step, out_shardings=(on_device, on_host, on_device), donate_argnums=(0, 1))
    return jitted, on_host
