"""Proxies in host memory: ``make_mesh(workers=p, proxies=q, proxies_on="host")``.

The jax mesh holds the p workers only, so all 8 CPU devices can be workers.
The same step with device proxies (same p, q and plan, so the same order of
operations) gives bitwise the same bits: where the proxies live changes the
memory, not the arithmetic. So the tests that hold for proxies wherever they
live (sums and gradients against float64, updates against optax under
``lax.pmean``, arrays placed on the mesh, a lost push, a snapshot's round
trip) are written once, parametrized over ``proxies_on``, in
test_shared_proxies.py and test_snapshots.py; this file holds what is the host's
own: its mesh and its errors, the bitwise proof, the memory report, a large share
on the host pool, and a GPU worker with its proxy in host memory.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import (
    assert_tree_close,
    coarse_update_step,
    crossing_config,
    gpu_or_skip,
    make_batch,
    mlp_init,
    mlp_loss,
    pmean_optax_step,
)
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse
from coarse_jax.mesh import (
    Proxies,
    ProxiesReplaced,
    num_proxies,
    proxies_of,
    proxies_on,
    proxy_devices,
    two_tier_mesh,
    workers_mesh,
)

SIZES = (8, 16, 16, 4)


def _host(p: int, q: int) -> Mesh:
    return coarse.make_mesh(workers=p, proxies=q, proxies_on="host")


def _batches(n: int, per_worker: int, workers: int) -> list[dict]:
    return [make_batch(jax.random.key(3000 + i), per_worker * workers, 8, 4) for i in range(n)]


def _assert_bitwise(a, b) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_the_mesh_holds_the_workers_only():
    d = jax.devices()
    mesh = _host(8, 2)  # every device a worker
    assert mesh.axis_names == ("tier", "data")  # no axis name carries a number
    assert mesh.devices.shape == (1, 8) and list(mesh.devices.flat) == d[:8]
    assert proxies_on(mesh) == "host" and num_proxies(mesh) == 2 and proxy_devices(mesh) == []
    assert proxies_of(mesh) == Proxies("host", 2, 8)
    assert workers_mesh(mesh) is mesh is Mesh(np.array(d[:8]).reshape(1, 8), ("tier", "data"))
    with pytest.raises(ValueError, match=r"proxies are in host memory, no jax devices"):
        two_tier_mesh(mesh)
    assert num_proxies(coarse.make_mesh(proxies_on="host")) == 8  # defaults: all, 1:1
    assert dict(coarse.make_mesh(proxies=4, proxies_on="host").shape)["data"] == 8
    chosen = coarse.make_mesh(proxies=1, devices=[d[5], d[2]], proxies_on="host")
    assert list(chosen.devices.flat) == [d[5], d[2]] and num_proxies(chosen) == 1
    assert proxies_on(coarse.make_mesh(workers=4)) == "devices"
    # Unlike a k:1 mesh of device proxies, jax can split an array over it.
    x = jax.device_put(jnp.arange(16.0), NamedSharding(mesh, P("data")))
    assert len(x.sharding.device_set) == 8


def test_one_set_of_workers_has_one_record_of_proxies_and_a_step_keeps_its_own():
    # jax keeps one Mesh object per devices and axis names: the same 4 workers
    # with device proxies, then host proxies, are one object. The record
    # changes, with a warning; a step decorated before keeps its proxies.
    on_devices = coarse.make_mesh(workers=4)
    step = coarse.sync(on_devices)(lambda x: coarse.all_reduce(x[0], op="sum"))
    with pytest.warns(ProxiesReplaced, match=r"now have 2 proxies in host memory; they had 4"):
        on_host = coarse.make_mesh(workers=4, proxies=2, proxies_on="host")
    assert on_host is on_devices and proxies_on(on_devices) == "host"
    assert step.memory_report(np.ones((4, 8), np.float32)).proxies_on == "devices"
    np.testing.assert_array_equal(np.asarray(step(np.ones((4, 8), np.float32))), 4.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same record again: no warning
        coarse.make_mesh(workers=4, proxies=2, proxies_on="host")
    with pytest.warns(ProxiesReplaced):
        assert proxies_on(coarse.make_mesh(workers=4)) == "devices"


@pytest.mark.parametrize("bad", ["device", "HOST", "cpu", None, 1])
def test_a_bad_proxies_on_is_refused_naming_the_argument(bad):
    with pytest.raises(ValueError, match=r"proxies_on must be 'devices' .* or 'host' .*got "):
        coarse.make_mesh(workers=4, proxies_on=bad)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"workers": 8, "proxies": 3}, r"proxies must divide workers.*\[1, 2, 4, 8\]"),
        ({"workers": 9}, r"workers=9 needs 9 devices \(proxies_on='host': the proxies take none"),
        ({"devices": jax.devices()[:3], "proxies": 2}, r"proxies must divide workers"),
        ({"devices": jax.devices()[:4], "workers": 2}, r"devices are the workers only"),
        ({"devices": [jax.devices()[0]] * 2}, r"devices must be distinct"),
    ],
)
def test_make_mesh_refuses_bad_counts_on_the_host(kwargs, match):
    with pytest.raises(ValueError, match=match):
        coarse.make_mesh(proxies_on="host", **kwargs)


def test_a_mesh_made_by_hand_needs_its_proxies():
    d = np.array(jax.devices()[4:8], dtype=object)
    # Workers coarse.make_mesh never saw: no record of their proxies.
    alone = Mesh(d.reshape(1, 4), ("tier", "data"))
    with pytest.raises(ValueError, match=r"has no proxies on record.*coarse.make_mesh"):
        coarse.sync(alone)(lambda x: x)
    with pytest.raises(ValueError, match=r"axes \('tier', 'data'\).*proxies_on='host'"):
        coarse.sync(Mesh(d, ("data",)))(lambda x: x)


ADAMW = coarse.optim.adamw(optax.linear_schedule(1e-2, 1e-3, 20), weight_decay=0.01, clip_norm=0.3)


@pytest.mark.parametrize("q", [4, 2, 1])
def test_bitwise_equal_to_device_proxies(q):
    """Same p, q and plan: the same order of operations, so the same bits."""
    params = mlp_init(jax.random.key(9), SIZES)
    batches = _batches(5, 2, 4)
    runs = []
    for mesh in (_host(4, q), coarse.make_mesh(workers=4, proxies=q)):
        step = coarse_update_step(mesh, ADAMW, crossing_config(4, q))

        @coarse.sync(mesh, config=crossing_config(4, q))
        def vg(params, batch):
            return coarse.value_and_grad(mlp_loss)(params, batch)

        p, losses = params, []
        for batch in batches:
            p, loss = step(p, batch)
            losses.append(loss)
        runs.append((p, losses, step.optimizer_state(), vg(params, batches[0])))
    _assert_bitwise(runs[0], runs[1])


def test_memory_report_puts_the_proxies_bytes_in_host_memory():
    params = mlp_init(jax.random.key(4), SIZES)
    batch = make_batch(jax.random.key(5), 8, 8, 4)
    reports = {}
    for on in ("host", "devices"):
        mesh = coarse.make_mesh(workers=4, proxies=2, proxies_on=on)
        step = coarse_update_step(mesh, coarse.optim.adam(1e-2))
        jax.block_until_ready(step(params, batch))
        # State placed on the mesh: the workers; no proxy holds any of it.
        on_mesh = jax.device_put(params, NamedSharding(mesh, P()))
        reports[on] = coarse.diagnostics.memory_report(step, on_mesh, batch)
        if on == "devices":  # placed on both tiers: a proxy's device holds a copy
            on_both = jax.device_put(params, NamedSharding(two_tier_mesh(mesh), P()))
            both = coarse.diagnostics.memory_report(step, on_both, batch)
    host, dev = reports["host"], reports["devices"]
    assert (host.proxies_on, dev.proxies_on) == ("host", "devices")
    assert dev.proxy.xla_argument_bytes == 0
    n_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    assert both.proxy.xla_argument_bytes == 2 * n_bytes  # 2 workers share each proxy
    assert host.proxy.xla_bytes == 0  # a host proxy has no device: no XLA buffer
    # The runtime's part is the same bytes, now host memory: 1/q of master + 2 moments, twice.
    assert host.proxy.runtime_storage_bytes == dev.proxy.runtime_storage_bytes > 0
    assert host.proxy.optimizer_bytes == dev.proxy.optimizer_bytes
    n = sum(x.size for x in jax.tree.leaves(params))
    ideal = 2 * 3 * 4 * n / 2
    assert ideal <= host.proxy.optimizer_bytes <= 1.25 * ideal + 4096
    assert host.worker == dev.worker  # the same workers' program
    assert "proxy: host" in host.table() and "proxy: host" not in dev.table()


def test_a_large_share_on_the_host_pool_matches_optax():
    """A proxy's share of 2^20 elements: its optimizer runs split over the bounded host pool
    (ffi/host/host_pool.h), the same updates as one thread's."""

    def loss(params, batch):
        return jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2)

    params = {"w": jax.random.normal(jax.random.key(1), (1024, 1024)) * 0.03}
    batch = {
        "x": jax.random.normal(jax.random.key(2), (4, 1024)),
        "y": jax.random.normal(jax.random.key(3), (4, 1024)),
    }
    tx = optax.adamw(1e-2, weight_decay=0.01)
    step = coarse_update_step(
        _host(2, 1),
        coarse.optim.adamw(1e-2, weight_decay=0.01),
        coarse.Config(shard_bytes=1 << 23),
        loss,
    )
    ref = pmean_optax_step(2, tx, loss)
    got, want, state = params, params, tx.init(params)
    for _ in range(2):
        got, _ = step(got, batch)
        want, state, _ = ref(want, state, batch)
    assert_tree_close(got, jax.device_get(want), rtol=1e-5, atol_scale=1e-5)


