"""Equinox Modules through `coarse.sync` (issue 63): non-array leaves, vmap-axis
collectives (eqx.nn.BatchNorm), a loop carry that starts as a constant.

The oracles share no code with coarse_jax: ``eqx.filter_jit`` over ``jax.shard_map``,
``eqx.filter_value_and_grad`` on params cast to vary per worker, ``lax.pmean``
over "data" and an optax update, from the same model and data, in lockstep
(every step starts both from the same model).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse

# Measured on this 2-core x86 host (both meshes, 3 lockstep steps): the CNN's
# gradients differ from the oracle's by at most 5.6e-8 of the tree's largest
# gradient, the SGD step's params by 9.3e-8, the loss not at all (f32 rounding:
# the proxies' ring sums in another order than XLA's psum). 1e-5 leaves room
# for another CPU's codegen (pytest marker "rounding").
RTOL = 1e-5
# Adam divides by the root of its second moment, which scales a rounding-level
# difference of a small gradient up: the value_and_update params differ
# elementwise by at most 6.0e-6 (devices) and 2.8e-6 (host) of their own size.
ADAM_RTOL = 1e-4
LR = 0.1
WORKERS = 4
MESHES = {
    "devices": {"workers": 4, "proxies": 4},
    "host": {"workers": 4, "proxies": 2, "proxies_on": "host"},
}


class CNN(eqx.Module):
    """Equinox's CNN-on-MNIST model, small: a list of layers mixing Modules and functions."""

    layers: list

    def __init__(self, key: jax.Array) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        self.layers = [
            eqx.nn.Conv2d(1, 2, kernel_size=3, key=k1),
            eqx.nn.MaxPool2d(kernel_size=2),
            jax.nn.relu,
            jnp.ravel,
            eqx.nn.Linear(2 * 5 * 5, 16, key=k2),
            jax.nn.sigmoid,
            eqx.nn.Linear(16, 10, key=k3),
            jax.nn.log_softmax,
        ]

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = layer(x)
        return x


def cnn_loss(model: CNN, x: jax.Array, y: jax.Array) -> jax.Array:
    logp = jax.vmap(model)(x)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def data(seed: int, n: int = 16) -> tuple[jax.Array, jax.Array]:
    kx, ky = jax.random.split(jax.random.key(seed))
    return jax.random.normal(kx, (n, 1, 8, 8)), jax.random.randint(ky, (n,), 0, 10)


def flat_mesh() -> jax.sharding.Mesh:
    return jax.sharding.Mesh(np.array(jax.devices()[:WORKERS]), ("data",))


def oracle_grads(loss_fn):
    """``(model, *batch) -> (mean loss, mean grads)``: eqx.filter_jit(shard_map) + pmean."""

    @eqx.filter_jit
    def step(model, *batch):
        params, static = eqx.partition(model, eqx.is_array)

        @jax.shard_map(mesh=flat_mesh(), in_specs=(P(), *[P("data")] * len(batch)), out_specs=P())
        def body(params, *batch):
            # Varying params: otherwise their gradients come back already summed.
            params = lax.pcast(params, "data", to="varying")
            loss, grads = eqx.filter_value_and_grad(loss_fn)(eqx.combine(params, static), *batch)
            return lax.pmean((loss, eqx.filter(grads, eqx.is_array)), "data")

        return body(params, *batch)

    return step


def sgd(model, grads):
    return eqx.apply_updates(model, jax.tree.map(lambda g: -LR * g, grads))


def assert_close(actual, expected, rtol=RTOL):
    """Same structure, same non-array leaves, array leaves close. atol: rtol times the
    tree's largest value, which absorbs a leaf whose exact value is 0 (the gradient of a
    bias right before a BatchNorm: pure rounding noise, 1e-8 here)."""
    a_arr, a_static = eqx.partition(actual, eqx.is_array)
    e_arr, e_static = eqx.partition(expected, eqx.is_array)
    assert jax.tree.structure(a_static) == jax.tree.structure(e_static)
    assert jax.tree.leaves(a_static) == jax.tree.leaves(e_static)
    wanted = [np.asarray(e, np.float64) for e in jax.tree.leaves(e_arr)]
    atol = rtol * max(float(np.max(np.abs(e))) for e in wanted if e.size)
    for (path, a), e in zip(jax.tree_util.tree_flatten_with_path(a_arr)[0], wanted, strict=True):
        np.testing.assert_allclose(
            np.asarray(a, np.float64), e, rtol=rtol, atol=atol, err_msg=jax.tree_util.keystr(path)
        )


