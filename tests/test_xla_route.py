"""Config.xla_below_bytes: a small tree is reduced by XLA in the step's program, not the proxies.

The oracle is the reference mode (the same psum over the workers in pure
JAX) and float64 numpy; the runtime's byte counters
(`coarse_jax._ffi.byte_counts.counted`) show whether the proxies took part.
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
from coarse_jax._ffi.byte_counts import counted
from coarse_jax.testing import set_default_xla_below_bytes

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
    plan = coarse.diagnostics.plan(jax.tree.map(lambda v: v[0], x), mesh, cfg)
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
    assert not coarse.diagnostics.plan(jax.tree.map(lambda v: v[0], x), mesh, cfg).xla
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


# ``"auto"``, the default (the suite sets 0 with
# coarse_jax.testing.set_default_xla_below_bytes, tests/conftest.py, so these tests name it).
AUTO = coarse.Config(xla_below_bytes="auto")


def test_auto_sends_a_tree_up_to_the_latency_threshold_through_xla_on_cpu():
    mesh = coarse.make_mesh(workers=WORKERS)
    x = _tree(np.random.default_rng(3))
    small = jax.tree.map(lambda v: v[0], x)
    plan = coarse.diagnostics.plan(small, mesh, AUTO)
    assert plan.xla and plan.xla_below_bytes == AUTO.latency_threshold_bytes
    assert "latency route" in plan.summary() and "XLA psum" in plan.summary()
    got, traffic = _reduce(mesh, AUTO, x)
    assert traffic.read == 0 and traffic.written == 0
    want, _ = _reduce(mesh, coarse.Config(mode="reference"), x)
    for k in x:
        assert got[k].tobytes() == want[k].tobytes(), k
    # The cap is the latency threshold: one byte less than the tree, the proxies.
    tight = coarse.Config(xla_below_bytes="auto", latency_threshold_bytes=plan.total_bytes - 1)
    assert not coarse.diagnostics.plan(small, mesh, tight).xla
    got, traffic = _reduce(mesh, tight, x)
    assert traffic.read > 0
    big = {"w": jnp.zeros((AUTO.latency_threshold_bytes // 4 + 1,), jnp.float32)}
    assert not coarse.diagnostics.plan(big, mesh, AUTO).xla


def test_auto_keeps_the_proxies_with_emulated_links_hosts_or_no_mesh():
    tree = {"w": jnp.zeros((8,), jnp.float32)}
    mesh = coarse.make_mesh(workers=WORKERS)
    topo = coarse.Config(xla_below_bytes="auto", topology=coarse.Topology.preset("v100", WORKERS))
    plan = coarse.diagnostics.plan(tree, mesh, topo)
    assert not plan.xla and "emulated" in plan.summary()
    assert not coarse.diagnostics.plan(tree, WORKERS, AUTO).xla  # a number of workers: no platform
    devices = np.array(jax.devices()[:8], dtype=object)
    host_mesh = jax.sharding.Mesh(devices.reshape(1, 2, 4), ("host", "tier", "data"))
    plan = coarse.diagnostics.plan(tree, host_mesh, AUTO)
    assert not plan.xla and "across hosts" in plan.summary()


def test_the_route_reduces_a_mixed_tree_as_one_collective_with_the_reference_bits():
    from coarse_jax.api import _latency_route
    from coarse_jax.mesh import workers_mesh

    mesh = coarse.make_mesh(workers=WORKERS)
    rng = np.random.default_rng(4)
    x = {
        "a": rng.standard_normal((WORKERS, 3, 5)).astype(np.float32),
        "b": rng.standard_normal((WORKERS, 7)).astype(jnp.bfloat16),
        "c": rng.standard_normal((WORKERS,)).astype(np.float32),
        "d": rng.standard_normal((WORKERS, 0)).astype(np.float32),
        "e": rng.standard_normal((WORKERS, 2, 2)).astype(np.float16),
    }
    got, traffic = _reduce(mesh, AUTO, x)
    assert traffic.read == 0
    want, _ = _reduce(mesh, coarse.Config(mode="reference"), x)
    for k in x:
        assert got[k].dtype == x[k].dtype and got[k].shape == x[k].shape[1:], k
        assert got[k].tobytes() == want[k].tobytes(), k
        tol = 1e-2 if x[k].dtype != np.float32 else 1e-6
        np.testing.assert_allclose(
            got[k].astype(np.float64), x[k].astype(np.float64).mean(0), rtol=tol, atol=tol
        )
    # One all-reduce for the five leaves (a psum per leaf costs XLA:CPU ~90 us each).
    leaves = jax.tree.leaves(x)
    fn = jax.jit(
        jax.shard_map(
            lambda *v: _latency_route.all_reduce(
                [t[0] for t in v], WORKERS, where="test", platform="cpu"
            ),
            mesh=workers_mesh(mesh),
            in_specs=P("data"),
            out_specs=P(),
        )
    )
    hlo = fn.lower(*leaves).as_text()
    assert hlo.count("all_reduce") + hlo.count("all-reduce") == 1, hlo


def test_the_route_refuses_vmap_differentiation_and_a_per_device_predicate_alike():
    from jax import lax

    mesh = coarse.make_mesh(workers=2)

    @coarse.sync(mesh, config=AUTO)
    def rows(x):
        return jax.vmap(lambda r: coarse.all_reduce(r))(x)

    with pytest.raises(TypeError, match=r"coarse\.all_reduce was traced under jax\.vmap.*Fix"):
        rows(jnp.ones((2, 3)))

    @coarse.sync(mesh, config=AUTO)
    def grad_of(x):
        return jax.grad(lambda v: jnp.sum(coarse.all_reduce(v)))(x)

    with pytest.raises(TypeError, match=r"coarse\.all_reduce was differentiated.*Fix"):
        grad_of(jnp.ones(4))

    @coarse.sync(mesh, config=AUTO)
    def branch(x, batch):
        return lax.cond(batch.sum() > 0, lambda v: coarse.all_reduce(v), lambda v: -v, x)

    with pytest.raises(
        TypeError,
        match=r"coarse\.all_reduce is traced inside a lax\.cond.*latency route.*Fix: call it",
    ):
        branch(jnp.ones(4), jnp.arange(6.0).reshape(2, 3))


@pytest.mark.parametrize("value", ["auto", 0, 4096])
def test_the_default_comes_from_the_testing_hook_only(monkeypatch, value):
    """A test sets the default in its own process; the environment has no say."""
    monkeypatch.setenv("COARSE_JAX_XLA_BELOW_BYTES", "12345")  # the old variable: ignored
    before = set_default_xla_below_bytes(value)
    try:
        assert coarse.Config().xla_below_bytes == value
        assert coarse.Config(xla_below_bytes=64).xla_below_bytes == 64
        with pytest.raises(ValueError, match=r"expected .auto. or a non-negative int.*Fix"):
            set_default_xla_below_bytes("small")
        assert coarse.Config().xla_below_bytes == value  # a refused value changes nothing
    finally:
        set_default_xla_below_bytes(before)
    assert coarse.Config().xla_below_bytes == 0  # the suite's (tests/conftest.py)


def test_a_reprofile_that_moves_the_threshold_across_a_tree_recompiles():
    """With "auto" the cap is the latency threshold: a re-profile that moves it below a tree
    sends the tree to the proxies, even where its pieces' routes stay the same."""
    from coarse_jax.api.reprofile import changes_plans

    mesh = coarse.make_mesh(workers=WORKERS)
    plans = [(jax.ShapeDtypeStruct((256,), jnp.float32), {})]
    old = coarse.Config(xla_below_bytes="auto")
    assert changes_plans(mesh, plans, old, coarse.Config(xla_below_bytes="auto", shard_bytes=8))
    assert not changes_plans(mesh, plans, old, old)
    moved = coarse.Config(xla_below_bytes="auto", latency_threshold_bytes=512)  # under 1 KiB
    assert changes_plans(mesh, plans, old, moved)