def test_pushes_that_wrap_the_staging_ring_match_optax():
    """Three pushes of 16 MiB each, one per leaf, in a step: more than a worker's staging
    ring holds (two calls' worth, 2 x 16 MiB on a stream platform), so the third push's
    pack reuses the first push's staging while that push's copy down may still be running
    on the copy stream (runtime/stream.h, CopyMarks). The pack must wait for that copy;
    under COARSE_JAX_STREAM_CHAOS (make test-streams) the copy stream stalls at random.
    Against optax's trajectory (p = 1: the sum is the worker's own), at the tolerance
    of the test above; a staging race corrupts whole pieces, far beyond it."""

    def loss(params, batch):
        h = jnp.tanh(batch["x"] @ params["w1"])
        h = jnp.tanh(h @ params["w2"])
        return jnp.mean((h @ params["w3"] - batch["y"]) ** 2)

    keys = jax.random.split(jax.random.key(5), 5)
    params = {
        "w1": jax.random.normal(keys[0], (1024, 4096)) * 0.02,
        "w2": jax.random.normal(keys[1], (4096, 1024)) * 0.02,
        "w3": jax.random.normal(keys[2], (1024, 4096)) * 0.02,
    }
    batch = {
        "x": jax.random.normal(keys[3], (4, 1024)),
        "y": jax.random.normal(keys[4], (4, 4096)),
    }
    # SGD with momentum: linear in the gradient, so rounding stays rounding (Adam's
    # g / sqrt(v) turns a rounding difference in a near-zero gradient into a step).
    tx = optax.sgd(0.05, momentum=0.9)
    cfg = coarse.Config(shard_bytes=16 << 20)
    mesh = _host(1, 1)
    assert len(coarse.diagnostics.plan(params, mesh, cfg).buckets) == 3
    step = coarse_update_step(mesh, coarse.optim.sgd(0.05, momentum=0.9), cfg, loss)
    got, want, state = params, params, tx.init(params)
    for _ in range(3):
        got, _ = step(got, batch)
        updates, state = tx.update(jax.grad(loss)(want, batch), state, want)
        want = optax.apply_updates(want, updates)
        assert_tree_close(got, want, rtol=1e-5, atol_scale=1e-5)