@pytest.mark.rounding
@pytest.mark.parametrize("on", sorted(MESHES))
def test_cnn_with_functions_in_a_list_matches_filter_jit_and_pmean(on):
    """coarse.value_and_grad on a Module whose list of layers holds jax.nn.relu, jnp.ravel
    (the TypeError 'Cannot determine dtype of custom_jvp' before): the same loss, grads
    (None where eqx has None) and SGD step as the oracle, three steps in lockstep."""
    mesh = coarse.make_mesh(**MESHES[on])

    @coarse.sync(mesh, batch_argnums=(1, 2), config=coarse.Config(xla_below_bytes=0))
    def step(model, x, y):
        loss, grads = coarse.value_and_grad(cnn_loss)(model, x, y)
        return sgd(model, grads), loss, grads

    oracle = oracle_grads(cnn_loss)
    model = CNN(jax.random.key(0))
    for i in range(3):
        x, y = data(i)
        new, loss, grads = step(model, x, y)
        want_loss, want_grads = oracle(model, x, y)
        assert jax.tree.structure(grads) == jax.tree.structure(want_grads)
        assert grads.layers[2] is None and grads.layers[3] is None  # relu, ravel: no gradient
        np.testing.assert_allclose(float(loss), float(want_loss), rtol=RTOL)
        assert_close(grads, want_grads)
        assert_close(new, sgd(model, want_grads))
        assert new.layers[2] is jax.nn.relu and new.layers[3] is jnp.ravel
        model = new


def test_mlp_through_filter_jit_outside_and_inside_and_filter_value_and_grad():
    """eqx.nn.MLP (its activation a leaf) under eqx.filter_jit around the step, with
    eqx.filter_jit around the loss inside it, and eqx.filter_value_and_grad inside (jax.grad
    in a coarse step gives the workers' mean gradient): each as the oracle."""
    mesh = coarse.make_mesh(workers=4, proxies=4)
    model = eqx.nn.MLP(3, 2, width_size=8, depth=2, key=jax.random.key(1))
    x = jax.random.normal(jax.random.key(2), (16, 3))
    y = jax.random.normal(jax.random.key(3), (16, 2))

    def mse(model, x, y):
        return jnp.mean((jax.vmap(model)(x) - y) ** 2)

    @coarse.sync(mesh, batch_argnums=(1, 2))
    def coarse_grads(model, x, y):
        return coarse.value_and_grad(eqx.filter_jit(mse))(model, x, y)

    @coarse.sync(mesh, batch_argnums=(1, 2))
    def eqx_grads(model, x, y):
        loss, grads = eqx.filter_value_and_grad(mse)(model, x, y)
        return coarse.all_reduce(loss), grads

    want_loss, want = oracle_grads(mse)(model, x, y)
    for got_loss, got in (
        eqx.filter_jit(coarse_grads)(model, x, y),
        coarse_grads(model, x, y),
        eqx_grads(model, x, y),
    ):
        np.testing.assert_allclose(float(got_loss), float(want_loss), rtol=RTOL)
        assert_close(got, want)


@pytest.mark.rounding
@pytest.mark.parametrize("on", sorted(MESHES))
def test_value_and_update_keeps_the_floating_leaves_on_the_proxies(on):
    """coarse.value_and_update of a Module with functions and an integer array: the proxies
    update its float leaves as optax.adam under pmean does (lockstep, 3 steps); the
    functions and the integer leaf come back as they went in."""
    mesh = coarse.make_mesh(**MESHES[on])

    class Tagged(eqx.Module):
        cnn: CNN
        seen: jax.Array  # an integer leaf: not differentiated, not on the proxies

    opt = coarse.optim.adam(1e-2)

    @coarse.sync(mesh, batch_argnums=(1, 2))
    def step(model, x, y):
        loss, model = coarse.value_and_update(lambda m, x, y: cnn_loss(m.cnn, x, y), opt)(
            model, x, y
        )
        return model, loss

    tx = optax.adam(1e-2)
    oracle = oracle_grads(lambda m, x, y: cnn_loss(m.cnn, x, y))
    model = Tagged(CNN(jax.random.key(4)), jnp.arange(3))
    opt_state = tx.init(eqx.filter(model, eqx.is_inexact_array))
    for i in range(3):
        x, y = data(10 + i)
        new, loss = step(model, x, y)
        want_loss, grads = oracle(model, x, y)
        grads = eqx.filter(grads, eqx.is_inexact_array)
        updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_inexact_array))
        np.testing.assert_allclose(float(loss), float(want_loss), rtol=RTOL)
        assert_close(new, eqx.apply_updates(model, updates), rtol=ADAM_RTOL)
        assert new.seen.dtype == jnp.int32 and new.cnn.layers[7] is jax.nn.log_softmax
        model = new


