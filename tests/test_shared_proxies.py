"""COARSE k:1: q proxies, each shared by k = p / q workers (the paper's COARSE(2:1)).

Oracles share no code with coarse_jax: float64 numpy means of what each worker
holds, and optax under ``lax.pmean`` over the same p workers
(`helpers.pmean_optax_step`). Crossing routes and tiny shards make every
proxy serve pushes from workers of other groups, several pieces per leaf.

The tests that do not depend on where the proxies live run for proxies on
devices and proxies in host memory (``proxies_on``; ids ``devices-p4q2``,
``host-p8q2``): host proxies give bitwise the bits of device proxies
(test_host_proxies.py proves it), so each test is written once. With host
proxies every device can be a worker, so their cases go up to p = 8.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import (
    assert_replicated,
    assert_tree_close,
    coarse_update_step,
    crossing_config,
    make_batch,
    mlp_init,
    mlp_loss,
    pmean_optax_step,
)
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse
from coarse_jax import _ffi

SIZES = (8, 16, 16, 4)
# (p, q) with device proxies (p + q devices of 8), and with host proxies: 1:1, 2:1,
# 4:1 on 4 workers, and all 8 devices as workers (1:1, 4:1).
RATIOS = {
    "devices": [(2, 1), (4, 2), (4, 1), (6, 2)],
    "host": [(4, 4), (4, 2), (4, 1), (8, 8), (8, 2)],
}


def _case(*prefix: str, on: str, p: int, q: int, mode: str = "ffi"):
    """A pytest case ``(*prefix, on, p, q, mode)`` with a readable id."""
    tail = "" if mode == "ffi" else f"-{mode}"
    return pytest.param(*prefix, on, p, q, mode, id="-".join([*prefix, f"{on}-p{p}q{q}{tail}"]))


def _mesh(on: str, p: int, q: int):
    return coarse.make_mesh(workers=p, proxies=q, proxies_on=on)


def _batches(n: int, per_worker: int, workers: int):
    return [make_batch(jax.random.key(2000 + i), per_worker * workers, 8, 4) for i in range(n)]


def test_make_mesh_lists_each_shared_proxy_under_its_group():
    from coarse_jax.mesh import num_proxies, proxies_of, proxy_devices, two_tier_mesh

    mesh = coarse.make_mesh(workers=4, proxies=2)
    d = jax.devices()
    assert mesh.axis_names == ("tier", "data") and mesh.devices.shape == (1, 4)
    assert list(mesh.devices[0]) == d[:4]
    assert proxy_devices(mesh) == [d[4], d[5]] and num_proxies(mesh) == 2
    assert proxies_of(mesh).serves(1) == (2, 3)
    full = two_tier_mesh(mesh)
    assert full.axis_names == ("tier", "data") and full.devices.shape == (2, 4)
    assert list(full.devices[1]) == [d[4], d[4], d[5], d[5]]
    # devices=: the p workers, then the q proxies.
    chosen = coarse.make_mesh(workers=4, proxies=1, devices=[d[7], d[6], d[5], d[4], d[0]])
    assert [x.id for x in two_tier_mesh(chosen).devices[1]] == [0, 0, 0, 0]
    assert coarse.make_mesh(proxies=2, devices=d[:6]).devices.shape == (1, 4)
    assert coarse.make_mesh(workers=3).devices.shape == (1, 3)  # 1:1 by default
    assert num_proxies(coarse.make_mesh(workers=3)) == 3
    # Without workers: as many as fit beside the proxies, a multiple of q.
    assert coarse.make_mesh(proxies=2).devices.shape == (1, 6)
    assert coarse.make_mesh(proxies=3).devices.shape == (1, 3)
    with pytest.raises(ValueError, match=r"need at least 10 devices \(5 worker\(s\) \+ 5 prox"):
        coarse.make_mesh(proxies=5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"workers": 4, "proxies": 3}, r"proxies must divide workers.*proxies=3.*\[1, 2, 4\]"),
        ({"workers": 2, "proxies": 4}, r"proxies must divide workers"),
        ({"workers": 4, "proxies": 0}, r"proxies must be a positive int, got 0"),
        ({"workers": 6, "proxies": 3}, r"needs 9 devices, only 8 available"),
    ],
)
def test_make_mesh_refuses_a_bad_ratio(kwargs, match):
    with pytest.raises(ValueError, match=match):
        coarse.make_mesh(**kwargs)


def test_sync_refuses_a_proxy_row_that_is_not_grouped():
    d = np.array(jax.devices()[:6], dtype=object)
    bad = jax.sharding.Mesh(np.array([d[:4], [d[4], d[5], d[4], d[5]]]), ("tier", "data"))
    with pytest.raises(ValueError, match=r"proxy row .* each once per worker of its group"):
        coarse.sync(bad)(lambda x: x)


@pytest.mark.parametrize(
    "proxies_on, p, q, mode",
    [_case(on=on, p=p, q=q) for on, ratios in RATIOS.items() for p, q in ratios]
    + [_case(on="devices", p=4, q=2, mode="reference")],
)
def test_value_and_grad_and_all_reduce_match_float64(proxies_on, p, q, mode):
    mesh = _mesh(proxies_on, p, q)
    cfg = dataclasses.replace(crossing_config(p, q), mode=mode)
    rng = np.random.default_rng(p * 10 + q)
    values = {
        "a": rng.standard_normal((p, 40)).astype(np.float32),
        "b": rng.standard_normal((p, 7, 9)).astype(np.float32),
        "c": rng.standard_normal((p,)).astype(np.float32),
        "h": rng.standard_normal((p, 33)).astype(jnp.bfloat16),
    }

    @coarse.sync(mesh, config=cfg)
    def reduce(per_worker):
        return coarse.all_reduce(jax.tree.map(lambda x: x[0], per_worker), op="sum")

    summed = reduce(values)
    for k, v in values.items():
        want = v.astype(np.float64).sum(axis=0)
        tol = (2.0**-7 if v.dtype == jnp.bfloat16 else 4 * p * 2.0**-24) * np.abs(want).max()
        np.testing.assert_allclose(np.asarray(summed[k], np.float64), want, rtol=0, atol=tol + 1e-6)
    assert_replicated(summed)

    params = mlp_init(jax.random.key(p + q), SIZES)
    batch = make_batch(jax.random.key(7), 4 * p, 8, 4)
    # The first layer reduced among the workers (their ring), the rest by the proxies.
    split = dataclasses.replace(cfg, leading_bytes=(8 * 16 + 16) * 4)

    @coarse.sync(mesh, config=split)
    def vg(params, batch):
        return coarse.value_and_grad(mlp_loss)(params, batch)

    loss, grads = vg(params, batch)
    per = [
        jax.value_and_grad(mlp_loss)(params, {k: v[4 * i : 4 * i + 4] for k, v in batch.items()})
        for i in range(p)
    ]
    want_loss = np.mean([float(v) for v, _ in per])
    want = jax.tree.map(
        lambda *g: np.mean([np.asarray(x, np.float64) for x in g], 0), *[g for _, g in per]
    )
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-6)
    assert_tree_close(grads, want, rtol=1e-6, atol_scale=1e-6)
    assert_replicated(grads)


@pytest.mark.parametrize(
    "proxies_on, p, q",
    [("devices", 4, 2), ("devices", 4, 4), ("host", 8, 2)],
    ids=["devices-p4q2", "devices-p4q4", "host-p8q2"],
)
def test_arrays_placed_on_the_mesh_are_taken_as_arguments(proxies_on, p, q):
    # The state replicated on the mesh make_mesh returned (the workers'), the batch
    # replicated or split over "data": the same bits as from numpy arguments.
    mesh = _mesh(proxies_on, p, q)
    params = mlp_init(jax.random.key(11), SIZES)
    batch = make_batch(jax.random.key(12), 16, 8, 4)

    @coarse.sync(mesh)
    def vg(params, batch):
        return coarse.value_and_grad(mlp_loss)(params, batch)

    want = jax.device_get(vg(params, batch))
    for spec in (P(), P("data")):
        placed = jax.device_put(params, NamedSharding(mesh, P()))
        got = jax.device_get(vg(placed, jax.device_put(batch, NamedSharding(mesh, spec))))
        for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
            np.testing.assert_array_equal(a, b)


OPT = coarse.optim.adamw(optax.linear_schedule(1e-2, 1e-3, 20), weight_decay=0.01, clip_norm=0.3)
OPTIMIZERS = {
    "adamw": (
        OPT,
        optax.chain(
            optax.clip_by_global_norm(0.3),
            optax.adamw(optax.linear_schedule(1e-2, 1e-3, 20), weight_decay=0.01),
        ),
    ),
    "sgd": (coarse.optim.sgd(0.05, momentum=0.9), optax.sgd(0.05, momentum=0.9)),
    "adam": (coarse.optim.adam(1e-2), optax.adam(1e-2)),
}
UPDATE_CASES = [
    *(_case("adamw", on=on, p=p, q=q) for on, ratios in RATIOS.items() for p, q in ratios),
    _case("adamw", on="devices", p=4, q=2, mode="reference"),
    _case("adamw", on="devices", p=6, q=2, mode="reference"),
    _case("sgd", on="host", p=4, q=2),
    _case("adam", on="host", p=8, q=8),
]


@pytest.mark.parametrize("name, proxies_on, p, q, mode", UPDATE_CASES)
def test_value_and_update_matches_optax_under_pmean(name, proxies_on, p, q, mode):
    opt, oracle = OPTIMIZERS[name]
    params = mlp_init(jax.random.key(3), SIZES)
    batches = _batches(12, 2, p)
    cfg = dataclasses.replace(crossing_config(p, q), mode=mode)
    step = coarse_update_step(_mesh(proxies_on, p, q), opt, cfg)
    ref = pmean_optax_step(p, oracle)
    got, state = params, oracle.init(params)
    want = params
    for batch in batches:
        got, loss = step(got, batch)
        want, state, want_loss = ref(want, state, batch)
        np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5)
    assert_tree_close(got, jax.device_get(want), rtol=1e-5, atol_scale=1e-5)
    assert_replicated(got)
    # Each proxy holds 1/q of the master and the state: exported whole, it is optax's.
    for a, b in zip(jax.tree.leaves(step.optimizer_state()), jax.tree.leaves(state), strict=True):
        b = np.asarray(jax.device_get(b), np.float64)
        np.testing.assert_allclose(
            np.asarray(a, np.float64), b, rtol=1e-5, atol=1e-5 * (np.abs(b).max(initial=0) or 1)
        )
    assert_tree_close(step.master_params(), got, rtol=0, atol_scale=0)


def test_proxies_hold_a_qth_of_the_state_each():
    params = mlp_init(jax.random.key(4), SIZES)
    batch = make_batch(jax.random.key(5), 8, 8, 4)
    held = {}
    for q in (4, 2, 1):
        mesh = coarse.make_mesh(workers=4, proxies=q)
        step = coarse_update_step(mesh, coarse.optim.adam(1e-2))
        jax.block_until_ready(step(params, batch))
        held[q] = coarse.diagnostics.memory_report(step, params, batch)
    # The proxy row of a report is one proxy's: with half as many proxies, about twice the state.
    n = sum(x.size for x in jax.tree.leaves(params))
    for q, report in held.items():
        ideal = 2 * 3 * 4 * n / q  # master + 2 moments, two buffers, 1/q of the elements
        assert ideal <= report.proxy.optimizer_bytes <= 1.25 * ideal + 4096, (q, report.proxy)


def test_reruns_are_bitwise_equal():
    mesh = coarse.make_mesh(workers=4, proxies=2)
    params = mlp_init(jax.random.key(6), SIZES)
    batches = _batches(6, 2, 4)
    runs = []
    for _ in range(2):
        step = coarse_update_step(mesh, OPT, crossing_config(4, 2))
        p = params
        for batch in batches:
            p, _ = step(p, batch)
        runs.append(jax.device_get(p))
    for a, b in zip(jax.tree.leaves(runs[0]), jax.tree.leaves(runs[1]), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "proxies_on, proxy",
    [
        ("devices", r"proxy 0 \(tier=1, data=0\.\.1, shared by workers 0\.\.1\)"),
        ("host", r"proxy 0 \(in host memory, serving workers 0\.\.1\)"),
    ],
    ids=["devices", "host"],
)
def test_a_lost_push_names_the_shared_proxy_and_leaves_the_state(proxies_on, proxy):
    mesh = _mesh(proxies_on, 4, 2)
    params = mlp_init(jax.random.key(8), SIZES)
    batches = _batches(3, 2, 4)
    # Worker 3 pushes everything to proxy 0, which serves workers 0 and 1.
    cfg = coarse.Config(timeout_s=1.0, routes=((0, 0), (0, 0), (1, 1), (0, 0)))
    step = coarse_update_step(mesh, coarse.optim.adam(1e-2), cfg)
    p, _ = step(params, batches[0])
    before = step.optimizer_state()
    _ffi.inject_dropped_push(3)
    with pytest.raises(
        Exception,
        # Exactly the missing push, not every client of the proxy (0, 1, 3).
        match=proxy + r" timed out .* worker\(s\) 3 to push .*\(2 of 3 arrived\)",
    ):
        jax.block_until_ready(step(p, batches[1]))
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(step.optimizer_state()), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    jax.block_until_ready(step(p, batches[2]))  # the step goes on from the previous version
