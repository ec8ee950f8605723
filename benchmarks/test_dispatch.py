"""A training loop that never blocks against one that blocks after every step, one run.

100 optax steps of a small MLP at p = 4 (8 CPU devices), coarse ffi with the
default `Config.max_steps_in_flight` (2 on CPU). Reported as the ratio of the
unblocked loop's median to the blocked loop's (goal: at most 1.2).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import coarse_jax as coarse

STEPS = 100
TX = optax.sgd(0.05, momentum=0.9)
_MEDIANS: dict[str, float] = {}


def _loss(params, batch):
    h = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] - batch["y"]) ** 2)


@pytest.fixture(scope="module")
def setup():
    mesh = coarse.make_mesh(workers=4)

    # xla_below_bytes=0: the runtime's calls in flight (a 0.5 MiB tree: latency route).
    @coarse.sync(mesh, config=coarse.Config(shard_bytes=16 << 10, xla_below_bytes=0))
    def step(params, opt_state, batch):
        loss, grads = coarse.value_and_grad(_loss)(params, batch)
        updates, opt_state = TX.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    rng = np.random.default_rng(0)
    params = {
        "w1": jnp.asarray(rng.standard_normal((256, 512)) * 0.05, jnp.float32),
        "b1": jnp.zeros(512, jnp.float32),
        "w2": jnp.asarray(rng.standard_normal((512, 10)) * 0.05, jnp.float32),
    }
    batch = {
        "x": jnp.asarray(rng.standard_normal((64, 256)), jnp.float32),
        "y": jnp.asarray(rng.standard_normal((64, 10)), jnp.float32),
    }
    jax.block_until_ready(step(params, TX.init(params), batch))  # compile outside the timing
    return step, params, batch


@pytest.mark.parametrize("loop", ["blocked", "unblocked"])
def test_loop(benchmark, setup, loop):
    step, params0, batch = setup

    def run():
        params, opt_state = params0, TX.init(params0)
        for _ in range(STEPS):
            params, opt_state, loss = step(params, opt_state, batch)
            if loop == "blocked":
                jax.block_until_ready(loss)
        return jax.block_until_ready(params)

    benchmark.pedantic(run, rounds=5, iterations=1)
    _MEDIANS[loop] = benchmark.stats.stats.median
    if len(_MEDIANS) == 2:
        ratio = _MEDIANS["unblocked"] / _MEDIANS["blocked"]
        print(
            f"\n{STEPS} steps: blocked {_MEDIANS['blocked'] * 1e3:.1f} ms, unblocked "
            f"{_MEDIANS['unblocked'] * 1e3:.1f} ms, ratio {ratio:.3f}"
        )