def _bn_model():
    k1, k2 = jax.random.split(jax.random.key(5))
    return eqx.nn.make_with_state(
        lambda: eqx.nn.Sequential(
            [
                eqx.nn.Linear(3, 4, key=k1),
                eqx.nn.BatchNorm(4, axis_name="batch", mode="batch"),
                eqx.nn.Lambda(jnp.tanh),
                eqx.nn.Linear(4, 2, key=k2),
            ]
        )
    )()


def _bn_loss(model, state, x):
    out, state = jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(x, state)
    return jnp.mean(out**2 + out), state


def _per_worker_bn(model, state, x):
    """The oracle: eqx.filter_jit of eqx.filter_value_and_grad on each worker's rows on one
    device (the vmap axis as under jax.jit: no shard_map, where jax 0.10.2 fails the pmean
    over it too), the loss, grads and new state averaged over the workers in float64."""
    go = eqx.filter_jit(eqx.filter_value_and_grad(_bn_loss, has_aux=True))
    runs = [go(model, state, rows) for rows in np.split(np.asarray(x), WORKERS)]

    def mean(*xs):
        return np.mean([np.asarray(v, np.float64) for v in xs], axis=0)

    loss = mean(*[r[0][0] for r in runs])
    new_state = jax.tree.map(mean, *[r[0][1] for r in runs])
    grads = jax.tree.map(mean, *[eqx.filter(r[1], eqx.is_array) for r in runs])
    return loss, grads, new_state


@pytest.mark.parametrize("on", sorted(MESHES))
def test_batch_norm_under_vmap_axis_name_matches_per_worker_batch_norm(on):
    """eqx.nn.BatchNorm under jax.vmap(..., axis_name="batch") inside the step: its pmean
    over "batch" runs (refused as an unbound pmap axis before), forward and backward; its
    eqx.nn.State is each worker's inside (State.set refused the per-worker statistics
    before) and leaves as the workers' mean. Loss, grads and state as the oracle's."""
    mesh = coarse.make_mesh(**MESHES[on])
    model, state = _bn_model()
    x = jax.random.normal(jax.random.key(6), (16, 3)) * 3 + 1

    @coarse.sync(mesh, batch_argnums=2)
    def step(model, state, x):
        (loss, state), grads = coarse.value_and_grad(_bn_loss, has_aux=True)(model, state, x)
        return loss, grads, state

    loss, grads, new_state = step(model, state, x)
    want_loss, want_grads, want_state = _per_worker_bn(model, state, x)
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=RTOL)
    assert_close(grads, want_grads)
    assert_close(new_state, want_state)
    # Each worker's own statistics: the mean of their variances is not the variance of
    # all 16 rows (so the oracle tells per-worker BatchNorm from one over the whole batch).
    everyone = eqx.filter_jit(lambda m, s, x: _bn_loss(m, s, x)[1])(model, state, x)
    pairs = zip(jax.tree.leaves(everyone), jax.tree.leaves(new_state), strict=True)
    assert not all(np.allclose(a, b, rtol=1e-3) for a, b in pairs)


