"""coarse.all_reduce against numpy means of the per-worker values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_replicated
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse


def _reduce_step(mesh, cfg, op="mean"):
    """Step whose batch holds one tree per worker (leading axis = worker)."""

    @coarse.sync(mesh, config=cfg)
    def step(per_worker):
        mine = jax.tree.map(lambda x: x[0], per_worker)  # this worker's slice
        return coarse.all_reduce(mine, op=op)

    return step


def _random_tree(rng, shapes, workers, dtype=np.float32):
    return {
        f"t{i:04d}": rng.standard_normal((workers, *s)).astype(dtype) for i, s in enumerate(shapes)
    }


def _expect(tree, op):
    f = np.mean if op == "mean" else np.sum
    return {k: f(v.astype(np.float64), axis=0) for k, v in tree.items()}


def _check(out, tree, op="mean", rtol=1e-6):
    want = _expect(tree, op)
    for k, v in want.items():
        got = np.asarray(out[k], np.float64)
        np.testing.assert_allclose(
            got, v, rtol=rtol, atol=rtol * (np.abs(v).max() if v.size else 0), err_msg=k
        )


@pytest.mark.parametrize("mode", ["ffi", "reference"])
@pytest.mark.parametrize(
    "dtype,rtol", [(np.float32, 1e-6), (jnp.bfloat16, 1e-2), (np.float16, 2e-3)]
)
@pytest.mark.parametrize("op", ["mean", "sum"])
def test_dtypes_and_ops(mode, dtype, rtol, op):
    mesh = coarse.make_mesh(workers=4)
    rng = np.random.default_rng(0)
    tree = _random_tree(rng, [(), (1,), (7,), (3, 5), (1000,)], 4, np.float32)
    tree = {k: v.astype(dtype) for k, v in tree.items()}
    cfg = coarse.Config(mode=mode, shard_bytes=512, leading_bytes=28)
    out = _reduce_step(mesh, cfg, op)(tree)
    assert all(out[k].dtype == tree[k].dtype and out[k].shape == tree[k].shape[1:] for k in tree)
    _check(out, {k: v.astype(np.float32) for k, v in tree.items()}, op, rtol)
    assert_replicated(out)


def test_two_thousand_small_leaves_few_pushes():
    mesh = coarse.make_mesh(workers=4)
    rng = np.random.default_rng(1)
    shapes = [(int(rng.integers(1, 20)),) for _ in range(2000)]
    tree = _random_tree(rng, shapes, 4)
    cfg = coarse.Config(shard_bytes=64 << 10)
    plan = coarse.diagnostics.plan(jax.tree.map(lambda x: x[0], tree), mesh, cfg)
    assert len(plan.buckets) <= 4, "small leaves must be batched: one push per bucket, not per leaf"
    _check(_reduce_step(mesh, cfg)(tree), tree)


def test_one_tensor_many_shards():
    mesh = coarse.make_mesh(workers=4)
    rng = np.random.default_rng(2)
    tree = _random_tree(rng, [(100_003,)], 4)
    cfg = coarse.Config(shard_bytes=4096)
    plan = coarse.diagnostics.plan(jax.tree.map(lambda x: x[0], tree), mesh, cfg)
    assert len(plan.pieces) >= 50
    out = _reduce_step(mesh, cfg)(tree)
    _check(out, tree)
    assert_replicated(out)


def test_crossing_routes_fig10():
    """Paper Fig. 10: clients send tensors to crossing proxies; FCFS would deadlock."""
    mesh = coarse.make_mesh(workers=4)
    rng = np.random.default_rng(3)
    tree = _random_tree(rng, [(10,), (5000,), (3,), (3000,), (40,)], 4)
    cfg = coarse.Config(
        shard_bytes=4096,
        latency_threshold_bytes=1024,
        routes=tuple((i, (i + 1) % 4) for i in range(4)),
    )
    plan = coarse.diagnostics.plan(jax.tree.map(lambda x: x[0], tree), mesh, cfg)
    assert {pc.dest for pc in plan.pieces} == {(0, 1, 2, 3), (1, 2, 3, 0)}  # both kinds used
    step = _reduce_step(mesh, cfg)
    for _ in range(5):
        _check(step(tree), tree)


def test_random_routes_200_steps():
    mesh = coarse.make_mesh(workers=4)
    rng = np.random.default_rng(4)
    shapes = [(int(rng.integers(1, 3000)),) for _ in range(12)]
    for trial in range(4):
        routes = tuple(tuple(int(v) for v in rng.integers(0, 4, 2)) for _ in range(4))
        cfg = coarse.Config(
            shard_bytes=2048,
            latency_threshold_bytes=1024,
            leading_bytes=trial * 1000,
            routes=routes,
        )
        step = _reduce_step(mesh, cfg)
        for _ in range(5):
            # Ten steps dispatched back to back, then every one of them checked.
            trees = [_random_tree(rng, shapes, 4) for _ in range(10)]
            outs = [step(tree) for tree in trees]
            for out, tree in zip(outs, trees, strict=True):
                _check(out, tree)


def test_the_program_spans_the_workers_only():
    """The proxies run no XLA program: the step runs on the workers (tier 0, "tier" of
    size 1), and its outputs live on the workers (the proxies' work is the runtime's
    service)."""
    mesh = coarse.make_mesh(workers=2)

    @coarse.sync(mesh)
    def step(x):
        assert jax.lax.axis_size("data") == 2
        return coarse.all_reduce(x[0], op="sum"), jax.lax.psum(1, "data")

    x = np.arange(2 * 5, dtype=np.float32).reshape(2, 5)
    total, devices = step(x)
    np.testing.assert_allclose(total, x.sum(0))
    assert int(devices) == 2
    assert total.sharding.device_set == set(mesh.devices[0])

    @coarse.sync(mesh)
    def tiered(x):
        return jax.lax.axis_index("tier"), jax.lax.axis_size("tier")

    index, size = tiered(x)
    assert (int(index), size) == (0, 1)


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_cpu_path_gives_the_ring_bits(workers):
    """On CPU the proxies read the pushes in place and reduce-scatter them in one pass,
    and the pulls read the owned chunks in place (PushesInPlace, GatherPull); on
    emulated links the pushes are copied and the proxies run the rings and the
    all-gather, as on GPUs. Both add in the same order: the results are bitwise equal,
    with one client per proxy, with crossing routes, with several clients on one proxy
    and none on the others (every piece on proxy 0: its holder sums them), and with
    pieces split between two shared proxies; for f32 and bf16 leaves."""
    mesh = coarse.make_mesh(workers=workers)
    rng = np.random.default_rng(workers)
    x = {
        "a": rng.standard_normal((workers, 1000, 37)).astype(np.float32),
        "b": rng.standard_normal((workers, 5)).astype(np.float32),
        "c": rng.standard_normal((workers, 3000)).astype(jnp.bfloat16),
    }
    xs = jax.device_put(x, NamedSharding(mesh, P("data")))
    want = {k: v.astype(np.float64).mean(0) for k, v in x.items()}
    for routes in (
        None,
        tuple((i, (i + 1) % workers) for i in range(workers)),
        ((0, 0),) * workers,
        ((0, 1),) * workers,
    ):
        got = []
        for topology in (None, coarse.Topology.preset("v100", workers, clock="virtual")):
            cfg = coarse.Config(
                shard_bytes=4096, latency_threshold_bytes=1024, topology=topology, routes=routes
            )
            step = coarse.sync(
                lambda t: coarse.all_reduce(jax.tree.map(lambda v: v[0], t)), mesh, config=cfg
            )
            got.append(jax.tree.map(np.asarray, jax.block_until_ready(step(xs))))
        for k in x:
            tol = (1e-2, 1e-2) if k == "c" else (1e-5, 1e-6)  # bf16 keeps 8 bits
            np.testing.assert_allclose(
                got[0][k].astype(np.float64), want[k], rtol=tol[0], atol=tol[1]
            )
            assert got[0][k].tobytes() == got[1][k].tobytes(), (routes, k)


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_cpu_leading_layers_give_the_ring_bits(workers):
    """On CPU the workers reduce their leading layers in one pass, each summing the
    chunks the ring would give it straight from every worker's leaves (OneShotLeading);
    on emulated links they run the two rings. Both add in the same order: the results
    are bitwise equal, for f32 and bf16 leaves, and the mean is right."""
    mesh = coarse.make_mesh(workers=workers)
    rng = np.random.default_rng(10 + workers)
    x = {
        "a": rng.standard_normal((workers, 999, 37)).astype(np.float32),
        "b": rng.standard_normal((workers, 3001)).astype(jnp.bfloat16),
        "c": rng.standard_normal((workers, 5)).astype(np.float32),
        "d": rng.standard_normal((workers, 4000)).astype(np.float32),
    }
    xs = jax.device_put(x, NamedSharding(mesh, P("data")))
    want = {k: v.astype(np.float64).mean(0) for k, v in x.items()}
    leading = 999 * 37 * 4 + 3001 * 2 + 5 * 4  # a, b, c: the first leaves in flatten order
    got = []
    for topology in (None, coarse.Topology.preset("v100", workers, clock="virtual")):
        # xla_below_bytes=0: the tree (0.2 MiB) would take the latency route.
        cfg = coarse.Config(
            shard_bytes=4096, leading_bytes=leading, topology=topology, xla_below_bytes=0
        )
        assert (
            len(coarse.diagnostics.plan(jax.tree.map(lambda v: v[0], x), mesh, cfg).leading_leaves)
            == 3
        )
        step = coarse.sync(
            lambda t: coarse.all_reduce(jax.tree.map(lambda v: v[0], t)), mesh, config=cfg
        )
        got.append(jax.tree.map(np.asarray, jax.block_until_ready(step(xs))))
    for k in x:
        tol = (1e-2, 1e-2) if k == "b" else (1e-5, 1e-6)  # bf16 keeps 8 bits
        np.testing.assert_allclose(got[0][k].astype(np.float64), want[k], rtol=tol[0], atol=tol[1])
        assert got[0][k].tobytes() == got[1][k].tobytes(), k