def test_one_gpu_with_a_host_proxy_matches_the_oracles():
    """One GPU worker and its proxy in host memory (tools/gpu_check.sh; skipped without a
    GPU): every copy between the GPU and the proxy's pinned pages, the ready flags the
    worker's stream waits on, the host's sums and optimizer, a snapshot taken straight
    from host memory. At p = 1 the sums are the worker's own values, so the oracles are
    plain jax and optax on the same GPU."""
    gpu, _ = gpu_or_skip()
    mesh = coarse.make_mesh(workers=1, proxies_on="host", devices=[gpu])
    assert proxies_on(mesh) == "host" and list(mesh.devices.flat) == [gpu]
    params = jax.device_put(mlp_init(jax.random.key(4), SIZES), gpu)
    batches = [jax.device_put(b, gpu) for b in _batches(3, 8, 1)]
    cfg = coarse.Config(shard_bytes=256, timeout_s=60)  # several pieces per leaf

    @coarse.sync(mesh, config=cfg)
    def grad_step(params, batch):
        loss, grads = coarse.value_and_grad(mlp_loss)(params, batch)
        return loss, grads, coarse.all_reduce(batch["y"].sum(0))

    loss, grads, total = grad_step(params, batches[0])
    want_loss, want_grads = jax.jit(jax.value_and_grad(mlp_loss))(params, batches[0])
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    assert_tree_close(grads, want_grads, rtol=1e-5, atol_scale=1e-6)
    np.testing.assert_allclose(total, batches[0]["y"].sum(0), rtol=1e-6)
    for opt, tx in (
        (coarse.optim.sgd(0.05, momentum=0.9), optax.sgd(0.05, momentum=0.9)),
        (coarse.optim.adamw(1e-2, weight_decay=0.1), optax.adamw(1e-2, weight_decay=0.1)),
    ):
        step = coarse_update_step(mesh, opt, cfg)
        got, want, state = params, params, tx.init(params)
        for batch in batches:
            got, _ = step(jax.tree.map(jnp.copy, got), batch)
            updates, state = tx.update(jax.grad(mlp_loss)(want, batch), state, want)
            want = optax.apply_updates(want, updates)
        assert_tree_close(got, want, rtol=1e-5, atol_scale=1e-6)
        assert step.snapshot() == len(batches)
        snapped = step.optimizer_state()
        got, _ = step(got, batches[0])
        step.restore()
        _assert_bitwise(step.optimizer_state(), snapped)
