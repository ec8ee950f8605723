"""Code written for jit or pmap keeps its own gradient reductions inside a coarse step.

Issue 50: a pmap step converted to `coarse.sync` keeps ``jax.value_and_grad`` and
its ``lax.pmean(grads, "data")`` (or ``psum / p``, flax's ``DynamicScale`` with
``axis_name``, optax's ``sam(batch_axis_name=...)``). Each must give what it gives
under ``jax.pmap``; a jit step that keeps ``jax.grad`` with no reduction, or a loss
averaged with ``lax.pmean`` inside ``coarse.value_and_grad``, must give what
``jax.jit`` gives on the whole batch. The oracles are jax's own
``pmap`` and ``jit`` (no coarse code), compared on the same state and batch at
float32 rounding: at most 4 workers' sums in another order. The floor, measured
over every idiom, p and placement with 4 seeds each: 1.7e-7 of the largest
element; the tolerance is 2e-6, ten times that.

Hypothesis draws the idiom, the worker count (1, 2, 4), where the proxies live
(devices or host memory) and the data. Steps and oracles are compiled once per
(idiom, p, placement) and reused across draws.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training import dynamic_scale as dynamic_scale_lib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax import lax

import coarse_jax as coarse

D_IN, D_OUT, BATCH = 3, 4, 8
RTOL = 2e-6


def loss_fn(params, batch):
    h = jnp.tanh(batch["x"] @ params["w"] + params["b"])
    return jnp.mean((h - batch["y"]) ** 2) + 1e-2 * jnp.sum(params["w"] ** 2)


def _grads(params, batch):
    return jax.grad(loss_fn)(params, batch)


def _sam():
    return optax.contrib.sam(
        optax.sgd(0.1), optax.sgd(0.05), sync_period=2, opaque_mode=True, batch_axis_name="data"
    )


# Each idiom: (step body written as the user writes it, with axis "data"; oracle kind).
# The body takes (params, batch) and returns a tree of arrays the same on every worker.
def _pmean(params, batch):
    return lax.pmean(_grads(params, batch), "data")


def _psum_over_p(params, batch):
    p = lax.psum(1, "data")
    return jax.tree.map(lambda g: lax.psum(g, "data") / p, _grads(params, batch))


def _psum(params, batch):
    return lax.psum(_grads(params, batch), "data")


def _pmean_of_loss_and_grads(params, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    return lax.pmean((loss, grads), "data")


def _dynamic_scale(params, batch):
    scale = dynamic_scale_lib.DynamicScale(growth_interval=1)
    new_scale, finite, loss, grads = scale.value_and_grad(loss_fn, axis_name="data")(params, batch)
    return new_scale.scale, finite, lax.pmean(loss, "data"), grads


def _sam_update(params, batch):
    tx = _sam()
    grads = lax.pmean(_grads(params, batch), "data")
    updates, _ = tx.update(grads, tx.init(params), params, grad_fn=lambda p, _: _grads(p, batch))
    return optax.apply_updates(params, updates)


def _sgd_step(params, batch):  # the jit idiom: jax.grad of the whole batch, no reduction
    return jax.tree.map(lambda w, g: w - 0.1 * g, params, _grads(params, batch))


PMAP = {
    "pmean": _pmean,
    "psum / p": _psum_over_p,
    "psum": _psum,
    "pmean of (loss, grads)": _pmean_of_loss_and_grads,
    "DynamicScale(axis_name)": _dynamic_scale,
    "optax sam(batch_axis_name)": _sam_update,
}


def _coarse_grad_of_pmean_loss(params, batch):  # a loss averaged inside, then coarse's grad
    return coarse.value_and_grad(lambda p, b: lax.pmean(loss_fn(p, b), "data"))(params, batch)[1]


# Each: (the step's body, the jax.jit oracle on the whole batch).
JIT = {
    "jax.grad, no reduction": (_sgd_step, _sgd_step),
    "coarse.value_and_grad of a pmean'd loss": (_coarse_grad_of_pmean_loss, _grads),
}


@functools.cache
def _mesh(p: int, placement: str):
    return coarse.make_mesh(workers=p, proxies_on=placement)


@functools.cache
def _coarse_step(idiom: str, p: int, placement: str):
    fn = PMAP[idiom] if idiom in PMAP else JIT[idiom][0]
    return coarse.sync(fn, mesh=_mesh(p, placement))


@functools.cache
def _oracle(idiom: str, p: int):
    if idiom in JIT:
        return jax.jit(JIT[idiom][1])
    pmapped = jax.pmap(PMAP[idiom], axis_name="data", devices=jax.devices()[:p])

    def run(params, batch):
        stacked = jax.tree.map(lambda x: jnp.stack([x] * p), params)
        split = jax.tree.map(lambda x: x.reshape(p, -1, *x.shape[1:]), batch)
        out = pmapped(stacked, split)
        every = jax.tree.map(np.asarray, out)
        # pmap's outputs are per device; each idiom's is the same on every device.
        for leaf in jax.tree.leaves(every):
            np.testing.assert_array_equal(leaf, np.broadcast_to(leaf[:1], leaf.shape))
        return jax.tree.map(lambda x: x[0], every)

    return run


def _data(seed: int):
    k = jax.random.split(jax.random.key(seed), 4)
    params = {
        "w": jax.random.normal(k[0], (D_IN, D_OUT)),
        "b": 0.1 * jax.random.normal(k[1], (D_OUT,)),
    }
    batch = {
        "x": jax.random.normal(k[2], (BATCH, D_IN)),
        "y": jax.random.normal(k[3], (BATCH, D_OUT)),
    }
    return params, batch


def _check(idiom: str, p: int, placement: str, seed: int) -> None:
    params, batch = _data(seed)
    got = jax.tree.map(np.asarray, _coarse_step(idiom, p, placement)(params, batch))
    want = _oracle(idiom, p)(params, batch)
    assert jax.tree.structure(got) == jax.tree.structure(want), idiom
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        if g.dtype == np.bool_:
            np.testing.assert_array_equal(g, w, err_msg=idiom)
        else:
            scale = max(float(np.max(np.abs(w))), 1e-6)
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=RTOL * scale, err_msg=idiom)


@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    idiom=st.sampled_from(sorted(PMAP) + sorted(JIT)),
    p=st.sampled_from([1, 2, 4]),
    placement=st.sampled_from(["devices", "host"]),
    seed=st.integers(0, 2**16),
)
def test_kept_reductions_give_the_pmap_result(idiom, p, placement, seed):
    _check(idiom, p, placement, seed)


@pytest.mark.parametrize("idiom", sorted(PMAP) + sorted(JIT))
def test_each_idiom_at_four_workers(idiom):
    """Every idiom at least once at the worker count where a wrong gradient is 4x."""
    _check(idiom, 4, "devices", seed=7)


def test_the_sum_over_workers_is_caught(monkeypatch):
    """The deliberate bug the tests above must catch: without the step's mean-normalized
    gradients (jax's own rule inside shard_map), a kept pmean is p times the mean."""
    import contextlib

    from coarse_jax.dispatch import program

    monkeypatch.setattr(
        program._jax_compat, "mean_gradients", lambda sizes: contextlib.nullcontext()
    )
    params, batch = _data(3)
    step = coarse.sync(_pmean, mesh=_mesh(4, "devices"))
    want = _oracle("pmean", 4)(params, batch)
    got = step(params, batch)
    np.testing.assert_allclose(got["w"], 4 * want["w"], rtol=1e-5)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(got["w"], want["w"], rtol=RTOL)


def _batchnorm_batch(params, batch):
    import flax.linen as nn

    bn = nn.BatchNorm(use_running_average=False, axis_name="batch")
    variables = bn.init(jax.random.key(0), batch["x"])
    return bn.apply(variables, batch["x"], mutable=["batch_stats"])[1]


@pytest.mark.parametrize(
    "use",
    [
        lambda params, batch: lax.pmean(_grads(params, batch), "batch"),
        lambda params, batch: jax.jit(lambda g: lax.psum(g, "batch"))(_grads(params, batch)),
        lambda params, batch: lax.axis_index("batch"),
        _batchnorm_batch,
    ],
    ids=["pmean", "psum in an inner jit", "axis_index", "flax BatchNorm"],
)
def test_an_axis_name_the_step_does_not_have_is_refused_with_both_names(use):
    step = coarse.sync(use, mesh=_mesh(2, "devices"))
    with pytest.raises(ValueError, match=r"axis name 'batch'.*mesh axis 'data'.*Fix: name"):
        step(*_data(0))


def _f16_loss(params, batch):
    """A mixed-precision loss as flax's examples write one: float32 params, float16 compute."""
    h = jnp.tanh(batch["x"].astype(jnp.float16) @ params["w"].astype(jnp.float16))
    return jnp.mean((h.astype(jnp.float32) - batch["y"][:, : h.shape[1]]) ** 2)


def _mixed_precision_step(scale, params, batch):
    new_scale, finite, loss, grads = scale.value_and_grad(_f16_loss, axis_name="data")(
        params, batch
    )
    new_params = jax.tree.map(lambda w, g: jnp.where(finite, w - 0.5 * g, w), params, grads)
    return new_scale, finite, lax.pmean(loss, "data"), new_params


# The lockstep feeds pmap's state back as numpy: its weak types become strong once.
@pytest.mark.filterwarnings("ignore:.*XLA compiled the step again")
def test_dynamic_scale_in_float16_steps_in_lockstep_with_flax_under_pmap():
    """flax's DynamicScale with axis_name, float16 compute, 8 steps from a scale that
    overflows float16 (so it backs off) and then grows: the finite flag and the scale
    equal pmap's at every step, the params within float16 rounding (the workers'
    float16 gradients are averaged in float32 inside the step, rounded once to float16
    where pmap's stay float32 until its pmean: at most one float16 ulp, 2**-10
    relative, of the largest gradient times the learning rate)."""
    p = 4
    step = coarse.sync(_mixed_precision_step, mesh=_mesh(p, "devices"))
    pmapped = jax.pmap(_mixed_precision_step, axis_name="data", devices=jax.devices()[:p])
    scale = dynamic_scale_lib.DynamicScale(growth_interval=2, scale=2.0**18)
    params, batch = _data(11)
    finite_seen = []
    for _ in range(8):
        got_scale, got_finite, got_loss, got_params = step(scale, params, batch)
        stack = lambda t: jax.tree.map(lambda x: jnp.stack([x] * p), t)  # noqa: E731
        split = jax.tree.map(lambda x: x.reshape(p, -1, *x.shape[1:]), batch)
        want_scale, want_finite, want_loss, want_params = jax.tree.map(
            lambda x: np.asarray(x[0]), pmapped(stack(scale), stack(params), split)
        )
        assert bool(got_finite) == bool(want_finite)
        assert float(got_scale.scale) == float(want_scale.scale)
        assert int(got_scale.fin_steps) == int(want_scale.fin_steps)
        np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
        for g, w, before in zip(
            jax.tree.leaves(got_params),
            jax.tree.leaves(want_params),
            jax.tree.leaves(params),
            strict=True,
        ):
            moved = np.max(np.abs(np.asarray(w) - np.asarray(before)))
            np.testing.assert_allclose(g, w, rtol=0, atol=2.0**-10 * max(moved, 1e-12) + 1e-7)
        finite_seen.append(bool(want_finite))
        scale, params = want_scale, want_params  # lockstep: both from pmap's state
    assert False in finite_seen and True in finite_seen, finite_seen  # it backed off and ran


def _imagenet_parts(with_dynamic_scale: bool):
    """flax's ImageNet train_step as flax writes it (axis "data"), a small conv net with
    BatchNorm(axis_name="data"), its TrainState with batch_stats and DynamicScale."""
    import flax.linen as nn
    from flax.training import train_state

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = True):
            norm = functools.partial(
                nn.BatchNorm, use_running_average=not train, momentum=0.9, axis_name="data"
            )
            x = nn.relu(norm()(nn.Conv(6, (3, 3))(x)))
            x = nn.relu(norm()(nn.Conv(6, (3, 3))(x)) + x)
            return nn.Dense(10)(jnp.mean(x, axis=(1, 2)))

    class State(train_state.TrainState):
        batch_stats: dict
        dynamic_scale: dynamic_scale_lib.DynamicScale | None

    def train_step(state, batch):
        def loss_fn(params):
            logits, new_model_state = state.apply_fn(
                {"params": params, "batch_stats": state.batch_stats},
                batch["image"],
                mutable=["batch_stats"],
            )
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
            l2 = sum(jnp.sum(x**2) for x in jax.tree.leaves(params) if x.ndim > 1)
            return loss + 0.0001 * 0.5 * l2, (new_model_state, logits)

        dynamic_scale = state.dynamic_scale
        if dynamic_scale:
            grad_fn = dynamic_scale.value_and_grad(loss_fn, has_aux=True, axis_name="data")
            dynamic_scale, is_fin, aux, grads = grad_fn(state.params)
        else:
            aux, grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
            grads = lax.pmean(grads, axis_name="data")
        new_model_state, _ = aux[1]
        metrics = lax.pmean({"loss": aux[0]}, axis_name="data")
        new_state = state.apply_gradients(
            grads=grads, batch_stats=lax.pmean(new_model_state["batch_stats"], "data")
        )
        if dynamic_scale:
            keep = functools.partial(jnp.where, is_fin)
            new_state = new_state.replace(
                opt_state=jax.tree.map(keep, new_state.opt_state, state.opt_state),
                params=jax.tree.map(keep, new_state.params, state.params),
                dynamic_scale=dynamic_scale,
            )
        return new_state, metrics

    model = Net()
    images = np.random.default_rng(1).random((16, 8, 8, 3), dtype=np.float32)
    variables = model.init(jax.random.key(0), images[:2], train=False)
    state = State.create(
        apply_fn=model.apply,
        params=variables["params"],
        batch_stats=variables["batch_stats"],
        tx=optax.sgd(0.1, 0.9, nesterov=True),
        dynamic_scale=(
            dynamic_scale_lib.DynamicScale(scale=jnp.float32(2.0**15))
            if with_dynamic_scale
            else None
        ),
    )
    return train_step, state, {"image": images, "label": np.arange(16) % 10}


