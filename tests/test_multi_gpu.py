"""COARSE's own layout on 2, 4 and 8 devices: workers and proxies on separate devices.

Issue 65. Every layout of `multi_gpu_cases.LAYOUTS` (one worker with its proxy on
the other device; one worker per device with host proxies; 2 workers + 2
proxies, the proxies' ring; 2:1 on 3 devices; 4 + 4; 6:2; 8 workers with host
proxies) runs twice, with the same device counts:

* ``gpu-*``: on n GPUs (``COARSE_TEST_GPU=1``, tools/gpu_check.sh): peer copies
  between GPUs, or copies to pinned host memory; skipped, with the count it
  needs, on a host with fewer;
* ``cpu-*``: on n CPU devices of the stream-semantics backend
  (``COARSE_JAX_BACKEND=streams``, `make test-streams`), each device its own
  memory and in-order stream, so the layout's logic is checked in CI before
  any GPU runs it.

The oracles share no code with coarse_jax (multi_gpu_cases.py): float64 numpy
means of each worker's ``jax.value_and_grad`` on its own device, and
``lax.pmean``/``lax.psum`` + optax under ``shard_map`` over the same worker
devices (NCCL on GPUs).

Each layout must also move its bytes between memories, counted by
`coarse_jax.testing.stream_ops` (the same counts on CUDA and on the streams
backend): each worker's gradient past the first layer out to a proxy (a
peer copy, or to host memory) and back. Two deliberate bugs show the checks
can fail: a worker given another worker's rows (the comparison with optax
fails at the first step), and the proxies left on the workers' own devices
(the byte count fails).

Tolerances are rounding-level, for float32 sums of p <= 8 terms in another
order (the proxies' rings against psum's tree; 2:1 sums a group first): a
sum's error is at most (p - 1) * 2^-24 of the sum of its magnitudes, so 1e-6
relative, with 1e-6 of the leaf's largest value as the absolute floor where
terms cancel. Eight adamw steps (clipped, scheduled) against optax: 1e-5, as
test_shared_proxies.py holds, since adam's g / sqrt(v) magnifies a rounding
difference where v is small. Matmuls are float32 on both sides
(``jax.default_matmul_precision("highest")``: a GPU's TF32 would round each
program's products by 2^-11 instead).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import optax
import pytest
from helpers import assert_replicated, assert_tree_close, crossing_config, make_batch, mlp_init
from helpers import mlp_loss as loss_fn
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from multi_gpu_cases import (
    LAYOUTS,
    Layout,
    cases,
    devices_or_skip,
    flat_mesh,
    per_worker_float64,
    pmean_optax_step,
    pmean_value_and_grad,
    psum_over,
)

import coarse_jax as coarse
from coarse_jax.mesh import workers_mesh
from coarse_jax.testing import reset_stream_ops, shared_device_mesh, stream_ops

SIZES = (8, 32, 16, 4)
PER_WORKER = 4
STEPS = 8
# The first layer reduced among the workers (their ring), the rest by the proxies.
LEADING_BYTES = (SIZES[0] * SIZES[1] + SIZES[1]) * 4
# One set of workers has one record of proxies: the layouts on the same first
# devices replace each other's, and each step is decorated right after its mesh.
pytestmark = pytest.mark.filterwarnings("ignore::coarse_jax.mesh.ProxiesReplaced")


def _config(layout: Layout) -> coarse.Config:
    """Crossing routes and small pieces (every proxy serves other groups' workers, several
    pieces a leaf) and a generous timeout for a GPU's first calls."""
    cfg = crossing_config(layout.workers, layout.proxies)
    return dataclasses.replace(cfg, leading_bytes=LEADING_BYTES, timeout_s=120)


def _placed(mesh, params, batch):
    return (
        jax.device_put(params, NamedSharding(mesh, P())),
        jax.device_put(batch, NamedSharding(mesh, P("data"))),
    )


def _nbytes(tree) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree))


@pytest.fixture(autouse=True)
def _float32_matmuls():
    with jax.default_matmul_precision("highest"):
        yield


@pytest.mark.parametrize("platform, layout", cases())
def test_value_and_grad_and_all_reduce_match_float64_and_pmean(platform, layout):
    pool = devices_or_skip(platform, layout.devices)
    mesh = layout.mesh(pool)
    workers = list(mesh.devices.flat)
    p = layout.workers
    params = mlp_init(jax.random.key(p * 10 + layout.proxies), SIZES)
    batch = make_batch(jax.random.key(7), PER_WORKER * p, SIZES[0], SIZES[-1])
    (loss, grads, total), ops = _grads_counted(mesh, layout, params, batch)

    want_loss, want_grads = per_worker_float64(loss_fn, params, batch, workers)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-6)
    assert_tree_close(grads, want_grads, rtol=1e-6, atol_scale=1e-6)
    flat = flat_mesh(workers)
    pm_loss, pm_grads = pmean_value_and_grad(workers, loss_fn)(*_placed(flat, params, batch))
    np.testing.assert_allclose(float(loss), float(pm_loss), rtol=1e-6)
    assert_tree_close(grads, jax.device_get(pm_grads), rtol=1e-6, atol_scale=1e-6)
    y = np.asarray(batch["y"], np.float64).reshape(p, PER_WORKER, -1).sum(0)
    psum = psum_over(workers)(jax.device_put(batch["y"], NamedSharding(flat, P("data"))))
    np.testing.assert_allclose(np.asarray(total, np.float64), y, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(total), np.asarray(psum), rtol=1e-6, atol=1e-6)
    for tree in (loss, grads, total):
        assert_replicated(tree)
        assert {d for x in jax.tree.leaves(tree) for d in x.sharding.device_set} == set(workers)

    _assert_crossed(ops, layout, params)


