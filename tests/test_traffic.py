"""The bytes a sync moves on the CPU backend: counted by the runtime, predicted from the plan.

`coarse_jax._ffi.byte_counts.counted` reads the runtime's own counters (every
CPU device operation adds the bytes its loop touches); `cpu_traffic` computes
them from the plan alone (`coarse_jax/plan/traffic.py`). They share no code:
the one holds the other to the byte, per operation, for the fused push
(`all_reduce`), the copying push (`value_and_update`, SGD, momentum, Adam,
a clipped norm), shared proxies, DENSE, the leading layers' worker ring, f32
and bf16. Only the runtime's tokens and pass-through outputs (``bytes``, a
few dozen bytes) are left out of the prediction.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse
from coarse_jax._ffi.byte_counts import counted
from coarse_jax.mesh import workers_mesh
from coarse_jax.plan.traffic import cpu_traffic

WORKERS = 4


def _tree(dtype) -> dict[str, jax.ShapeDtypeStruct]:
    # Leaf order (flatten order): a, b, c; the leading layers are the first.
    return {
        "a": jax.ShapeDtypeStruct((300,), dtype),
        "b": jax.ShapeDtypeStruct((96, 130), dtype),
        "c": jax.ShapeDtypeStruct((7000,), dtype),
    }


def _per_worker(shapes, p: int, mesh):
    rng = np.random.default_rng(0)
    vals = jax.tree.map(lambda s: rng.standard_normal((p, *s.shape)).astype(s.dtype), shapes)
    return jax.device_put(vals, NamedSharding(workers_mesh(mesh), P("data")))


def _check(counted_traffic, predicted) -> None:
    got = dict(counted_traffic.by_op)
    tokens = got.pop("bytes", (0, 0))
    assert got == predicted.by_op, (got, predicted.by_op)
    assert tokens[0] <= 1024 and tokens[1] <= 1024, tokens


@pytest.mark.parametrize(
    ("proxies", "dtype", "leading", "dense"),
    [
        (4, jnp.float32, 0, False),
        (2, jnp.float32, 0, False),
        (1, jnp.float32, 0, False),
        (4, jnp.bfloat16, 0, False),
        (4, jnp.float32, 1200, False),
        (2, jnp.bfloat16, 1200, False),
        (4, jnp.float32, 0, True),
    ],
)
def test_all_reduce_moves_what_the_plan_says(proxies, dtype, leading, dense):
    mesh = coarse.make_mesh(workers=WORKERS, proxies=proxies)
    routes = ((0, 0),) * WORKERS if dense else None
    # xla_below_bytes=0: the runtime's traffic, however small the tree.
    cfg = coarse.Config(leading_bytes=leading, shard_bytes=8192, routes=routes, xla_below_bytes=0)
    shapes = _tree(dtype)
    x = _per_worker(shapes, WORKERS, mesh)

    @coarse.sync(mesh, config=cfg)
    def step(v):
        return coarse.all_reduce(jax.tree.map(lambda t: t[0], v))

    jax.block_until_ready(step(x))
    with counted() as t:
        jax.block_until_ready(step(x))
    predicted = cpu_traffic(coarse.diagnostics.plan(shapes, mesh, cfg))
    _check(t, predicted)
    if not leading and dtype == jnp.float32:
        # The fused push: p·B read by the proxies' sums, p·B read again by the pulls.
        assert predicted.read == 2 * predicted.minimum[0]


@pytest.mark.parametrize(
    ("proxies", "optimizer", "slots", "clip", "dtype"),
    [
        (4, "sgd", 0, False, jnp.float32),
        (2, "sgd", 0, False, jnp.float32),
        (1, "momentum", 1, False, jnp.float32),
        (4, "adam", 2, True, jnp.float32),
        (2, "adamw", 2, False, jnp.bfloat16),
    ],
)
def test_value_and_update_moves_what_the_plan_says(proxies, optimizer, slots, clip, dtype):
    mesh = coarse.make_mesh(workers=WORKERS, proxies=proxies)
    cfg = coarse.Config(leading_bytes=0, shard_bytes=8192, xla_below_bytes=0)
    kw = {"clip_norm": 1.0} if clip else {}
    opt = {
        "sgd": lambda: coarse.optim.sgd(0.01, **kw),
        "momentum": lambda: coarse.optim.sgd(0.01, momentum=0.9, **kw),
        "adam": lambda: coarse.optim.adam(1e-3, **kw),
        "adamw": lambda: coarse.optim.adamw(1e-3, **kw),
    }[optimizer]()
    params = {"w": jnp.zeros((64, 96), dtype), "b": jnp.zeros((96,), dtype)}
    batch = {"x": jnp.ones((8 * WORKERS, 64), dtype), "y": jnp.ones((8 * WORKERS, 96), dtype)}

    def loss(prm, b):
        return jnp.mean((b["x"] @ prm["w"] + prm["b"] - b["y"]).astype(jnp.float32) ** 2)

    @coarse.sync(mesh, config=cfg, donate_argnums=0)
    def step(prm, b):
        value, prm = coarse.value_and_update(loss, opt)(prm, b)
        return prm, value

    params, _ = step(params, batch)
    params, _ = step(params, batch)
    jax.block_until_ready(params)
    with counted() as t:
        params, _ = step(params, batch)
        jax.block_until_ready(params)
    # The step's plan: the params' leaves, then its value (the loss), synced with them.
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params)
    planned = (shapes, jax.ShapeDtypeStruct((), jnp.float32))
    for checked in (False, True):
        predicted = cpu_traffic(
            coarse.diagnostics.plan(planned, mesh, cfg),
            optimizer_slots=slots,
            updated_leaves=2,
            clip=clip,
            params_checked=checked,
        )
        _check(t, predicted)
        # New arrays of the same values: the proxies check them.
        params = jax.tree.map(lambda a: jnp.array(a, copy=True), params)
        jax.block_until_ready(params)
        with counted() as t:
            params, _ = step(params, batch)
            jax.block_until_ready(params)
