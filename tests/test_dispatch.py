"""Steps dispatched back to back, as a training loop does: no step may stall or fail.

A loop that reads its metrics every N steps dispatches the next step before
the previous finished. On XLA:CPU many queued multi-device runs can starve a
run's devices of threads (`Config.max_steps_in_flight`); the step bounds its
calls in flight, so these loops never block on their own and still pass.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import coarse_jax as coarse

TX = optax.sgd(0.05, momentum=0.9)


def _loss(params, batch):
    h = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] - batch["y"]) ** 2)


def _train_step(mesh, cfg):
    @coarse.sync(mesh, config=cfg)
    def step(params, opt_state, batch):
        loss, grads = coarse.value_and_grad(_loss)(params, batch)
        updates, opt_state = TX.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def _init(seed=0):
    rng = np.random.default_rng(seed)
    params = {
        "w1": jnp.asarray(rng.standard_normal((32, 64)) * 0.2, jnp.float32),
        "b1": jnp.zeros(64, jnp.float32),
        "w2": jnp.asarray(rng.standard_normal((64, 4)) * 0.2, jnp.float32),
    }
    return params, TX.init(params)


def _batches(n, global_batch, seed=1):
    rng = np.random.default_rng(seed)
    return [
        {
            "x": rng.standard_normal((global_batch, 32)).astype(np.float32),
            "y": rng.standard_normal((global_batch, 4)).astype(np.float32),
        }
        for _ in range(n)
    ]


def _train(step, batches, block_every):
    params, opt_state = _init()
    losses = []
    for i, batch in enumerate(batches):
        params, opt_state, loss = step(params, opt_state, batch)
        losses.append(loss)
        if block_every and i % block_every == 0:
            jax.block_until_ready(loss)
    return jax.device_get((params, losses))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["ffi", "reference"])
def test_unblocked_500_step_loop_matches_the_blocked_one(mode):
    """500 steps at p = 4 on 8 CPU devices, never blocked by the loop: 0 errors, same result."""
    mesh = coarse.make_mesh(workers=4)
    # A short timeout: a stalled run fails the test in seconds, not minutes.
    cfg = coarse.Config(mode=mode, timeout_s=20.0, shard_bytes=2048, leading_bytes=1024)
    batches = _batches(500, 32)
    step = _train_step(mesh, cfg)
    unblocked = _train(step, batches, block_every=0)
    assert step.stats()["in_flight"] <= 2
    blocked = _train(_train_step(mesh, cfg), batches, block_every=1)
    # Reduction order is fixed, so dispatching ahead changes no bit.
    for a, b in zip(jax.tree.leaves(unblocked), jax.tree.leaves(blocked), strict=True):
        np.testing.assert_array_equal(a, b)
    assert np.isfinite(unblocked[1][-1]) and unblocked[1][-1] < unblocked[1][0]


def test_max_steps_in_flight_bounds_the_queue():
    mesh = coarse.make_mesh(workers=2)
    batches = _batches(6, 8)
    for limit, most in ((1, 1), (3, 3), (0, 0)):
        step = _train_step(mesh, coarse.Config(max_steps_in_flight=limit))
        params, opt_state = _init()
        for batch in batches:
            params, opt_state, _ = step(params, opt_state, batch)
            assert step.stats()["in_flight"] <= max(most, 0)
        jax.block_until_ready(params)
    with pytest.raises(ValueError, match=r"Config.max_steps_in_flight: expected None"):
        coarse.Config(max_steps_in_flight=-1)


@pytest.mark.timeout(120)
def test_a_failed_call_raises_once_where_its_outputs_are_read():
    """The in-flight bound waits on older calls; a failure there is not raised again later."""
    from coarse_jax import _ffi

    mesh = coarse.make_mesh(workers=2)

    @coarse.sync(mesh, config=coarse.Config(timeout_s=1.0, xla_below_bytes=0))
    def step(params, batch):
        return coarse.value_and_grad(lambda p, b: jnp.mean(b @ p))(params, batch)

    params, batch = jnp.ones(3), jnp.ones((4, 3))
    jax.block_until_ready(step(params, batch))
    _ffi.inject_dropped_push(1)
    failed = step(params, batch)
    with pytest.raises(Exception, match=r"timed out after 1.000 s at step 2"):
        jax.block_until_ready(failed)
    for _ in range(4):  # the failed call leaves the queue without raising again
        loss, _ = step(params, batch)
    assert float(loss) == 3.0


@pytest.mark.timeout(120)
def test_a_coarse_failure_before_an_xla_collective_fails_the_step_cleanly():
    """A lost push in a step that then runs an XLA collective: every device fails the coarse
    call (none reaches the collective alone and waits there for XLA's 40 s abort); the
    step raises within the timeout and the next one runs."""
    from jax import lax

    from coarse_jax import _ffi

    mesh = coarse.make_mesh(workers=2)

    @coarse.sync(mesh, config=coarse.Config(timeout_s=1.0, xla_below_bytes=0))
    def step(x, batch):
        y = coarse.all_reduce(batch[0] + x)
        z = lax.psum(_ffi.vary(y), "data")
        return coarse.all_reduce(z * 0 + y)

    x, batch = jnp.ones(3), jnp.ones((2, 3))
    np.testing.assert_array_equal(step(x, batch), 2 * np.ones(3))
    _ffi.inject_dropped_push(1)
    with pytest.raises(Exception, match=r"timed out after 1.000 s at step 2"):
        jax.block_until_ready(step(x, batch))
    np.testing.assert_array_equal(step(x, batch), 2 * np.ones(3))
