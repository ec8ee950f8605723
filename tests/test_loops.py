"""coarse calls inside lax.fori_loop / lax.scan: gradient accumulation over micro-batches.

A loop body repeats its synchronization's call site within one execution; the
runtime tells the repetitions apart by iteration (ffi/runtime/session.h). The
oracle shares no code with coarse_jax: per-worker `jax.value_and_grad` on each
micro-batch slice, averaged in float64 numpy (helpers.per_worker_mean).
A short timeout makes a regression fail in seconds, not after 120 s.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    assert_replicated,
    assert_tree_close,
    make_batch,
    mlp_init,
    mlp_loss,
    per_worker_mean,
)
from jax import lax

import coarse_jax as coarse

MICRO = 4  # micro-batches per step
ROWS = 2  # rows per micro-batch per worker
# Proxy leaves in several pieces plus a worker-ring part, so every custom call
# (push, proxy ring, worker ring, pull) repeats in the loop.
CFG = coarse.Config(timeout_s=5.0, shard_bytes=64, leading_bytes=7 * 13 * 4 + 13 * 4)


def _micro(batch, k=MICRO):
    """This worker's batch as [k, rows, ...]: micro-batch j is rows j*rows..(j+1)*rows."""
    return jax.tree.map(lambda x: x.reshape(k, -1, *x.shape[1:]), batch)


def _zeros(params):
    return jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params)


def _add(acc, loss, grads):
    return acc[0] + loss, jax.tree.map(jnp.add, acc[1], grads)


def _mean(acc, k=MICRO):
    return acc[0] / k, jax.tree.map(lambda g: g / k, acc[1])


def _fori_step(mesh, cfg=CFG, k=MICRO):
    @coarse.sync(mesh, config=cfg)
    def step(params, batch):
        micro = _micro(batch, k)

        def body(j, acc):
            mb = jax.tree.map(lambda x: x[j], micro)
            return _add(acc, *coarse.value_and_grad(mlp_loss)(params, mb))

        return _mean(lax.fori_loop(0, k, body, _zeros(params)), k)

    return step


def _scan_step(mesh, cfg=CFG):
    @coarse.sync(mesh, config=cfg)
    def step(params, batch):
        def body(acc, mb):
            return _add(acc, *coarse.value_and_grad(mlp_loss)(params, mb)), None

        acc, _ = lax.scan(body, _zeros(params), _micro(batch))
        return _mean(acc)

    return step


def _own(tree):
    """``tree`` cast to vary over the program's axis, so that ``jax.grad`` inside shard_map gives
    this device's own gradient (of an invariant input it would sum over the devices)."""

    def cast(x):
        missing = tuple(a for a in ("data",) if a not in jax.typeof(x).mat.varying)
        return lax.pcast(x, missing, to="varying") if missing else x

    return jax.tree.map(cast, tree)


def _all_reduce_step(mesh, cfg=CFG):
    """Per-worker gradients of each micro-batch, averaged by coarse.all_reduce in the loop."""

    @coarse.sync(mesh, config=cfg)
    def step(params, batch):
        micro = _micro(batch)

        def body(j, acc):
            mb = jax.tree.map(lambda x: x[j], micro)
            loss, grads = jax.value_and_grad(mlp_loss)(_own(params), mb)
            return _add(acc, *coarse.all_reduce((loss, grads)))

        return _mean(lax.fori_loop(0, MICRO, body, _zeros(params)))

    return step


def _oracle(params, batch, workers, k=MICRO):
    """Mean over micro-batches of the mean over workers, in float64."""
    rows = jax.tree.leaves(batch)[0].shape[0] // (workers * k)
    losses, grads = [], []
    for j in range(k):
        # Micro-batch j: rows j*rows..(j+1)*rows of every worker's shard.
        lo = [w * k * rows + j * rows for w in range(workers)]
        idx = np.concatenate([np.arange(a, a + rows) for a in lo])
        micro = jax.tree.map(lambda x, idx=idx: x[idx], batch)
        loss, g = per_worker_mean(mlp_loss, params, micro, workers)
        losses.append(loss)
        grads.append(g)
    return np.mean(losses), jax.tree.map(lambda *gs: np.mean(gs, axis=0), *grads)