@pytest.mark.parametrize("with_dynamic_scale", [False, True])
def test_flax_imagenet_pmap_step_in_lockstep_with_pmap(with_dynamic_scale):
    """flax's ImageNet step converted from pmap (batch_stats pmean'd, BatchNorm with
    axis_name, weight decay in the loss, SGD with nesterov, DynamicScale or a kept
    pmean): 3 steps, each from pmap's state, equal to pmap's at float32 rounding
    (the same tolerance as above, relative to the state's largest element)."""
    p = 4
    train_step, state, batch = _imagenet_parts(with_dynamic_scale)
    step = coarse.sync(train_step, mesh=_mesh(p, "devices"))
    pmapped = jax.pmap(
        train_step,
        in_axes=(None, 0),
        out_axes=(None, 0),
        axis_name="data",
        devices=jax.devices()[:p],
    )
    split = jax.tree.map(lambda x: x.reshape(p, -1, *x.shape[1:]), batch)
    for _ in range(3):
        got_state, got_metrics = step(state, batch)
        want_state, want_metrics = pmapped(state, split)
        np.testing.assert_allclose(got_metrics["loss"], want_metrics["loss"][0], rtol=RTOL)
        wants = [np.asarray(w) for w in jax.tree.leaves(want_state)]
        # Relative to the state's scale: a conv bias ahead of a BatchNorm has a zero
        # gradient whose computed value is rounding noise (1e-8) in either run.
        scale = max(float(np.abs(w).max()) for w in wants if w.dtype.kind == "f")
        for g, w in zip(jax.tree.leaves(got_state), wants, strict=True):
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=RTOL * scale)
        state = want_state  # lockstep: both from pmap's state


