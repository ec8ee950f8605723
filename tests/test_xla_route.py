"""Config.xla_below_bytes: a small tree is reduced by XLA in the step's program, not the proxies.

The oracle is the reference mode (the same psum over the workers in pure
JAX) and float64 numpy; the runtime's byte counters
(`coarse_jax._ffi.traffic.counted`) show whether the proxies took part.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse
from coarse_jax._ffi.traffic import counted

WORKERS = 4


def _tree(rng, dtype=np.float32):
    return {
        "w": rng.standard_normal((WORKERS, 16, 8)).astype(dtype),
        "b": rng.standard_normal((WORKERS, 8)).astype(dtype),
    }


def _reduce(mesh, cfg, x):
    step = coarse.sync(
        lambda t: coarse.all_reduce(jax.tree.map(lambda v: v[0], t)), mesh, config=cfg
    )
    xs = jax.device_put(x, NamedSharding(mesh, P("data")))
    jax.block_until_ready(step(xs))  # compiled outside the count
    with counted() as t:
        out = jax.tree.map(np.asarray, jax.block_until_ready(step(xs)))
    return out, t


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_small_all_reduce_goes_through_xla_with_the_reference_bits(dtype):
    mesh = coarse.make_mesh(workers=WORKERS)
    x = _tree(np.random.default_rng(0), dtype)
    nbytes = (16 * 8 + 8) * np.dtype(dtype).itemsize
    cfg = coarse.Config(xla_below_bytes=nbytes)
    plan = coarse.plan(jax.tree.map(lambda v: v[0], x), mesh, cfg)
    assert plan.xla and "XLA reduces it" in plan.summary()
    got, traffic = _reduce(mesh, cfg, x)
    assert traffic.read == 0 and traffic.written == 0  # the runtime moved nothing
    want, _ = _reduce(mesh, coarse.Config(mode="reference"), x)
    again, _ = _reduce(mesh, cfg, x)
    for k in x:
        assert got[k].tobytes() == want[k].tobytes() == again[k].tobytes(), k
        tol = 1e-2 if dtype == jnp.bfloat16 else 1e-6
        np.testing.assert_allclose(
            got[k].astype(np.float64), x[k].astype(np.float64).mean(0), rtol=tol, atol=tol
        )


def test_a_tree_one_byte_over_goes_through_the_proxies():
    mesh = coarse.make_mesh(workers=WORKERS)
    x = _tree(np.random.default_rng(1))
    cfg = coarse.Config(xla_below_bytes=(16 * 8 + 8) * 4 - 1)
    assert not coarse.plan(jax.tree.map(lambda v: v[0], x), mesh, cfg).xla
    got, traffic = _reduce(mesh, cfg, x)
    assert traffic.read > 0
    for k in x:
        np.testing.assert_allclose(got[k], x[k].mean(0), rtol=1e-6, atol=1e-6)


def test_value_and_grad_small_tree_matches_reference_and_value_and_update_keeps_the_proxies():
    mesh = coarse.make_mesh(workers=WORKERS)
    rng = np.random.default_rng(2)
    params = {"w": jnp.asarray(rng.standard_normal((8, 4)), jnp.float32)}
    batch = jnp.asarray(rng.standard_normal((WORKERS * 2, 8)), jnp.float32)

    def loss(p, x):
        return jnp.mean((x @ p["w"]) ** 2)

    def grads_with(cfg):
        step = coarse.sync(lambda p, x: coarse.value_and_grad(loss)(p, x), mesh, config=cfg)
        jax.block_until_ready(step(params, batch))
        with counted() as t:
            out = jax.block_until_ready(step(params, batch))
        return jax.tree.map(np.asarray, out), t

    (value, grads), traffic = grads_with(coarse.Config(xla_below_bytes=1 << 10))
    assert traffic.read == 0
    (ref_value, ref_grads), _ = grads_with(coarse.Config(mode="reference"))
    assert value.tobytes() == ref_value.tobytes()
    assert grads["w"].tobytes() == ref_grads["w"].tobytes()

    # value_and_update: the proxies hold the optimizer, so they still do the work.
    opt = coarse.optim.sgd(0.1)

    @coarse.sync(mesh, config=coarse.Config(xla_below_bytes=1 << 10))
    def update(p, x):
        value, p = coarse.value_and_update(loss, opt)(p, x)
        return p, value

    new, _ = update(params, batch)
    with counted() as t:
        jax.block_until_ready(update(new, batch))
    assert t.by_op.get("optimizer", (0, 0))[0] > 0
    want = optax.apply_updates(params, jax.tree.map(lambda g: -0.1 * g, ref_grads))
    np.testing.assert_allclose(np.asarray(new["w"]), np.asarray(want["w"]), rtol=1e-6, atol=1e-6)


def test_xla_below_bytes_is_checked():
    with pytest.raises(ValueError, match=r"Config\.xla_below_bytes"):
        coarse.Config(xla_below_bytes=-1)
