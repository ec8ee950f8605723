"""Oracles and helpers for the tests: the oracles share no code with coarse_jax."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np


def mlp_init(key: jax.Array, sizes: tuple[int, ...], dtype=jnp.float32) -> dict:
    """A dict of layers; flatten order = layer order ("l0", "l1", ...; < 10 layers)."""
    params = {}
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        key, k1, k2 = jax.random.split(key, 3)
        params[f"l{i}"] = {
            "b": (jax.random.normal(k2, (b,)) * 0.1).astype(dtype),
            "w": (jax.random.normal(k1, (a, b)) / np.sqrt(a)).astype(dtype),
        }
    return params


def mlp_loss(params: dict, batch: dict) -> jax.Array:
    x = batch["x"]
    n = len(params)
    for i in range(n):
        layer = params[f"l{i}"]
        x = x.astype(layer["w"].dtype) @ layer["w"] + layer["b"]
        if i < n - 1:
            x = jnp.tanh(x)
    return jnp.mean((x.astype(jnp.float32) - batch["y"]) ** 2)


def make_batch(key: jax.Array, n: int, d_in: int, d_out: int) -> dict:
    k1, k2 = jax.random.split(key)
    return {"x": jax.random.normal(k1, (n, d_in)), "y": jax.random.normal(k2, (n, d_out))}


def per_worker_mean(fun, params, batch, workers: int):
    """Value and gradient of each worker's slice on one device, averaged in float64."""
    n = jax.tree.leaves(batch)[0].shape[0] // workers
    slices = [jax.tree.map(lambda x, lo=i * n: x[lo : lo + n], batch) for i in range(workers)]
    results = [jax.jit(jax.value_and_grad(fun))(params, s) for s in slices]
    loss = np.mean([np.float64(r[0]) for r in results])
    grads = jax.tree.map(
        lambda *gs: np.mean([np.asarray(g, np.float64) for g in gs], axis=0),
        *[r[1] for r in results],
    )
    return loss, grads


def assert_tree_close(actual, expected, rtol: float, atol_scale: float) -> None:
    """allclose leaf by leaf; atol = atol_scale * max|expected| absorbs cancellation."""
    for path, a in jax.tree_util.tree_flatten_with_path(actual)[0]:
        e = expected
        for k in path:
            e = e[k.key] if hasattr(k, "key") else e[k.idx]
        e = np.asarray(e, np.float64)
        atol = atol_scale * (np.max(np.abs(e)) if e.size else 0.0)
        np.testing.assert_allclose(
            np.asarray(a, np.float64), e, rtol=rtol, atol=atol, err_msg=jax.tree_util.keystr(path)
        )


def assert_replicated(tree) -> None:
    """Every device of the mesh holds bitwise the same value of every leaf."""
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        shards = [np.asarray(s.data) for s in x.addressable_shards]
        assert len(shards) == len(x.sharding.device_set)
        for s in shards[1:]:
            assert s.tobytes() == shards[0].tobytes(), (
                f"{jax.tree_util.keystr(path)} differs across devices"
            )


def gpu_or_skip():
    """The first GPU jax sees and coarse_jax's CUDA module; skips the test without a GPU.

    A GPU without the module fails the test: the build should have made it.
    """
    import pytest

    import coarse_jax

    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        pytest.skip("no GPU visible to jax")
    support = coarse_jax.has_cuda_support()
    if not support:
        pytest.fail(f"a GPU is visible but coarse_jax cannot use it: {support.reason}")
    from coarse_jax._ffi import cuda_module  # from a source build or the CUDA wheel

    return gpus[0], cuda_module()


def pmean_optax_step(workers: int, tx, loss_fn=None):
    """The oracle train step: ``jax.value_and_grad`` + ``lax.pmean`` + an optax update over
    a flat ("data",) mesh of the first ``workers`` devices; ``(params, opt_state, batch)``
    -> ``(params, opt_state, loss)``. Shares no code with coarse_jax."""
    return jax.jit(pmean_optax_body(workers, tx, loss_fn))


def pmean_optax_body(workers: int, tx, loss_fn=None):
    """`pmean_optax_step` not jitted (benchmarks/baselines.py jits and donates it)."""
    import optax
    from jax.sharding import PartitionSpec as P

    loss_fn = loss_fn or mlp_loss
    flat = jax.sharding.Mesh(np.array(jax.devices()[:workers]), ("data",))

    @jax.shard_map(mesh=flat, in_specs=(P(), P(), P("data")), out_specs=P())
    def step(params, opt_state, batch):
        # Varying params: otherwise their gradients come back already summed.
        loss, grads = jax.value_and_grad(loss_fn)(
            jax.lax.pcast(params, "data", to="varying"), batch
        )
        loss, grads = jax.lax.pmean((loss, grads), "data")
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def crossing_config(p: int, q: int):
    """A `coarse.Config` for p workers and q proxies whose routes cross the groups: every
    worker's small pieces to the next group's proxy, large ones two groups on, and tiny
    shards, so every proxy serves pushes from other groups' workers, several per leaf."""
    import coarse_jax as coarse

    k = p // q
    return coarse.Config(
        shard_bytes=128,
        latency_threshold_bytes=100,
        routes=tuple(((i // k + 1) % q, (i // k + 2) % q) for i in range(p)),
    )


def reordered_mean_optax_step(workers: int, tx, loss_fn=None):
    """The noise-floor oracle: `pmean_optax_step` with the mean over workers summed in
    reverse worker order (gathered, then added last to first) instead of XLA's psum.

    Another reduction order rounds differently, as another CPU's codegen or
    coarse_jax's ring does: how far this run drifts from `pmean_optax_step` over
    a long trajectory is the noise floor a tolerance is derived from.
    """
    import optax
    from jax.sharding import PartitionSpec as P

    loss_fn = loss_fn or mlp_loss
    flat = jax.sharding.Mesh(np.array(jax.devices()[:workers]), ("data",))

    def mean_reversed(x):
        every = jax.lax.all_gather(x, "data", to="invarying")
        total = every[workers - 1]
        for i in range(workers - 2, -1, -1):
            total = total + every[i]
        return total / workers

    @jax.jit
    @jax.shard_map(mesh=flat, in_specs=(P(), P(), P("data")), out_specs=P())
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(
            jax.lax.pcast(params, "data", to="varying"), batch
        )
        loss, grads = jax.tree.map(mean_reversed, (loss, grads))
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def relative_distances(actual, expected) -> dict[str, float]:
    """Per leaf ``||actual - expected||_2 / ||expected||_2`` in float64, by key path."""
    out = {}
    for (path, a), e in zip(
        jax.tree_util.tree_flatten_with_path(actual)[0], jax.tree.leaves(expected), strict=True
    ):
        a, e = np.asarray(a, np.float64), np.asarray(e, np.float64)
        out[jax.tree_util.keystr(path)] = float(
            np.linalg.norm(a - e) / max(float(np.linalg.norm(e)), 1e-30)
        )
    return out


def coarse_update_step(mesh, opt, config=None, loss_fn=None, snapshots=None):
    """``(params, batch) -> (params, loss)`` with `coarse.value_and_update` under `coarse.sync`."""
    import coarse_jax as coarse

    loss_fn = loss_fn or mlp_loss

    @coarse.sync(mesh, config=config, snapshots=snapshots)
    def step(params, batch):
        loss, params = coarse.value_and_update(loss_fn, opt)(params, batch)
        return params, loss

    return step