def _inputs(workers, seed=0, k=MICRO):
    params = mlp_init(jax.random.key(seed), (7, 13, 5, 3))
    batch = make_batch(jax.random.key(seed + 1), workers * k * ROWS, 7, 3)
    return params, batch


def _check(got, params, batch, workers, k=MICRO):
    loss, grads = got
    want_loss, want_grads = _oracle(params, batch, workers, k)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5)
    assert_tree_close(grads, want_grads, rtol=1e-5, atol_scale=1e-6)
    assert_replicated((loss, grads))


@pytest.mark.timeout(120)  # a hang guard: a 5 s timeout must fire long before
@pytest.mark.parametrize("kind", ["fori_loop", "scan", "all_reduce"])
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_accumulation_loop_matches_per_worker_mean(workers, kind):
    from coarse_jax import _ffi

    mesh = coarse.make_mesh(workers=workers)
    make = {"fori_loop": _fori_step, "scan": _scan_step, "all_reduce": _all_reduce_step}[kind]
    params, batch = _inputs(workers)
    _check(make(mesh)(params, batch), params, batch, workers)
    assert _ffi.live_sessions() == 0


@pytest.mark.timeout(120)
def test_loop_step_dispatched_back_to_back():
    """Several executions of a 3-iteration loop in flight, blocked on only at the end."""
    from coarse_jax import _ffi

    workers, k = 4, 3
    mesh = coarse.make_mesh(workers=workers)
    step = _fori_step(mesh, k=k)
    inputs = [_inputs(workers, seed=10 * i, k=k) for i in range(4)]
    outs = [step(params, batch) for params, batch in inputs]  # no block in between
    jax.block_until_ready(outs)
    for out, (params, batch) in zip(outs, inputs, strict=True):
        _check(out, params, batch, workers, k)
    # A second round of the same compiled step: runs, not loop iterations, differ.
    outs = [step(params, batch) for params, batch in inputs]
    for out, (params, batch) in zip(outs, inputs, strict=True):
        _check(out, params, batch, workers, k)
    assert _ffi.live_sessions() == 0


@pytest.mark.timeout(120)
def test_two_syncs_in_one_loop_body_and_one_after():
    """Two call sites inside the body (value_and_grad, all_reduce) and one after the loop."""
    workers = 2
    mesh = coarse.make_mesh(workers=workers)
    params, batch = _inputs(workers)

    @coarse.sync(mesh, config=CFG)
    def step(params, batch):
        micro = _micro(batch)

        def body(j, acc):
            mb = jax.tree.map(lambda x: x[j], micro)
            loss, grads = coarse.value_and_grad(mlp_loss)(params, mb)
            count = coarse.all_reduce(jnp.float32(1.0), op="sum")  # workers, every iteration
            return _add(acc, loss * count / workers, grads)

        loss, grads = _mean(lax.fori_loop(0, MICRO, body, _zeros(params)))
        return coarse.all_reduce(loss), grads

    _check(step(params, batch), params, batch, workers)


@pytest.mark.timeout(120)
def test_loop_failure_times_out_and_later_steps_work():
    """A push lost in a loop times out with the named error; the next step is healthy."""
    from coarse_jax import _ffi

    workers = 2
    mesh = coarse.make_mesh(workers=workers)
    cfg = coarse.Config(
        timeout_s=1.0, shard_bytes=64, leading_bytes=7 * 13 * 4 + 13 * 4, xla_below_bytes=0
    )
    step = _fori_step(mesh, cfg)
    params, batch = _inputs(workers)
    jax.block_until_ready(step(params, batch))
    _ffi.inject_dropped_push(1)  # the next session: iteration 0 of the next step
    with pytest.raises(Exception, match=r"proxy \d \(tier=1, data=\d\) timed out after 1.000 s"):
        jax.block_until_ready(step(params, batch))
    assert _ffi.live_sessions() == 0  # the failed session is gone once every device returned
    _check(step(params, batch), params, batch, workers)
