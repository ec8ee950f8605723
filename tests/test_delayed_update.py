"""`coarse.value_and_update(delayed=True)`: ZeRO-Offload's one-step delayed update.

The oracle shares no code with coarse_jax: ``jax.value_and_grad`` + ``lax.pmean`` over
the same workers and optax (its own chain, written out here), run on the delayed
schedule: call t computes its gradient at the params it got, applies the previous
call's gradient, and returns that; the first call applies nothing. Four steps of one
trajectory agree to f32 rtol 1e-5 (test_value_and_update.py's tolerance for curves).
`make test-streams` runs this file on the stream-semantics backend too.
Deliberate bugs it catches: the update not delayed (the first call's params move),
the pending gradient held in one buffer (a failed call's gradient is then applied).
"""

from __future__ import annotations

import os

import jax
import numpy as np
import optax
import pytest
from helpers import assert_tree_close, gpu_or_skip, make_batch, mlp_init, mlp_loss
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse
from coarse_jax.testing import shared_device_mesh

SIZES = (8, 16, 16, 4)
CASES = [
    ("adam", coarse.optim.adam(1e-2), optax.adam(1e-2)),
    (
        "sgd-momentum-decay",
        coarse.optim.sgd(0.05, momentum=0.9, weight_decay=1e-3),
        optax.chain(optax.add_decayed_weights(1e-3), optax.sgd(0.05, 0.9)),
    ),
]
MESHES = {
    "device-proxies": lambda: coarse.make_mesh(workers=2),
    "host-proxies": lambda: coarse.make_mesh(workers=2, proxies_on="host"),
    "shared-2:1": lambda: coarse.make_mesh(workers=2, proxies=1),
    # p = 1, the proxy on its worker's device (on the streams backend: in place)
    "one-device": lambda: shared_device_mesh(1),
}


def _grads(workers: int):
    """(params, batch) -> (loss, mean gradients) over the first ``workers`` devices."""
    flat = jax.sharding.Mesh(np.array(jax.devices()[:workers]), ("data",))

    @jax.jit
    @jax.shard_map(mesh=flat, in_specs=(P(), P("data")), out_specs=P())
    def grads(params, batch):
        loss, g = jax.value_and_grad(mlp_loss)(jax.lax.pcast(params, "data", to="varying"), batch)
        return jax.lax.pmean((loss, g), "data")

    return grads


def _delayed_oracle(workers, tx, params, batches):
    """The params each call returns on the delayed schedule, and the final optax state."""
    grads = _grads(workers)
    state, pending, out = tx.init(params), None, []
    for batch in batches:
        _, g = grads(params, batch)
        if pending is not None:
            updates, state = tx.update(pending, state, params)
            params = optax.apply_updates(params, updates)
        pending = g
        out.append(params)
    return out, state


def _step(mesh, opt, delayed=True):
    @coarse.sync(mesh)
    def step(params, batch):
        loss, params = coarse.value_and_update(mlp_loss, opt, delayed=delayed)(params, batch)
        return params, loss

    return step


def _batches(n, workers):
    return [make_batch(jax.random.key(500 + i), 4 * workers, 8, 4) for i in range(n)]


