"""A step's compiles are what XLA compiled, and a recompile says why (issue 50).

``jax.jit`` compiles a program once per argument type and placement. A coarse
step's ``stats()["compiled"]`` counts those compiles (not only its programs),
warns once when a later call compiles again, naming the argument and whether
its weak type or its placement changed, and puts a first call's host values
where its outputs will be, so a flax ``TrainState`` loop compiles once.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training import train_state
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse
from coarse_jax.mesh import workers_mesh


def _state(width: int = 2):
    return train_state.TrainState.create(
        apply_fn=None, params={"w": jnp.ones((3, width))}, tx=optax.sgd(0.1)
    )


def _step(mesh):
    @coarse.sync(mesh)
    def step(state, batch):
        loss, grads = coarse.value_and_grad(lambda p, b: jnp.mean((b @ p["w"]) ** 2))(
            state.params, batch
        )
        return state.apply_gradients(grads=grads), loss

    return step


BATCH = np.ones((8, 3), np.float32)


def test_a_train_state_loop_compiles_once():
    """TrainState.create's step is a Python int; the first call's state is put where the
    outputs will be, so the second call (the outputs) runs the same executable."""
    step = _step(coarse.make_mesh(workers=4))
    state = _state()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for _ in range(3):
            state, _ = step(state, BATCH)
    assert step.stats()["compiled"] == 1
    assert step.stats()["calls"] == 3


def test_a_weak_type_that_became_strong_is_counted_and_named_once():
    step = _step(coarse.make_mesh(workers=4))
    state, _ = step(_state(), BATCH)
    restored = state.replace(step=jnp.asarray(state.step, jnp.int32))  # as from a checkpoint
    with pytest.warns(RuntimeWarning) as caught:
        state, _ = step(restored, BATCH)
    (warning,) = [w for w in caught if "compiled the step again" in str(w.message)]
    message = str(warning.message)
    assert "argument 0 (state).step" in message and "weak type changed" in message, message
    assert "jnp.asarray(x, jnp.int32)" in message, message
    assert step.stats()["compiled"] == 2  # one program, two executables
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # warned once per step
        step(state.replace(step=1), BATCH)  # a Python int again: the first executable
        step(state.replace(step=jnp.int16(1)), BATCH)  # a third type: counted, not warned
    assert step.stats()["compiled"] == 3


def test_another_placement_on_the_workers_is_named():
    mesh = coarse.make_mesh(workers=4)
    step = _step(mesh)
    state, _ = step(_state(width=4), BATCH)
    # The same devices, the columns split over the workers: another executable.
    split = NamedSharding(workers_mesh(mesh), P(None, "data"))
    moved = state.replace(params={"w": jax.device_put(state.params["w"], split)})
    with pytest.warns(
        RuntimeWarning, match=r"argument 0 \(state\).params\['w'\].*placement changed"
    ):
        step(moved, BATCH)
    assert step.stats()["compiled"] == 2


@pytest.mark.parametrize(
    ("batch", "cause", "fix"),
    [
        (np.ones((16, 3), np.float32), "shape changed", "one shape"),
        (np.ones((8, 3), np.float16), "dtype changed", "x.astype(jnp.float32)"),
    ],
    ids=["shape", "dtype"],
)
def test_a_batch_of_another_shape_or_dtype_names_that_cause_and_its_fix(batch, cause, fix):
    """The recompile warning names the cause it found and a fix for that cause, not the
    placement's fix ("host arrays, or NamedSharding") whatever the cause."""
    step = _step(coarse.make_mesh(workers=4))
    state, _ = step(_state(), BATCH)
    with pytest.warns(RuntimeWarning) as caught:
        step(state, batch)
    (warning,) = [w for w in caught if "compiled the step again" in str(w.message)]
    message = str(warning.message)
    assert "batch argument 1 (batch)" in message and cause in message, message
    assert fix in message and "host arrays" not in message, message


def test_a_pmap_output_replicated_on_the_workers_runs_the_same_executable():
    """pmap's ``out_axes=None`` output lives on the same devices under another mesh:
    it is taken as the step's own outputs are (no compile, no copy)."""
    mesh = coarse.make_mesh(workers=4)
    step = _step(mesh)
    state, _ = step(_state(), BATCH)
    flat = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("d",))
    renamed = jax.tree.map(lambda x: jax.device_put(x, NamedSharding(flat, P())), state)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        step(renamed, BATCH)
    assert step.stats()["compiled"] == 1
