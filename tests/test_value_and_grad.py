"""coarse.value_and_grad against per-worker gradients averaged without any mesh."""

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
    pmean_optax_step,
)

import coarse_jax as coarse

MODES = ["ffi", "reference"]


def _step(mesh, cfg, fun=mlp_loss, **kw):
    @coarse.sync(mesh, config=cfg)
    def step(params, batch):
        return coarse.value_and_grad(fun, **kw)(params, batch)

    return step


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_matches_per_worker_mean_f32(workers, mode):
    mesh = coarse.make_mesh(workers=workers)
    # Odd sizes, a size-1 output layer: leaves of shape (1,) and (5, 1).
    params = mlp_init(jax.random.key(0), (7, 13, 5, 1))
    batch = make_batch(jax.random.key(1), 4 * workers, 7, 1)
    cfg = coarse.Config(mode=mode, shard_bytes=64, leading_bytes=7 * 13 * 4 + 13 * 4)
    loss, grads = _step(mesh, cfg)(params, batch)
    want_loss, want_grads = per_worker_mean(mlp_loss, params, batch, workers)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-6)
    assert_tree_close(grads, want_grads, rtol=1e-6, atol_scale=1e-6)
    assert_replicated((loss, grads))


@pytest.mark.parametrize("dtype,rtol", [(jnp.bfloat16, 2e-2), (jnp.float16, 4e-3)])
def test_half_precision_params(dtype, rtol):
    mesh = coarse.make_mesh(workers=4)
    params = mlp_init(jax.random.key(2), (9, 6, 3), dtype=dtype)
    batch = make_batch(jax.random.key(3), 16, 9, 3)
    _, grads = _step(mesh, coarse.Config(shard_bytes=32, leading_bytes=40))(params, batch)
    _, want = per_worker_mean(mlp_loss, params, batch, 4)
    assert all(g.dtype == dtype for g in jax.tree.leaves(grads))
    assert_tree_close(grads, want, rtol=rtol, atol_scale=rtol)
    assert_replicated(grads)


def test_scalar_leaf_and_has_aux():
    mesh = coarse.make_mesh(workers=4)

    def loss_fn(params, batch):
        pred = batch["x"] @ params["w"] * params["scale"]
        err = pred - batch["y"]
        return jnp.mean(err**2), {"mae": jnp.mean(jnp.abs(err))}

    params = {"scale": jnp.float32(1.5), "w": jnp.ones((3, 2)) * 0.1}
    batch = make_batch(jax.random.key(4), 8, 3, 2)

    # Aux is each worker's own: returned per worker (batch_outputs) and reduced.
    @coarse.sync(mesh, batch_outputs=1)
    def step(params, batch):
        (loss, aux), grads = coarse.value_and_grad(loss_fn, has_aux=True)(params, batch)
        return (loss, coarse.all_reduce(aux)), aux["mae"][None], grads

    (loss, aux), per_worker, grads = step(params, batch)
    want_loss, want = per_worker_mean(lambda p, b: loss_fn(p, b)[0], params, batch, 4)
    slices = [jax.tree.map(lambda x, lo=2 * i: x[lo : lo + 2], batch) for i in range(4)]
    maes = [loss_fn(params, s)[1]["mae"] for s in slices]
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-6)
    np.testing.assert_allclose(float(aux["mae"]), np.mean(maes), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(per_worker), maes, rtol=1e-6)
    assert grads["scale"].shape == ()
    assert_tree_close(grads, want, rtol=1e-6, atol_scale=1e-6)


@pytest.mark.parametrize("leading", ["none", "middle", "all"])
def test_leading_bytes_split(leading):
    mesh = coarse.make_mesh(workers=4)
    params = mlp_init(jax.random.key(5), (6, 10, 8, 4))
    total = sum(x.nbytes for x in jax.tree.leaves(params))
    leading_bytes = {"none": 0, "middle": total // 2, "all": 10 * total}[leading]
    cfg = coarse.Config(shard_bytes=128, leading_bytes=leading_bytes)
    plan = coarse.diagnostics.plan(params, mesh, cfg)
    n_worker = sum(leaf.sync == "worker" for leaf in plan.leaves)
    assert (n_worker == 0) == (leading == "none")
    assert (n_worker == len(plan.leaves)) == (leading == "all")
    batch = make_batch(jax.random.key(6), 8, 6, 4)
    loss, grads = _step(mesh, cfg)(params, batch)
    want_loss, want = per_worker_mean(mlp_loss, params, batch, 4)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-6)
    assert_tree_close(grads, want, rtol=1e-6, atol_scale=1e-6)
    assert_replicated(grads)