@pytest.mark.parametrize("coarse_first", [False, True])
def test_a_shard_map_of_the_users_own_keeps_jaxs_sum(coarse_first):
    """The mean is a coarse step's alone. jax caches the traces and transposes of inner
    jitted functions (``jnp.matmul``, a ``jax.jit`` loss) by their types: a user's own
    ``shard_map`` over the same workers, before or after a coarse step, differentiates
    with jax's rule (the workers' sum), and the coarse step with its own (the mean)."""
    from jax.sharding import PartitionSpec as P

    from coarse_jax.mesh import workers_mesh

    mesh = _mesh(4, "devices")
    params, batch = _data(5)
    jitted_loss = jax.jit(loss_fn)

    def grads(params, batch):
        return jax.grad(jitted_loss)(params, batch)

    own = jax.jit(
        jax.shard_map(grads, mesh=workers_mesh(mesh), in_specs=(P(), P("data")), out_specs=P())
    )
    step = coarse.sync(grads, mesh=mesh)
    want = _oracle("pmean", 4)(params, batch)
    runs = [("coarse", step), ("own", own)] if coarse_first else [("own", own), ("coarse", step)]
    for name, fn in runs:
        got = jax.tree.map(np.asarray, fn(params, batch))
        factor = 1 if name == "coarse" else 4
        np.testing.assert_allclose(got["w"], factor * want["w"], rtol=1e-5, err_msg=name)