@pytest.mark.parametrize("where", MESHES)
@pytest.mark.parametrize("name,opt,tx", CASES, ids=[c[0] for c in CASES])
def test_delayed_update_follows_the_delayed_schedule(where, name, opt, tx):
    mesh = MESHES[where]()
    workers = int(mesh.shape["data"])
    params = mlp_init(jax.random.key(11), SIZES)
    batches = _batches(4, workers)
    want, _ = _delayed_oracle(workers, tx, params, batches)
    step = _step(mesh, opt)
    got, p = [], params
    for batch in batches:
        p, _ = step(p, batch)
        got.append(jax.device_get(p))
    # The first call applies nothing: the params it got, bit for bit.
    for a, b in zip(jax.tree.leaves(got[0]), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for g, w in zip(got, want, strict=True):
        assert_tree_close(g, jax.device_get(w), rtol=1e-5, atol_scale=1e-5)


def test_the_state_is_the_last_applied_update():
    _, opt, tx = CASES[0]
    mesh = MESHES["device-proxies"]()
    params = mlp_init(jax.random.key(12), SIZES)
    batches = _batches(3, 2)
    _, want_state = _delayed_oracle(2, tx, params, batches)
    step = _step(mesh, opt)
    p = params
    for batch in batches:
        p, _ = step(p, batch)
    state = step.optimizer_state()
    assert int(state[0].count) == int(want_state[0].count) == 2
    assert_tree_close(
        jax.device_get(state[0].mu), jax.device_get(want_state[0].mu), rtol=1e-5, atol_scale=1e-5
    )


def _two_calls(seed: int, n: int):
    """An adam delayed step on device proxies after two calls: (step, first params,
    batches, the two calls' params)."""
    step = _step(MESHES["device-proxies"](), CASES[0][1])
    params = mlp_init(jax.random.key(seed), SIZES)
    batches = _batches(n, 2)
    p1, _ = step(params, batches[0])
    p2, _ = step(p1, batches[1])
    return step, params, batches, (p1, p2)


def test_a_failed_call_keeps_the_pending_gradient():
    tx = CASES[0][2]
    step, params, batches, (p1, p2) = _two_calls(13, 4)
    with pytest.raises(Exception, match=r"not the params it returned"):
        jax.block_until_ready(step(p1, batches[2]))  # an older call's params: refused
    p3, _ = step(p2, batches[3])
    # As if the refused call had not happened: batches 0, 1, 3.
    want, _ = _delayed_oracle(2, tx, params, [batches[0], batches[1], batches[3]])
    assert_tree_close(jax.device_get(p3), jax.device_get(want[-1]), rtol=1e-5, atol_scale=1e-5)


def test_reset_starts_over_with_nothing_pending():
    step, params, batches, _ = _two_calls(14, 3)
    step.reset_optimizer()
    again, _ = step(params, batches[2])  # a first call again: the params it got
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize(
    "what",
    ["clip_norm", "snapshots", "reference"],
)
def test_what_a_delayed_update_does_not_support_is_refused(what):
    mesh = MESHES["device-proxies"]()
    opt = coarse.optim.adam(1e-3, clip_norm=1.0 if what == "clip_norm" else None)
    cfg = coarse.Config(mode="reference" if what == "reference" else "ffi")
    snaps = coarse.Snapshots(every=5 if what == "snapshots" else 0)

    @coarse.sync(mesh, config=cfg, snapshots=snaps)
    def step(params, batch):
        loss, params = coarse.value_and_update(mlp_loss, opt, delayed=True)(params, batch)
        return params, loss

    with pytest.raises(NotImplementedError, match=r"delayed=True.*Fix: drop delayed=True"):
        step(mlp_init(jax.random.key(1), SIZES), _batches(1, 2)[0])


def test_a_snapshot_of_a_delayed_step_is_refused():
    mesh = MESHES["device-proxies"]()
    step = _step(mesh, coarse.optim.sgd(0.1))
    step(mlp_init(jax.random.key(2), SIZES), _batches(1, 2)[0])
    with pytest.raises(NotImplementedError, match=r"pending gradient"):
        step.snapshot()


def test_memory_report_counts_the_pending_gradient():
    """Before the first call the report is the runtime's layout; after it, what the proxies
    hold: the same bytes, the pending gradient's two buffers and the check's scratch in."""
    mesh = MESHES["device-proxies"]()
    params = mlp_init(jax.random.key(3), SIZES)
    batch = _batches(1, 2)[0]
    delayed, plain = (
        _step(mesh, coarse.optim.adam(1e-3)),
        _step(mesh, coarse.optim.adam(1e-3), False),
    )
    before = coarse.diagnostics.memory_report(delayed, params, batch).proxy.optimizer_bytes
    delayed(params, batch)
    after = coarse.diagnostics.memory_report(delayed, params, batch).proxy.optimizer_bytes
    assert before == after
    # Adam: 6 floats per owned element, 9 with the pending gradient and the scratch.
    base = coarse.diagnostics.memory_report(plain, params, batch).proxy.optimizer_bytes - 32
    assert after - 32 == base * 9 // 6, (after, base)


@pytest.mark.parametrize("where", ["gpu", "host"])
def test_the_delayed_update_on_a_gpu(where):
    """On a GPU (COARSE_TEST_GPU=1, tools/gpu_check.sh): p = 1, the proxy on the GPU or in
    host memory, against the same oracle on the GPU."""
    if os.environ.get("COARSE_TEST_GPU") != "1":
        pytest.skip("a GPU test: COARSE_TEST_GPU=1 on a GPU host")
    gpu, _ = gpu_or_skip()
    mesh = (
        shared_device_mesh(1, devices=[gpu])
        if where == "gpu"
        else coarse.make_mesh(workers=1, proxies_on="host", devices=[gpu])
    )
    _, opt, tx = CASES[0]
    params = jax.device_put(mlp_init(jax.random.key(15), SIZES), gpu)
    batches = [jax.device_put(b, gpu) for b in _batches(4, 1)]
    want, _ = _delayed_oracle(1, tx, params, batches)
    step, p = _step(mesh, opt), params
    for batch, w in zip(batches, want, strict=True):
        p, _ = step(p, batch)
        assert_tree_close(jax.device_get(p), jax.device_get(w), rtol=1e-5, atol_scale=1e-5)