def test_bitwise_reproducible_and_no_leftover_sessions():
    from coarse_jax import _ffi

    mesh = coarse.make_mesh(workers=4)
    params = mlp_init(jax.random.key(7), (16, 32, 8))
    batch = make_batch(jax.random.key(8), 32, 16, 8)
    cfg = coarse.Config(
        shard_bytes=256, leading_bytes=16 * 32 * 4, routes=((0, 1), (1, 2), (2, 3), (3, 0))
    )
    step = _step(mesh, cfg)
    # Blocked on every device's copy: device_get reads one, and the session
    # closes when every device returned.
    first = jax.device_get(jax.block_until_ready(step(params, batch)))
    second = jax.device_get(jax.block_until_ready(step(params, batch)))
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second), strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    assert _ffi.live_sessions() == 0


def test_twenty_optax_steps_match_pmean_training():
    import optax

    mesh = coarse.make_mesh(workers=4)
    params = mlp_init(jax.random.key(9), (8, 16, 16, 4))
    opt = optax.adam(1e-2)
    cfg = coarse.Config(shard_bytes=256, leading_bytes=8 * 16 * 4 + 64)

    @coarse.sync(mesh, config=cfg)
    def coarse_step(params, opt_state, batch):
        loss, grads = coarse.value_and_grad(mlp_loss)(params, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    pmean_step = pmean_optax_step(4, opt)

    a_params, a_state = params, opt.init(params)
    b_params, b_state = params, opt.init(params)
    for i in range(20):
        batch = make_batch(jax.random.key(100 + i), 16, 8, 4)
        a_params, a_state, a_loss = coarse_step(a_params, a_state, batch)
        b_params, b_state, b_loss = pmean_step(b_params, b_state, batch)
        np.testing.assert_allclose(float(a_loss), float(b_loss), rtol=1e-5)
    assert_tree_close(a_params, jax.device_get(b_params), rtol=1e-5, atol_scale=1e-5)
    assert_replicated(a_params)


def test_the_program_spans_the_workers_only():
    """The step's program runs on the workers: no lax.cond on the tier, and a psum over
    "data" sums the workers alone."""
    mesh = coarse.make_mesh(workers=2)

    @coarse.sync(mesh)
    def step(x):
        return jax.lax.psum(x * 2.0 + 1.0, "data")

    x = np.arange(2 * 3, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(step(x), (x * 2.0 + 1.0).sum(0, keepdims=True))
    assert "cond[" not in str(jax.make_jaxpr(step)(x))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("argnums", [(0, 1), (1, 0), (1,)])
def test_tuple_argnums_match_jax_value_and_grad(mode, argnums):
    """A tuple of argnums gives a tuple of gradients in that order, as jax.value_and_grad does."""
    workers = 2
    mesh = coarse.make_mesh(workers=workers)
    params = mlp_init(jax.random.key(4), (5, 4, 2))
    scale = {"s": jnp.float32(0.7), "v": jnp.arange(2.0)}
    batch = make_batch(jax.random.key(5), 4 * workers, 5, 2)

    def loss(params, scale, batch):
        return mlp_loss(params, batch) * scale["s"] + jnp.sum(scale["v"] ** 2)

    @coarse.sync(mesh, config=coarse.Config(mode=mode, shard_bytes=64))
    def step(params, scale, batch):
        return coarse.value_and_grad(loss, argnums=argnums)(params, scale, batch)

    got_loss, got = step(params, scale, batch)
    assert isinstance(got, tuple) and len(got) == len(argnums)
    # Oracle: jax.value_and_grad on each worker's slice, averaged in float64.
    n = batch["x"].shape[0] // workers
    results = [
        jax.value_and_grad(loss, argnums=argnums)(
            params, scale, jax.tree.map(lambda x, lo=i * n: x[lo : lo + n], batch)
        )
        for i in range(workers)
    ]
    np.testing.assert_allclose(float(got_loss), np.mean([np.float64(r[0]) for r in results]))
    want = jax.tree.map(
        lambda *gs: np.mean([np.asarray(g, np.float64) for g in gs], axis=0),
        *[r[1] for r in results],
    )
    assert_tree_close(got, want, rtol=1e-6, atol_scale=1e-6)
    assert_replicated(got)


def test_logits_as_aux_give_the_global_accuracy():
    """Flax's `return loss, logits`: accuracy through coarse.all_reduce is the global one."""
    workers = 4
    mesh = coarse.make_mesh(workers=workers)
    rng = np.random.default_rng(7)
    params = {"w": jnp.asarray(rng.standard_normal((6, 5)), jnp.float32)}
    batch = {
        "x": jnp.asarray(rng.standard_normal((32, 6)), jnp.float32),
        "label": jnp.asarray(rng.integers(0, 5, 32), jnp.int32),
    }

    def loss_fn(params, batch):
        logits = batch["x"] @ params["w"]
        onehot = jax.nn.one_hot(batch["label"], 5)
        return -jnp.mean(jnp.sum(onehot * jax.nn.log_softmax(logits), -1)), logits

    @coarse.sync(mesh, batch_outputs=2)
    def step(params, batch):
        (loss, logits), _ = coarse.value_and_grad(loss_fn, has_aux=True)(params, batch)
        correct = jnp.mean((jnp.argmax(logits, -1) == batch["label"]).astype(jnp.float32))
        return loss, coarse.all_reduce(correct), logits

    loss, accuracy, logits = step(params, batch)
    want_logits = np.asarray(batch["x"]) @ np.asarray(params["w"])
    want = np.mean(np.argmax(want_logits, -1) == np.asarray(batch["label"]))
    np.testing.assert_allclose(float(accuracy), want, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(logits), want_logits, rtol=1e-5, atol=1e-5)
    assert_replicated((loss, accuracy))


def test_returning_a_per_worker_value_names_the_output_and_the_fix():
    mesh = coarse.make_mesh(workers=2)

    @coarse.sync(mesh)
    def step(params, batch):
        (loss, logits), grads = coarse.value_and_grad(
            lambda p, b: (jnp.mean(b @ p), b @ p), has_aux=True
        )(params, batch)
        return grads, {"loss": loss, "logits": logits}

    with pytest.raises(
        TypeError,
        match=r"output \[1\]\['logits'\] differs per device .*coarse.all_reduce.*"
        r"batch_outputs=\(1,\)",
    ):
        step(jnp.ones(3), jnp.ones((4, 3)))


def _conv_loss(params, batch):
    """A one-layer convolution, then the MLP loss's squared error."""
    x = batch["x"][:, None, :, None]  # (batch, 1 channel, features, 1)
    h = jax.lax.conv_general_dilated(x, params["k"], (1, 1), "SAME")
    return jnp.mean((h.reshape(h.shape[0], -1) @ params["w"] - batch["y"]) ** 2)


@pytest.mark.parametrize("model", ["mlp", "conv"])
def test_the_model_runs_once_per_worker_never_in_a_cond(model):
    """The proxies run no program, so the model runs once per worker, never inside a
    cond on the tier."""
    mesh = coarse.make_mesh(workers=2)
    cfg = coarse.Config()
    loss_fn = mlp_loss if model == "mlp" else _conv_loss

    @coarse.sync(mesh, config=cfg)
    def step(params, batch):
        return coarse.value_and_grad(loss_fn)(params, batch)

    if model == "mlp":
        params = mlp_init(jax.random.key(8), (4, 3, 1))
    else:
        k1, k2 = jax.random.split(jax.random.key(8))
        params = {
            "k": jax.random.normal(k1, (2, 1, 3, 1)),  # OIHW: 2 output channels, 3x1 taps
            "w": jax.random.normal(k2, (2 * 4, 1)),
        }
    batch = make_batch(jax.random.key(9), 8, 4, 1)
    assert "cond[" not in str(jax.make_jaxpr(step)(params, batch))
    loss, grads = step(params, batch)
    want_loss, want = per_worker_mean(loss_fn, params, batch, 2)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-6)
    assert_tree_close(grads, want, rtol=1e-6, atol_scale=1e-6)
