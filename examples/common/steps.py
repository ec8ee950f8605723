"""The train steps the comparison examples race: coarse's, and ``shard_map`` + ``lax.pmean``'s.

A step is ``step(state, batch) -> (state, loss)`` on a Flax ``TrainState``.
``make_loss(apply_fn)`` returns one worker's mean loss ``loss(params, batch)``.
Besides the two steps: pmean with the workers summed in reverse
(`REVERSED`, the noise floor), the gradient sync alone (`sync_only`, for
timing) and the baseline's mesh (`pmean_mesh`): inputs go on the mesh a step runs on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax.training import train_state
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse

Batch = dict[str, Any]
LossFn = Callable[[Any, Batch], jax.Array]
MakeLoss = Callable[[Callable[..., Any]], LossFn]
StepFn = Callable[[train_state.TrainState, Batch], tuple[train_state.TrainState, jax.Array]]

IMPLS = ("coarse", "pmean")
# The noise-floor run: pmean's step with the worker gradients summed in another,
# equally valid float32 order (see `reversed_mean`).
REVERSED = "pmean-reversed"


def coarse_train_step(mesh: Mesh, cfg: coarse.Config, make_loss: MakeLoss) -> StepFn:
    """A step whose gradients are synchronized by coarse (proxies + worker ring).

    ``make_loss`` gets ``state.apply_fn`` and is closed over rather than
    passed: `coarse.value_and_grad` traces every positional argument as an array.
    """

    @coarse.sync(mesh, config=cfg)
    def train_step(state: train_state.TrainState, batch: Batch) -> Any:
        loss, grads = coarse.value_and_grad(make_loss(state.apply_fn))(state.params, batch)
        # grads are identical on every worker, so every worker
        # applies the same update and the replicated state stays replicated.
        return state.apply_gradients(grads=grads), loss

    return train_step


def coarse_proxy_train_step(
    mesh: Mesh, cfg: coarse.Config, make_loss: MakeLoss, optimizer: coarse.optim.ProxyOptimizer
) -> StepFn:
    """A step whose optimizer runs on the proxies (`coarse.value_and_update`).

    The state's ``tx`` is ``optax.identity()``: the workers hold no optimizer
    state; the proxies keep the momentum and an f32 master of the params.
    """

    @coarse.sync(mesh, config=cfg)
    def train_step(state: train_state.TrainState, batch: Batch) -> Any:
        loss, params = coarse.value_and_update(make_loss(state.apply_fn), optimizer)(
            state.params, batch
        )
        return state.replace(step=state.step + 1, params=params), loss

    return train_step


def reversed_mean(x: jax.Array, axis: str = "data") -> jax.Array:
    """The mean over ``axis``, summed from the last worker to the first: ``((x3 + x2) + x1) + x0``.

    The same p terms as ``lax.pmean`` adds, in another order, so it is an
    equally valid float32 mean; the difference between training with it and
    with ``lax.pmean`` is the noise floor of any two all-reduce orders. The
    workers' values are gathered by a ``psum`` in which each slot holds one
    worker's value and p - 1 exact zeros (so the gather is exact and its
    result replicated), then added one at a time: XLA does not reassociate
    float additions.
    """
    p = lax.axis_size(axis)
    slots = jnp.zeros((p, *x.shape), x.dtype).at[lax.axis_index(axis)].set(x)
    xs = lax.psum(slots, axis)
    total = xs[p - 1]
    for i in range(p - 2, -1, -1):
        total = total + xs[i]
    return total / p


def worker_mean(tree: Any, impl: str) -> Any:
    """The mean of ``tree`` over the "data" workers: ``lax.pmean`` or, for `REVERSED`, reversed."""
    if impl == "pmean":
        return lax.pmean(tree, "data")
    if impl == REVERSED:
        return jax.tree.map(reversed_mean, tree)
    raise ValueError(f"impl must be 'pmean' or {REVERSED!r}, got {impl!r}")


def pmean_train_step(mesh: Mesh, make_loss: MakeLoss, impl: str = "pmean") -> StepFn:
    """The same step with ``jax.value_and_grad`` + ``lax.pmean`` over a 1-D ("data",) mesh.

    ``impl=REVERSED`` sums the workers' gradients (and losses) in the reverse
    order instead (`reversed_mean`): the noise-floor run.
    """

    def train_step(state: train_state.TrainState, batch: Batch) -> Any:
        # Mark the replicated params as varying over "data": otherwise the
        # vjp of their implicit broadcast already psums the gradients and the
        # mean below would see sums, not per-worker gradients.
        params = lax.pcast(state.params, "data", to="varying")
        loss, grads = jax.value_and_grad(make_loss(state.apply_fn))(params, batch)
        loss, grads = worker_mean((loss, grads), impl)
        return state.apply_gradients(grads=grads), loss

    return jax.jit(jax.shard_map(train_step, mesh=mesh, in_specs=(P(), P("data")), out_specs=P()))


def pmean_gradients(mesh: Mesh, loss: LossFn, impl: str = "pmean") -> Callable[[Any, Batch], Any]:
    """``grads(params, batch)``: the workers' mean gradients of ``loss``, the pmean step's way."""

    def per_worker(params: Any, batch: Batch) -> Any:
        return worker_mean(jax.grad(loss)(lax.pcast(params, "data", to="varying"), batch), impl)

    return jax.jit(jax.shard_map(per_worker, mesh=mesh, in_specs=(P(), P("data")), out_specs=P()))


def coarse_gradients(mesh: Mesh, cfg: coarse.Config, loss: LossFn) -> Callable[[Any, Batch], Any]:
    """``grads(params, batch)``: the workers' mean gradients of ``loss``, the coarse step's way."""

    @coarse.sync(mesh, config=cfg)
    def grads(params: Any, batch: Batch) -> Any:
        return coarse.value_and_grad(loss)(params, batch)[1]

    return grads


def sync_only(mesh: Mesh, impl: str, cfg: coarse.Config | None = None) -> Callable[[Any], Any]:
    """Only ``impl``'s gradient sync of a per-worker tree, as a jitted function.

    The argument is a gradient-shaped tree with a leading axis of one slice per
    worker, placed split over "data", so every worker reduces its own values,
    as after a backward pass. ``impl``: "coarse" (``coarse.all_reduce`` under
    ``coarse.sync`` on the coarse ``mesh`` with ``cfg``), "pmean" or
    `REVERSED` (on a 1-D mesh).
    """
    if impl == "coarse":

        @coarse.sync(mesh, config=cfg)
        def coarse_sync(per_worker: Any) -> Any:
            return coarse.all_reduce(jax.tree.map(lambda x: x[0], per_worker))

        return coarse_sync

    def pmean_sync(per_worker: Any) -> Any:
        return worker_mean(jax.tree.map(lambda x: x[0], per_worker), impl)

    return jax.jit(jax.shard_map(pmean_sync, mesh=mesh, in_specs=P("data"), out_specs=P()))


def mesh_for(impl: str, coarse_mesh: Mesh) -> Mesh:
    """The mesh ``impl``'s step runs on: ``coarse_mesh``, or a 1-D one over its workers."""
    return coarse_mesh if impl == "coarse" else pmean_mesh(coarse_mesh.shape["data"])


def pmean_mesh(workers: int) -> Mesh:
    """The baseline's 1-D mesh: the first ``workers`` devices (coarse's worker tier)."""
    return Mesh(np.array(jax.devices()[:workers]), ("data",))


def leading_bytes(params: Any, modules: int) -> int:
    """Bytes of the first ``modules`` top-level Flax modules, in flatten (sorted-key) order.

    That is the prefix of the flatten order that `coarse.Config.leading_bytes`
    takes, so these modules are reduced among the workers (dual sync).
    """
    tree = params["params"]
    first = [tree[k] for k in sorted(tree)[:modules]]
    return sum(leaf.nbytes for leaf in jax.tree.leaves(first))
