"""A proxy sharing its worker's device (coarse_jax.testing.shared_device_mesh).

The proxies run no XLA program (ffi/runtime/service.h), so a proxy does not
need a device of its own to run the protocol: with the proxy row of the mesh
equal to the worker row, one device runs a whole step, the workers' program
through XLA and the proxy in the runtime's service (on a GPU, on a stream of
its own). That is how a single lent GPU runs value_and_grad and
value_and_update at p = 1. On CPU devices these tests check the results are
bitwise those of a mesh with separate proxy devices, and match the oracles;
on a GPU (skipped without one) the p = 1 steps run on that GPU alone.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import (
    assert_tree_close,
    coarse_update_step,
    gpu_or_skip,
    make_batch,
    mlp_init,
    mlp_loss,
    per_worker_mean,
    pmean_optax_step,
)

import coarse_jax as coarse
from coarse_jax.testing import shared_device_mesh

CONFIG = coarse.Config(shard_bytes=4096, timeout_s=60)  # several pieces per leaf


@pytest.fixture
def cpu_backend():
    """The CPU cases need jax's default devices to be the 8 virtual CPUs; under
    COARSE_TEST_GPU=1 (tools/gpu_check.sh) make test has already run them."""
    if jax.default_backend() != "cpu":
        pytest.skip("CPU case; the default backend is " + jax.default_backend())


def _grad_step(mesh):
    @coarse.sync(mesh, config=CONFIG)
    def step(params, batch):
        loss, grads = coarse.value_and_grad(mlp_loss)(params, batch)
        return loss, grads, coarse.all_reduce(batch["y"].sum(0))

    return step


def _case(p: int):
    params = mlp_init(jax.random.key(p), (16, 64, 4))
    batch = make_batch(jax.random.key(10 + p), 4 * p, 16, 4)
    return params, batch


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.usefixtures("cpu_backend")
def test_value_and_grad_on_shared_devices_is_bitwise_the_two_device_mesh(p):
    params, batch = _case(p)
    shared = jax.device_get(_grad_step(shared_device_mesh(workers=p))(params, batch))
    separate = jax.device_get(_grad_step(coarse.make_mesh(workers=p))(params, batch))
    for a, b in zip(jax.tree.leaves(shared), jax.tree.leaves(separate), strict=True):
        np.testing.assert_array_equal(a, b)
    loss, grads = per_worker_mean(mlp_loss, params, batch, p)
    np.testing.assert_allclose(shared[0], loss, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(shared[1]), jax.tree.leaves(grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def _optimizers():
    schedule = optax.linear_schedule(1e-2, 1e-3, 5)
    return {
        "sgd": (coarse.optim.sgd(0.1), optax.sgd(0.1)),
        "adam": (coarse.optim.adam(1e-2), optax.adam(1e-2)),
        "adamw_clip_schedule": (
            coarse.optim.adamw(schedule, weight_decay=0.1, clip_norm=0.5),
            optax.chain(optax.clip_by_global_norm(0.5), optax.adamw(schedule, weight_decay=0.1)),
        ),
    }


@pytest.mark.parametrize("name", list(_optimizers()))
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.usefixtures("cpu_backend")
def test_value_and_update_on_shared_devices_is_bitwise_and_matches_optax(p, name):
    opt, tx = _optimizers()[name]
    params, batch = _case(p)
    shared_step = coarse_update_step(shared_device_mesh(workers=p), opt, CONFIG)
    separate_step = coarse_update_step(coarse.make_mesh(workers=p), opt, CONFIG)
    oracle = pmean_optax_step(p, tx)
    a, b, want = params, params, params
    state = tx.init(params)
    for _ in range(3):
        a, loss_a = shared_step(jax.tree.map(jnp.copy, a), batch)
        b, loss_b = separate_step(jax.tree.map(jnp.copy, b), batch)
        want, state, loss_w = oracle(want, state, batch)
        np.testing.assert_allclose(loss_a, loss_w, rtol=1e-5)
        np.testing.assert_array_equal(loss_a, loss_b)
        for x, y, z in zip(
            jax.tree.leaves(a), jax.tree.leaves(b), jax.tree.leaves(want), strict=True
        ):
            np.testing.assert_array_equal(x, y)
            np.testing.assert_allclose(x, z, rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("cpu_backend")
def test_make_mesh_refuses_a_device_twice():
    d = jax.devices()
    with pytest.raises(ValueError, match=r"devices must be distinct.*shared_device_mesh"):
        coarse.make_mesh(devices=[d[0], d[0]])


def test_one_gpu_runs_value_and_grad_and_value_and_update_at_p1():
    gpu, _ = gpu_or_skip()
    mesh = shared_device_mesh(workers=1, devices=[gpu])
    params, batch = _case(1)
    params, batch = jax.device_put((params, batch), gpu)
    loss, grads, _ = _grad_step(mesh)(params, batch)
    want_loss, want_grads = jax.jit(jax.value_and_grad(mlp_loss))(params, batch)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    for name, (opt, tx) in _optimizers().items():
        step = coarse_update_step(mesh, opt, CONFIG)
        got, want, state = params, params, tx.init(params)
        for _ in range(3):
            got, _ = step(jax.tree.map(jnp.copy, got), batch)
            grads = jax.grad(mlp_loss)(want, batch)
            updates, state = tx.update(grads, state, want)
            want = optax.apply_updates(want, updates)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)


def _linear_loss(params, coeffs):
    # d/dw sum(w * c) is c exactly on any backend: the gradients the proxy gets are
    # the same bits on the GPU and on the CPU, so its optimizer's results must be too.
    pairs = zip(jax.tree.leaves(params), jax.tree.leaves(coeffs), strict=True)
    return sum(jnp.sum(w * c) for w, c in pairs)


def _bitwise_optimizers():
    # The optimizer's scalars (lr, bias corrections) are computed by XLA in the step's
    # program, on the worker's device, and XLA:GPU may round a schedule's multiply-add
    # differently from XLA:CPU. A schedule of powers of two is exact either way, so
    # any difference left is the proxies' own arithmetic.
    exact = optax.linear_schedule(2.0**-6, 2.0**-7, 4)
    return {
        "sgd": coarse.optim.sgd(0.1),
        "sgd_momentum": coarse.optim.sgd(0.05, momentum=0.9),
        "adam": coarse.optim.adam(1e-2),
        "adamw_clip": coarse.optim.adamw(1e-2, weight_decay=0.1, clip_norm=0.5),
        "adamw_clip_exact_schedule": coarse.optim.adamw(exact, weight_decay=0.1, clip_norm=0.5),
        "adamw_clip_schedule": _optimizers()["adamw_clip_schedule"][0],
    }


def _same_bits(a, b) -> bool:
    return bool(np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32)))


def test_one_gpu_update_is_bitwise_the_same_step_on_a_cpu_device():
    """The proxy optimizer on the GPU (kernels/optim.cu) against its CPU twin: three
    steps of each optimizer at p = 1, on one GPU and on one CPU device, from the same
    params and gradients, give the same bits (tools/gpu_check.sh; skipped without a GPU).
    Where XLA computed the optimizer's scalars differently on the two devices, the steps
    cannot agree bitwise: that case must match at rounding level, and is named."""
    gpu, _ = gpu_or_skip()
    cpu = jax.devices("cpu")[0]
    params, _ = _case(1)
    coeffs = jax.tree.map(
        lambda w: jnp.sin(0.37 * jnp.arange(w.size, dtype=jnp.float32)).reshape(w.shape), params
    )
    coeffs, params = jax.device_get((coeffs, params))
    failures, scalars_differ = [], []
    for name, opt in _bitwise_optimizers().items():
        same_scalars = all(
            _same_bits(*(jax.jit(opt.scalars)(jax.device_put(jnp.int32(c), d)) for d in (gpu, cpu)))
            for c in range(3)
        )
        results = []
        for device in (gpu, cpu):
            mesh = shared_device_mesh(workers=1, devices=[device])
            step = coarse_update_step(mesh, opt, CONFIG, loss_fn=_linear_loss)
            p, c = jax.device_put((params, coeffs), device)
            for _ in range(3):
                p, _ = step(jax.tree.map(jnp.copy, p), c)
            results.append(jax.device_get(p))
        if not same_scalars:
            scalars_differ.append(name)
            assert_tree_close(results[0], results[1], rtol=1e-5, atol_scale=1e-6)
            continue
        for path, a, b in zip(
            jax.tree_util.tree_leaves_with_path(results[0]),
            jax.tree.leaves(results[0]),
            jax.tree.leaves(results[1]),
            strict=True,
        ):
            differ = int(np.sum(a.view(np.uint32) != b.view(np.uint32)))
            if differ:
                failures.append(f"{name} {jax.tree_util.keystr(path[0])}: {differ} of {a.size}")
    assert not failures, "GPU and CPU steps differ: " + "; ".join(failures)
    # Only the schedule whose values are not exact may have had different scalars.
    assert set(scalars_differ) <= {"adamw_clip_schedule"}, scalars_differ