def test_a_running_loss_carry_that_starts_as_a_constant():
    """lax.scan, fori_loop and while_loop whose carry starts at a constant and adds each
    worker's own micro-batch values (jax's "carry input and carry output must have equal
    types" before), and a scan whose carry accumulates coarse.value_and_grad's gradient:
    the per-worker sums equal numpy's, reduced over the workers."""
    mesh = coarse.make_mesh(workers=4, proxies=4)
    w = jnp.arange(3.0)
    batch = jax.random.normal(jax.random.key(7), (16, 3))

    @coarse.sync(mesh)
    def step(w, batch):
        micro = batch.reshape(2, -1, 3)

        def body(total, xb):
            return total + jnp.mean((xb @ w) ** 2), None

        by_scan, _ = lax.scan(body, jnp.zeros(()), micro)
        by_fori = lax.fori_loop(0, 2, lambda j, t: t + jnp.sum(micro[j]), jnp.zeros(()))
        _, by_while = lax.while_loop(  # a while_loop's carry, with a counter beside it
            lambda c: c[0] < 2, lambda c: (c[0] + 1, c[1] + jnp.sum(micro[c[0]])), (0, 0.0)
        )

        def grads_body(acc, xb):
            loss, g = coarse.value_and_grad(lambda w, xb: jnp.mean((xb @ w) ** 2))(w, xb)
            return acc + g * jnp.mean(xb), loss  # per worker: g times the worker's own mean

        acc, _ = lax.scan(grads_body, jnp.zeros((3,)), micro)
        return coarse.all_reduce((by_scan, by_fori, by_while, acc))

    by_scan, by_fori, by_while, acc = step(w, batch)
    rows = np.asarray(batch, np.float64).reshape(4, 2, 2, 3)  # worker, micro, rows, features
    want_scan = np.mean([sum(np.mean((m @ np.asarray(w)) ** 2) for m in r) for r in rows])
    want_fori = np.mean([r.sum() for r in rows])
    np.testing.assert_allclose(float(by_scan), want_scan, rtol=RTOL)
    np.testing.assert_allclose(float(by_fori), want_fori, rtol=RTOL)
    np.testing.assert_allclose(float(by_while), want_fori, rtol=RTOL)
    wn = np.asarray(w, np.float64)
    # Micro-batch j's gradient: the workers' mean of d/dw mean((m @ w)^2) = 2 m^T (m w) / rows.
    g = [np.mean([2 * r[j].T @ (r[j] @ wn) / len(r[j]) for r in rows], axis=0) for j in range(2)]
    want_acc = np.mean([sum(g[j] * np.mean(r[j]) for j in range(2)) for r in rows], axis=0)
    np.testing.assert_allclose(np.asarray(acc), want_acc, rtol=RTOL, atol=RTOL)


def test_an_unhashable_non_array_leaf_is_named_with_its_path():
    """A leaf that is neither an array nor hashable: a TypeError naming the argument, the
    leaf's path and the fix."""
    mesh = coarse.make_mesh(workers=4, proxies=4)

    class Holder(eqx.Module):
        table: object

    class Unhashable:
        __hash__ = None  # type: ignore[assignment]

    @coarse.sync(mesh)
    def step(model, x):
        return coarse.all_reduce(jnp.mean(x))

    with pytest.raises(TypeError, match=r"argument 0 \(model\).*\.table.*Unhashable.*Fix:"):
        step(Holder(Unhashable()), jnp.ones((8,)))


def test_an_axis_name_nothing_binds_is_still_refused_and_says_so():
    """lax.pmean over "batch" with no jax.vmap naming it: the coarse refusal, which says
    that neither the mesh nor a jax.vmap binds the name."""
    mesh = coarse.make_mesh(workers=4, proxies=4)

    @coarse.sync(mesh)
    def step(x):
        return coarse.all_reduce(lax.pmean(jnp.mean(x), "batch"))

    with pytest.raises(ValueError, match=r"'batch'.*no jax\.vmap.*Fix: name the axis 'data'"):
        step(jnp.ones((8,)))


def test_python_numbers_are_traced_outside_a_module_and_compiled_in_inside():
    """As jax.jit, a Python float argument is traced (another value: no new compile); as
    eqx.filter_jit, a Module's Python flags are compiled in (Dropout's ``if inference:``
    would fail on a tracer), and another flag value compiles another program."""
    mesh = coarse.make_mesh(workers=4, proxies=4)

    class Noisy(eqx.Module):
        linear: eqx.nn.Linear
        dropout: eqx.nn.Dropout

        def __call__(self, x, key):
            return self.dropout(self.linear(x), key=key)

    @coarse.sync(mesh, batch_argnums=1)
    def step(model, x, scale, key):
        def loss(m, x):
            keys = jax.random.split(key, x.shape[0])
            return jnp.mean(jax.vmap(m)(x, keys) ** 2) * scale

        return coarse.value_and_grad(loss)(model, x)

    model = Noisy(eqx.nn.Linear(3, 2, key=jax.random.key(8)), eqx.nn.Dropout(0.5, inference=True))
    x = jax.random.normal(jax.random.key(9), (8, 3))
    key = jax.random.key(10)
    loss1, _ = step(model, x, 1.0, key)
    loss2, _ = step(model, x, 2.0, key)
    assert step.stats()["compiled"] == 1  # the float was traced
    np.testing.assert_allclose(float(loss2), 2 * float(loss1), rtol=RTOL)
    want = float(jnp.mean(jax.vmap(model.linear)(x) ** 2))  # inference: no dropout
    np.testing.assert_allclose(float(loss1), want, rtol=RTOL)
    training = eqx.nn.inference_mode(model, value=False)
    loss3, _ = step(training, x, 1.0, key)  # another flag: another program, dropout on
    assert step.stats()["compiled"] == 2
    assert abs(float(loss3) - want) > 1e-3
