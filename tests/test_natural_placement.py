"""State placed as jax's and flax's guides place it, on the mesh `coarse.make_mesh` returned.

That mesh is the workers' (issue 52): replicated state and split batches land
on no proxy's device, the step's outputs stay where the state is, and they
mix with it in the user's other code: flax Linen's separate ``update_model``
jit, NNX modules with ``nnx.Rngs`` (typed keys), and an orbax checkpoint saved
and restored onto the mesh. Each against the same program on host values (the
oracle: nothing placed), and with no warning.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse
from coarse_jax.mesh import ProxiesReplaced, two_tier_mesh

WORKERS = 4


def _on_workers_only(tree, mesh) -> None:
    workers = set(mesh.devices.flat)
    proxies = set(two_tier_mesh(mesh).devices.flat) - workers
    for x in jax.tree.leaves(tree):
        if isinstance(x, jax.Array):
            assert set(x.sharding.device_set) == workers, x.sharding
            assert not set(x.sharding.device_set) & proxies


@pytest.fixture
def mesh():
    return coarse.make_mesh(workers=WORKERS)


@pytest.fixture(autouse=True)
def _no_warnings():
    with warnings.catch_warnings():  # no placement warning, no second compile
        warnings.simplefilter("error")
        # (another module's mesh of these workers may have had other proxies)
        warnings.simplefilter("ignore", ProxiesReplaced)
        yield


def test_linen_apply_model_and_a_separate_update_model_jit(mesh):
    train_state = pytest.importorskip("flax.training.train_state")
    nn = pytest.importorskip("flax.linen")
    model = nn.Dense(3)
    x = np.random.default_rng(0).standard_normal((16, 5)).astype(np.float32)
    params = model.init(jax.random.key(0), x[:1])
    host = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-2))
    state = jax.device_put(host, NamedSharding(mesh, P()))
    batch = jax.device_put(x, NamedSharding(mesh, P("data")))

    def apply(state, batch):  # flax's mnist example: apply_model returns grads
        def loss(p, b):
            return jnp.mean(state.apply_fn(p, b) ** 2)

        return coarse.value_and_grad(loss)(state.params, batch)

    apply_model = coarse.sync(apply, mesh=mesh)
    host_apply_model = coarse.sync(apply, mesh=mesh)  # the oracle's: host values

    @jax.jit
    def update_model(state, grads):
        return state.apply_gradients(grads=grads)

    for _ in range(3):
        loss, grads = apply_model(state, batch)
        _on_workers_only((loss, grads), mesh)
        state = update_model(state, grads)
        _on_workers_only(state, mesh)
        host_loss, host_grads = host_apply_model(host, x)
        host = update_model(host, host_grads)
        np.testing.assert_array_equal(np.asarray(loss), np.asarray(host_loss))
        for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(host.params), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert coarse.diagnostics.memory_report(apply_model, state, batch).proxy.xla_argument_bytes == 0


def test_nnx_module_with_rngs_and_typed_keys(mesh):
    nnx = pytest.importorskip("flax.nnx")

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(3, 2, rngs=rngs)
            self.dropout = nnx.Dropout(0.5, rngs=rngs)

        def __call__(self, x):
            return self.dropout(self.linear(x))

    def make():
        model = Net(nnx.Rngs(0, dropout=1))
        return model, nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)

    def train(model, optimizer, batch):
        loss, grads = coarse.value_and_grad(lambda m, b: jnp.mean(m(b) ** 2))(model, batch)
        optimizer.update(model, grads)
        return loss

    step, host_step = coarse.sync(train, mesh=mesh), coarse.sync(train, mesh=mesh)

    model, optimizer = make()
    placed = jax.device_put(nnx.state((model, optimizer)), NamedSharding(mesh, P()))
    nnx.update((model, optimizer), placed)
    host_model, host_optimizer = make()
    batch = np.ones((8, 3), np.float32)
    for _ in range(2):
        loss = step(model, optimizer, jax.device_put(batch, NamedSharding(mesh, P("data"))))
        host_loss = host_step(host_model, host_optimizer, batch)
        np.testing.assert_array_equal(np.asarray(loss), np.asarray(host_loss))
    state = nnx.state((model, optimizer))
    _on_workers_only(state, mesh)
    keys = [x for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key)]
    assert keys, "nnx.Rngs keeps typed keys"
    for a, b in zip(
        jax.tree.leaves(nnx.state(model, nnx.Param)),
        jax.tree.leaves(nnx.state(host_model, nnx.Param)),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_orbax_save_and_restore_onto_the_mesh(mesh, tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    opt = optax.adam(1e-2)
    params = {"w": jnp.arange(12.0).reshape(4, 3) / 12, "b": jnp.zeros(3)}
    state = jax.device_put((params, opt.init(params)), NamedSharding(mesh, P()))
    batch = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("data")))

    @coarse.sync(mesh)
    def step(state, batch):
        params, opt_state = state
        loss, grads = coarse.value_and_grad(lambda p, b: jnp.mean((b @ p["w"] + p["b"]) ** 2))(
            params, batch
        )
        updates, opt_state = opt.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    state, _ = step(state, batch)
    _on_workers_only(state, mesh)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "ckpt", state)
    with ocp.StandardCheckpointer() as checkpointer:
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
        restored = checkpointer.restore(tmp_path / "ckpt", target)
    _on_workers_only(restored, mesh)
    (after, _), loss = step(restored, batch)
    (want, _), want_loss = step(state, batch)
    np.testing.assert_array_equal(np.asarray(loss), np.asarray(want_loss))
    for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_readme_steps_put_nothing_on_the_proxies(mesh):
    """The README's first example (NNX, adamw) and its Linen step: the proxies' user bytes
    are 0 in `memory_report`, with the state placed on the mesh or passed from the host."""
    nnx = pytest.importorskip("flax.nnx")
    train_state = pytest.importorskip("flax.training.train_state")
    model = nnx.Sequential(
        nnx.Linear(16, 32, rngs=nnx.Rngs(0)), nnx.relu, nnx.Linear(32, 4, rngs=nnx.Rngs(1))
    )
    optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)

    def loss_fn(model, batch):
        logits = model(batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()

    @coarse.sync(mesh)
    def train_step(model, optimizer, batch):
        loss, grads = coarse.value_and_grad(loss_fn)(model, batch)
        optimizer.update(model, grads)
        return loss

    x = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
    batch = {"x": x, "label": np.argmax(x[:, :4], -1)}
    train_step(model, optimizer, batch)
    for placed in (False, True):
        if placed:
            state = jax.device_put(nnx.state((model, optimizer)), NamedSharding(mesh, P()))
            nnx.update((model, optimizer), state)
        proxy = coarse.diagnostics.memory_report(train_step, model, optimizer, batch).proxy
        assert proxy.xla_argument_bytes == proxy.xla_output_bytes == 0

    def mse(params, batch):
        return jnp.mean((batch["x"] @ params["w"] + params["b"] - batch["y"]) ** 2)

    state = train_state.TrainState.create(
        apply_fn=None, params={"w": jnp.zeros((16, 1)), "b": jnp.zeros((1,))}, tx=optax.sgd(0.01)
    )
    state = jax.device_put(state, NamedSharding(mesh, P()))

    @coarse.sync(mesh)
    def linen_step(state, batch):
        loss, grads = coarse.value_and_grad(mse)(state.params, batch)
        return state.apply_gradients(grads=grads), loss

    lbatch = {"x": jnp.ones((32, 16)), "y": jnp.ones((32, 1))}
    state, _ = linen_step(state, lbatch)
    _on_workers_only(state, mesh)
    proxy = coarse.diagnostics.memory_report(linen_step, state, lbatch).proxy
    assert proxy.xla_argument_bytes == proxy.xla_output_bytes == 0
