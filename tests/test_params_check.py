"""When the proxies check the params a step gets (coarse_jax/dispatch/params_check.py).

A training loop passes back the arrays the step returned: those are vouched for by
identity and the step runs its program without the check (on a GPU the check's
verdict is a read the host waits for). Everything else is checked at once, as
before: an older call's outputs, changed values, and every call once the step has
also run inside the user's own jit, whose calls the dispatcher never sees. The
oracle is optax under lax.pmean (helpers.pmean_optax_step). Each refusal below
fails if the vouching is too generous (deliberate bug: vouch for any call after
the first; the outer-jit and older-outputs cases then return silently).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import pytest
from helpers import (
    assert_tree_close,
    coarse_update_step,
    make_batch,
    mlp_init,
    mlp_loss,
    pmean_optax_step,
)

import coarse_jax as coarse

SIZES = (8, 16, 16, 4)


def _setup(opt=None):
    mesh = coarse.make_mesh(workers=2)
    opt = opt or coarse.optim.adam(1e-2)
    params = mlp_init(jax.random.key(3), SIZES)
    batches = [make_batch(jax.random.key(40 + i), 8, 8, 4) for i in range(4)]
    return mesh, opt, params, batches


def _checked(step) -> list[bool]:
    """Which of the step's programs were built with the check (in build order)."""
    return [key[2] for key in step._compiled]


def test_a_loop_that_passes_back_what_it_got_compiles_one_program_without_the_check():
    mesh, opt, params, batches = _setup()
    step = coarse_update_step(mesh, opt)
    oracle = pmean_optax_step(2, opt.optax())
    p, want, state = params, params, opt.optax().init(params)
    for b in batches:
        p, _ = step(p, b)
        want, state, _ = oracle(want, state, b)
        # 4 steps of the same trajectory: test_value_and_update.py's tolerance for curves
        assert_tree_close(jax.device_get(p), jax.device_get(want), rtol=1e-5, atol_scale=1e-5)
    assert _checked(step) == [False]
    assert step.stats()["compiled"] == 1


def test_an_older_calls_outputs_are_refused():
    mesh, opt, params, batches = _setup()
    step = coarse_update_step(mesh, opt)
    p1, _ = step(params, batches[0])
    p2, _ = step(p1, batches[1])
    with pytest.raises(Exception, match=r"not the params it returned"):
        jax.block_until_ready(step(p1, batches[2]))  # p1 again: the store holds p2's successor
    p3, _ = step(p2, batches[2])  # the refused call changed nothing
    assert jax.tree.structure(p3) == jax.tree.structure(params)
    assert _checked(step) == [False, True]


def test_equal_values_in_new_arrays_are_checked_and_pass():
    mesh, opt, params, batches = _setup()
    step = coarse_update_step(mesh, opt)
    p1, _ = step(params, batches[0])
    copied = jax.tree.map(lambda x: jnp.array(x, copy=True), p1)  # other objects, same bits
    p2, _ = step(copied, batches[1])
    jax.block_until_ready(p2)
    assert _checked(step) == [False, True]
    p3, _ = step(p2, batches[2])  # vouched again
    jax.block_until_ready(p3)
    assert _checked(step) == [False, True]


def test_a_step_also_run_inside_the_users_jit_is_checked_from_then_on():
    mesh, opt, params, batches = _setup()
    step = coarse_update_step(mesh, opt)
    p1, _ = step(params, batches[0])

    @jax.jit
    def outer(p, b):
        return step(p, b)[0]

    p2 = outer(p1, batches[1])  # updates the store; the dispatcher never sees its outputs
    jax.block_until_ready(p2)
    with pytest.raises(Exception, match=r"not the params it returned"):
        jax.block_until_ready(step(p1, batches[2]))  # the dispatcher's last outputs: stale
    p3, _ = step(p2, batches[2])
    jax.block_until_ready(p3)


def test_params_that_are_not_passed_straight_through_are_always_checked():
    mesh, opt, params, batches = _setup()

    @coarse.sync(mesh)
    def step(params, batch):
        params = jax.tree.map(lambda x: x * 1.0, params)  # not the argument itself
        loss, params = coarse.value_and_update(mlp_loss, opt)(params, batch)
        return params, loss

    p1, _ = step(params, batches[0])
    p2, _ = step(p1, batches[1])
    jax.block_until_ready(p2)
    assert step._params_check._maps and None in step._params_check._maps.values()
    assert _checked(step) == [False, True]
    with pytest.raises(Exception, match=r"not the params it returned"):
        jax.block_until_ready(step(p1, batches[2]))


def test_two_updates_in_one_step_are_vouched_for_together():
    mesh, opt, params, batches = _setup()
    other = mlp_init(jax.random.key(5), SIZES)

    @coarse.sync(mesh)
    def step(a, b, batch):
        la, a = coarse.value_and_update(mlp_loss, opt)(a, batch)
        lb, b = coarse.value_and_update(mlp_loss, opt)(b, batch)
        return a, b, la + lb

    a1, b1, _ = step(params, other, batches[0])
    a2, b2, _ = step(a1, b1, batches[1])
    jax.block_until_ready((a2, b2))
    assert _checked(step) == [False]
    with pytest.raises(Exception, match=r"not the params it returned"):
        jax.block_until_ready(step(a2, b1, batches[2]))  # b1: one call old
    assert _checked(step) == [False, True]
    # The refused call committed neither update (the first's session ended with the
    # second's failure, not at its proxies' timeout): the next call goes on at once.
    start = time.monotonic()
    a3, b3, _ = step(a2, b2, batches[2])
    jax.block_until_ready((a3, b3))
    assert time.monotonic() - start < 30, "the next call waited for the failed step's leftovers"


def test_reset_and_load_seed_without_a_second_program():
    mesh, opt, params, batches = _setup()
    step = coarse_update_step(mesh, opt)
    p1, _ = step(params, batches[0])
    step.reset_optimizer()
    p2, _ = step(params, batches[1])  # other params after a reset: seeded, not checked
    step.load_optimizer_state(params, opt.optax().init(params))
    p3, _ = step(params, batches[2])
    jax.block_until_ready((p1, p2, p3))
    assert _checked(step) == [False]


def test_flax_nnx_split_and_update_keep_the_arrays_the_step_returned():
    """NNX: `nnx.update(model, new)` then `nnx.split(model, nnx.Param)` hands back the very
    arrays the step returned, so the loop runs without the check."""
    nnx = pytest.importorskip("flax.nnx")
    mesh, opt, _, batches = _setup()
    model = nnx.Linear(8, 4, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)

    def loss_fn(params, batch):
        return jnp.mean((nnx.merge(graphdef, params)(batch["x"]) - batch["y"]) ** 2)

    @coarse.sync(mesh)
    def step(params, batch):
        loss, params = coarse.value_and_update(loss_fn, opt)(params, batch)
        return params, loss

    for batch in batches:
        new, _ = step(params, batch)
        nnx.update(model, new)
        _, params = nnx.split(model, nnx.Param)
    jax.block_until_ready(params)
    assert _checked(step) == [False]


def test_a_memory_report_before_the_first_call_adds_no_program():
    """memory_report traces the step (its stores exist then), but no call has seeded them:
    the first call still runs the program without the check, and the loop stays on it."""
    mesh, opt, params, batches = _setup()
    step = coarse_update_step(mesh, opt)
    coarse.diagnostics.memory_report(step, params, batches[0])
    p = params
    for b in batches:
        p, _ = step(p, b)
    jax.block_until_ready(p)
    assert _checked(step) == [False]