def _assert_crossed(ops, layout: Layout, params) -> None:
    """The bytes that crossed between memories: each worker's gradient past the first
    layer leaves its device, to a proxy's device (a peer copy) or to host memory, and
    comes back summed."""
    pushed = (_nbytes(params) - LEADING_BYTES) * layout.workers
    if layout.on == "host":
        assert ops.bytes_d2h >= pushed and ops.bytes_h2d >= pushed, ops
    else:
        assert ops.bytes_peer >= 2 * pushed, ops


def _grads_counted(mesh, layout: Layout, params, batch):
    """``(loss, grads, all_reduce(y))`` from the second call of a `coarse.value_and_grad`
    step (the first compiles and plans), and the stream operations that call asked for."""

    @coarse.sync(mesh, config=_config(layout))
    def vg(params, batch):
        loss, grads = coarse.value_and_grad(loss_fn)(params, batch)
        return loss, grads, coarse.all_reduce(batch["y"], op="sum")

    on = workers_mesh(mesh)  # `mesh` itself, but of a two-tier mesh its workers' row
    jax.block_until_ready(vg(*_placed(on, params, batch)))
    reset_stream_ops()
    out = jax.block_until_ready(vg(*_placed(on, params, batch)))
    return out, stream_ops()


def test_the_byte_count_catches_proxies_left_on_the_workers_devices():
    """A deliberate bug: the proxies of the 2 + 2 layout left on the workers' own devices
    (`shared_device_mesh`). A worker's pieces for its local proxy then stay on its
    device; what still crosses (the pieces routed to the other proxy, the proxies'
    ring) is below the bound every device layout above meets (7544 bytes against
    9536 here; 16760 with the proxies on devices of their own)."""
    pool = devices_or_skip("cpu", 2)
    layout = LAYOUTS[2]  # 2 workers + 2 proxies
    params = mlp_init(jax.random.key(5), SIZES)
    batch = make_batch(jax.random.key(7), PER_WORKER * 2, SIZES[0], SIZES[-1])
    _, ops = _grads_counted(shared_device_mesh(2, devices=pool), layout, params, batch)
    with pytest.raises(AssertionError, match=r"bytes_peer="):
        _assert_crossed(ops, layout, params)
    _, ops = _grads_counted(layout.mesh(devices_or_skip("cpu", 4)), layout, params, batch)
    _assert_crossed(ops, layout, params)


OPT = coarse.optim.adamw(optax.linear_schedule(1e-2, 1e-3, 20), weight_decay=0.01, clip_norm=0.3)
TX = optax.chain(
    optax.clip_by_global_norm(0.3),
    optax.adamw(optax.linear_schedule(1e-2, 1e-3, 20), weight_decay=0.01),
)


def _update_against_optax(platform: str, layout: Layout, corrupt_worker_batch: bool = False):
    """STEPS `coarse.value_and_update` steps of ``layout`` against optax under ``lax.pmean``
    on the same worker devices, compared step by step. With ``corrupt_worker_batch`` the
    last worker is given the first worker's rows (as if it read another device's
    buffer); the oracle keeps the true batch, so the comparison must fail."""
    pool = devices_or_skip(platform, layout.devices)
    mesh = layout.mesh(pool)
    workers = list(mesh.devices.flat)
    p = layout.workers
    flat = flat_mesh(workers)

    @coarse.sync(mesh, config=_config(layout))
    def step(params, batch):
        loss, params = coarse.value_and_update(loss_fn, OPT)(params, batch)
        return params, loss

    ref = jax.jit(pmean_optax_step(workers, TX, loss_fn))
    params = mlp_init(jax.random.key(3), SIZES)
    got, _ = _placed(mesh, params, {})
    want, _ = _placed(flat, params, {})
    state = jax.device_put(TX.init(params), NamedSharding(flat, P()))
    for i in range(STEPS):
        batch = make_batch(jax.random.key(2000 + i), PER_WORKER * p, SIZES[0], SIZES[-1])
        fed = batch
        if corrupt_worker_batch:
            n = PER_WORKER
            fed = {k: v.at[(p - 1) * n :].set(v[:n]) for k, v in batch.items()}
        got, loss = step(*_placed(mesh, got, fed))
        on_flat, flat_batch = _placed(flat, want, batch)
        want, state, want_loss = ref(on_flat, state, flat_batch)
        np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5, err_msg=f"step {i}")
        assert_tree_close(got, jax.device_get(want), rtol=1e-5, atol_scale=1e-5)
    assert_replicated(got)
    for a, b in zip(jax.tree.leaves(step.optimizer_state()), jax.tree.leaves(state), strict=True):
        b = np.asarray(jax.device_get(b), np.float64)
        np.testing.assert_allclose(
            np.asarray(a, np.float64), b, rtol=1e-5, atol=1e-5 * (np.abs(b).max(initial=0) or 1)
        )
    assert_tree_close(step.master_params(), got, rtol=0, atol_scale=0)  # what the proxies hold


@pytest.mark.parametrize("platform, layout", cases())
def test_value_and_update_matches_optax_under_pmean(platform, layout):
    _update_against_optax(platform, layout)


def test_the_comparison_catches_a_worker_given_another_workers_rows():
    """A deliberate bug: the last worker trains on the first worker's rows (2:1 on 3
    devices). A step that read another device's buffer would do this; the comparison
    with optax under pmean, fed the true rows, fails at the first step."""
    with pytest.raises(AssertionError, match=r"step 0"):
        _update_against_optax("cpu", LAYOUTS[4], corrupt_worker_batch=True)
