"""Flax NNX steps under coarse.sync, and jax.jit's options (donate, static) on a step."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import coarse_jax as coarse


class MLP(nnx.Module):
    def __init__(self, *, rngs, dropout=0.0, batch_norm=False):
        self.l1 = nnx.Linear(12, 32, rngs=rngs)
        self.bn = nnx.BatchNorm(32, rngs=rngs) if batch_norm else None
        self.dropout = nnx.Dropout(dropout, rngs=rngs) if dropout else None
        self.l2 = nnx.Linear(32, 3, rngs=rngs)

    def __call__(self, x):
        x = self.l1(x)
        if self.bn is not None:
            x = self.bn(x)
        x = nnx.gelu(x)
        if self.dropout is not None:
            x = self.dropout(x)
        return self.l2(x)


def loss_fn(model, batch):
    logits = model(batch["x"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
    return loss, logits


def _batches(n, size, seed=0):
    rng = np.random.default_rng(seed)
    teacher = rng.standard_normal((12, 3))
    out = []
    for _ in range(n):
        x = rng.standard_normal((size, 12)).astype(np.float32)
        out.append({"x": x, "label": np.argmax(x @ teacher, -1).astype(np.int32)})
    return out


def test_nnx_step_matches_nnx_jit_on_one_device():
    """The Flax NNX step, with only the decorator and value_and_grad swapped, trains as nnx.jit."""
    mesh = coarse.make_mesh(workers=4)
    batches = _batches(20, 32)

    def make():
        model = MLP(rngs=nnx.Rngs(0))
        return model, nnx.Optimizer(model, optax.sgd(0.1, momentum=0.9), wrt=nnx.Param)

    @nnx.jit
    def reference_step(model, optimizer, batch):
        (loss, _), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, batch)
        optimizer.update(model, grads)
        return loss

    @coarse.sync(mesh)
    def coarse_step(model, optimizer, batch):
        (loss, _), grads = coarse.value_and_grad(loss_fn, has_aux=True)(model, batch)
        optimizer.update(model, grads)
        return loss

    with jax.default_device(jax.devices()[0]):
        ref_model, ref_opt = make()
        want = [float(reference_step(ref_model, ref_opt, b)) for b in batches]
    model, optimizer = make()
    got = [float(coarse_step(model, optimizer, b)) for b in batches]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert int(optimizer.step[...]) == 20
    for a, b in zip(
        jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(ref_model)), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_nnx_dropout_and_batch_norm_train_without_split_or_merge():
    mesh = coarse.make_mesh(workers=4)
    model = MLP(rngs=nnx.Rngs(0, dropout=1), dropout=0.2, batch_norm=True)
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    metrics = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"))

    @coarse.sync(mesh)
    def train_step(model, optimizer, metrics, batch):
        (loss, logits), grads = coarse.value_and_grad(loss_fn, has_aux=True)(model, batch)
        metrics.update(loss=loss, logits=logits, labels=batch["label"])
        optimizer.update(model, grads)

    losses = []
    for batch in _batches(50, 64, seed=1):
        train_step(model, optimizer, metrics, batch)
        losses.append(float(metrics.compute()["loss"]))
        metrics.reset()
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])
    # The batch statistics moved, and are one value on every device.
    mean = model.bn.mean[...]
    assert float(jnp.abs(mean).sum()) > 0
    assert len({np.asarray(s.data).tobytes() for s in mean.addressable_shards}) == 1
    assert int(model.dropout.rngs.count[...]) == 50  # one draw per step, counted once


def test_each_worker_draws_its_own_dropout_mask():
    mesh = coarse.make_mesh(workers=2)
    model = MLP(rngs=nnx.Rngs(0, dropout=3), dropout=0.5)

    @coarse.sync(mesh, batch_outputs=1)
    def step(model, batch):
        (loss, logits), _ = coarse.value_and_grad(loss_fn, has_aux=True)(model, batch)
        return loss, logits

    x = np.ones((1, 12), np.float32)
    batch = {"x": np.concatenate([x, x]), "label": np.zeros(2, np.int32)}
    _, logits = step(model, batch)  # the same example on both workers
    assert not np.array_equal(np.asarray(logits[0]), np.asarray(logits[1]))


def test_donation_frees_the_donated_buffers():
    mesh = coarse.make_mesh(workers=2)

    @coarse.sync(mesh, donate_argnums=0)
    def step(params, batch):
        loss, grads = coarse.value_and_grad(lambda p, b: jnp.mean((b @ p) ** 2))(params, batch)
        return params - 0.1 * grads, loss

    params = jnp.ones((8, 2))
    new, _ = step(params, jnp.ones((4, 8)))
    assert params.is_deleted()
    new2, _ = step(new, jnp.ones((4, 8)))
    assert new.is_deleted() and not new2.is_deleted()


def test_static_argnums_compile_in_python_values():
    mesh = coarse.make_mesh(workers=2)

    @coarse.sync(mesh, static_argnums=1)
    def step(x, how, batch):
        y = coarse.all_reduce(batch[0] * x)
        return y * 2 if how == "double" else y

    x, batch = jnp.ones(3), jnp.ones((2, 3))
    np.testing.assert_array_equal(step(x, "double", batch), 2 * np.ones(3))
    np.testing.assert_array_equal(step(x, "plain", batch), np.ones(3))
    assert step.stats()["compiled"] == 2
    with pytest.raises(TypeError, match=r"static argument 1 must be hashable"):
        step(x, ["double"], batch)


def test_calls_are_counted_under_an_outer_jit():
    mesh = coarse.make_mesh(workers=2)

    @coarse.sync(mesh)
    def step(x, batch):
        return coarse.all_reduce(batch[0] + x)

    outer = jax.jit(step)
    for _ in range(3):
        jax.block_until_ready(outer(jnp.ones(3), jnp.ones((2, 3))))
    jax.effects_barrier()
    assert step.stats()["calls"] == 3


def test_an_nnx_step_that_returns_nothing_is_still_bounded_in_flight():
    mesh = coarse.make_mesh(workers=2)
    model = MLP(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.sgd(0.01), wrt=nnx.Param)

    @coarse.sync(mesh)
    def train_step(model, optimizer, batch):
        (_, _), grads = coarse.value_and_grad(loss_fn, has_aux=True)(model, batch)
        optimizer.update(model, grads)

    for batch in _batches(6, 8, seed=2):
        assert train_step(model, optimizer, batch) is None
        assert 1 <= train_step.stats()["in_flight"] <= 2
    assert int(optimizer.step[...]) == 6


def test_state_a_step_does_not_change_stays_bitwise_the_same():
    """Batch statistics in eval mode are read, not written: no averaging may round them.

    (At p = 3 the workers' mean of three equal floats, (x + x + x) / 3, is not
    always x: state every device holds must not be averaged at all.)
    """
    mesh = coarse.make_mesh(workers=3)
    model = MLP(rngs=nnx.Rngs(0), batch_norm=True)
    rng = np.random.default_rng(5)
    model.bn.mean[...] = jnp.asarray(rng.standard_normal(32) / 3, jnp.float32)
    model.bn.var[...] = jnp.asarray(rng.uniform(0.5, 2.0, 32), jnp.float32)
    before = (np.asarray(model.bn.mean[...]), np.asarray(model.bn.var[...]))
    model.eval()
    optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)

    @coarse.sync(mesh)
    def train_step(model, optimizer, batch):
        (loss, _), grads = coarse.value_and_grad(loss_fn, has_aux=True)(model, batch)
        optimizer.update(model, grads)
        return loss

    for batch in _batches(3, 12, seed=3):
        train_step(model, optimizer, batch)
    np.testing.assert_array_equal(np.asarray(model.bn.mean[...]), before[0])
    np.testing.assert_array_equal(np.asarray(model.bn.var[...]), before[1])


def test_nnx_modules_that_change_their_state_draw_per_worker():
    """A module that draws random numbers in a step: a mask per worker, the stream moves."""
    mesh = coarse.make_mesh(workers=2)
    drop = nnx.Dropout(0.5, rngs=nnx.Rngs(dropout=3))

    @coarse.sync(mesh, batch_outputs=0)
    def masks(drop, batch):
        return (drop(batch),)

    (out,) = masks(drop, jnp.ones((2, 64)))
    assert not np.array_equal(np.asarray(out[0]), np.asarray(out[1]))  # a mask per worker
    assert int(drop.rngs.count[...]) == 1
    (again,) = masks(drop, jnp.ones((2, 64)))
    assert not np.array_equal(np.asarray(again), np.asarray(out))  # the stream moved on
    assert int(drop.rngs.count[...]) == 2


def test_nnx_diff_state_filters_what_is_differentiated():
    """argnums=nnx.DiffState(0, filter), as for nnx.value_and_grad: gradients of those only."""
    mesh = coarse.make_mesh(workers=4)
    model = MLP(rngs=nnx.Rngs(0))
    wrt = nnx.All(nnx.Param, nnx.PathContains("l2"))
    (batch,) = _batches(1, 32, seed=4)

    @coarse.sync(mesh)
    def grads_of_l2(model, batch):
        return coarse.value_and_grad(loss_fn, argnums=nnx.DiffState(0, wrt), has_aux=True)(
            model, batch
        )[1]

    got = grads_of_l2(model, batch)
    with jax.default_device(jax.devices()[0]):
        want = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, wrt), has_aux=True)(
            model, batch
        )[1]
    got_flat, want_flat = dict(nnx.to_flat_state(got)), dict(nnx.to_flat_state(want))
    assert set(got_flat) == set(want_flat) and all("l2" in p for p in got_flat)
    for path, g in got_flat.items():
        np.testing.assert_allclose(
            np.asarray(g.get_value()), np.asarray(want_flat[path].get_value()), rtol=1e-5, atol=1e-7
        )
