"""Every argument a user passes: keywords, Python flags, PRNG keys, dtypes and placements,
taken as ``jax.jit`` takes them; "tier" inside a step; outputs that mix with the user's mesh.

The oracle is the same function under plain ``jax.jit`` (or numpy), sharing no code with
coarse_jax's argument handling.
"""

from __future__ import annotations

import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse
from coarse_jax.mesh import LegacyPlacement, two_tier_mesh, workers_mesh
from coarse_jax.plan import check_dtype

# 4 workers with 4 proxies (1:1) or 2 (2:1).
PROXIES = [4, 2]


def _mesh(proxies: int):
    return coarse.make_mesh(workers=4, proxies=proxies)


def _devices(x) -> set:
    return set(x.sharding.device_set)


# -- "tier" inside a step ---------------------------------------------------


@pytest.mark.parametrize("mode", ["ffi", "reference"])
@pytest.mark.parametrize("proxies", PROXIES)
def test_tier_is_bound_inside_a_step(proxies, mode):
    mesh = _mesh(proxies)

    @coarse.sync(mesh, config=coarse.Config(mode=mode))
    def step(w, batch):
        total = coarse.all_reduce(jnp.sum(batch))
        # 0, varying over both axes: newer jax reduces over an axis tuple only a value
        # that varies over all of them or none, as it would on the public mesh.
        both = lax.axis_index("tier") + 0 * lax.axis_index("data")
        return (
            lax.axis_index("tier"),
            lax.psum(w, "tier"),
            lax.pmax(lax.axis_index("data") + both, ("tier", "data")),
            lax.psum(1, ("tier", "data")),
            lax.pmax(total + both, ("tier", "data")),
        )

    tier, w, last, count, total = step(jnp.arange(3.0), jnp.ones((8, 2)))
    assert int(tier) == 0 and int(last) == 3 and int(count) == 4
    np.testing.assert_array_equal(w, np.arange(3.0))
    assert float(total) == 16.0 / 4  # all_reduce means over the workers


# -- PRNG keys on the mesh --------------------------------------------------


@pytest.mark.parametrize("kind", ["typed", "raw"])
@pytest.mark.parametrize("proxies", PROXIES)
def test_keys_replicated_on_the_mesh(proxies, kind):
    mesh = _mesh(proxies)
    host_key = jax.random.key(7) if kind == "typed" else jax.random.PRNGKey(7)
    key = jax.device_put(host_key, NamedSharding(mesh, P()))

    @coarse.sync(mesh)
    def step(key, batch):
        return jax.random.normal(key, (3,)), coarse.all_reduce(jnp.mean(batch))

    draw, _ = step(key, jnp.ones((8, 2)))
    np.testing.assert_array_equal(draw, jax.random.normal(host_key, (3,)))
    # Twice: the second call reuses the first's program.
    draw, _ = step(key, jnp.ones((8, 2)))
    np.testing.assert_array_equal(draw, jax.random.normal(host_key, (3,)))


def test_a_second_nnx_model_of_another_structure_retraces():
    """As nnx.jit retraces: a model whose Rngs stream has another name is a new structure."""
    nnx = pytest.importorskip("flax.nnx")
    mesh = _mesh(4)

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(3, 2, rngs=rngs)
            self.rngs = rngs

        def __call__(self, x):
            return self.linear(x)

    @coarse.sync(mesh)
    def step(model, batch):
        return coarse.value_and_grad(lambda m, b: jnp.mean(m(b) ** 2))(model, batch)

    batch = jnp.ones((8, 3))
    for model in (Net(nnx.Rngs(params=0)), Net(nnx.Rngs(params=0, dropout=1))):
        loss, _ = step(model, batch)
        want = jnp.mean(model(batch) ** 2)
        np.testing.assert_allclose(float(loss), float(want), rtol=1e-6)
    assert step.stats()["compiled"] == 2


# -- keyword arguments, as jax.jit takes them -------------------------------


@pytest.fixture  # made per test: _mesh(2) gives the same workers other proxies
def mesh4():
    return _mesh(4)


def test_an_optional_keyword_argument(mesh4):
    @coarse.sync(mesh4)
    def step(w, batch, scale=1.0):
        return coarse.all_reduce(jnp.mean(batch)) * scale + jnp.sum(w)

    w, batch = jnp.ones(3), jnp.arange(16.0).reshape(8, 2)
    assert float(step(w, batch)) == pytest.approx(7.5 + 3)
    assert float(step(w, batch, scale=2.0)) == pytest.approx(15.0 + 3)
    assert float(step(w, batch, scale=jnp.float32(3.0))) == pytest.approx(22.5 + 3)


def test_the_batch_by_name(mesh4):
    @coarse.sync(mesh4)
    def step(w, b):
        return coarse.all_reduce(jnp.mean(b)) + jnp.sum(w)

    w, batch = jnp.ones(3), jnp.arange(16.0).reshape(8, 2)
    assert float(step(w, b=batch)) == float(step(w, batch)) == pytest.approx(10.5)
    assert float(step(b=batch, w=w)) == pytest.approx(10.5)


def test_a_keyword_only_batch_and_argnames(mesh4):
    @coarse.sync(mesh4, static_argnames="power", donate_argnames="w")
    def step(w, *, power, batch):
        return coarse.all_reduce(jnp.mean(batch**power)) + jnp.sum(w)

    batch = jnp.arange(16.0).reshape(8, 2)
    assert float(step(jnp.ones(3), batch=batch, power=2)) == pytest.approx(
        float(np.mean(np.arange(16.0) ** 2)) + 3
    )

    @coarse.sync(mesh4, batch_argnames="images")
    def named(images, w):
        return coarse.all_reduce(jnp.mean(images)) + jnp.sum(w)

    assert float(named(batch, jnp.ones(3))) == pytest.approx(10.5)
    assert float(named(w=jnp.ones(3), images=batch)) == pytest.approx(10.5)


def test_a_call_that_does_not_fit_names_the_signature(mesh4):
    @coarse.sync(mesh4)
    def step(w, batch):
        return coarse.all_reduce(jnp.mean(batch))

    with pytest.raises(TypeError, match=r"coarse.sync\(step\): the call does not fit.*scale"):
        step(jnp.ones(3), jnp.ones((8, 2)), scale=2.0)
    with pytest.raises(ValueError, match=r"static_argnames names 'train', which is no parameter"):
        coarse.sync(mesh4, static_argnames="train")(lambda w, batch: w)


# -- Python flags through coarse.value_and_grad -----------------------------


@pytest.mark.parametrize("train", [True, False])
def test_python_flags_reach_the_loss_untraced(mesh4, train):
    def loss(w, batch, train, how="mean"):
        assert isinstance(train, bool) and isinstance(how, str)  # as jax.value_and_grad leaves them
        y = batch @ w
        return jnp.mean(y**2) if train else jnp.mean(y**2) * 0.5

    @coarse.sync(mesh4, static_argnums=2)
    def step(w, batch, train):
        return coarse.value_and_grad(loss)(w, batch, train, how="mean")

    w, batch = jnp.array([1.0, -2.0]), jnp.arange(16.0).reshape(8, 2) / 8
    value, grad = step(w, batch, train)
    want_value, want_grad = jax.value_and_grad(loss)(w, batch, train)
    np.testing.assert_allclose(value, want_value, rtol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-6)


# -- the "Fix:" line fits the dtype ----------------------------------------


@pytest.mark.parametrize(
    "dtype, fix",
    [
        (np.float64, "JAX_ENABLE_X64"),
        (np.complex64, "real and imaginary"),
        (jnp.float8_e4m3fn, "bfloat16 or float32"),
        (np.int32, "integer or boolean"),
        (np.bool_, "integer or boolean"),
        (jax.random.key(0).dtype, "key_data"),
    ],
)
def test_each_refused_dtype_gets_its_own_fix(dtype, fix):
    with pytest.raises(TypeError, match=fix) as err:
        check_dtype("['w'] of argument 0", dtype, "coarse.value_and_grad")
    assert "Fix:" in str(err.value)


def test_float64_under_x64_is_told_to_cast(tmp_path):
    import subprocess
    import sys

    script = (
        "import jax, jax.numpy as jnp, coarse_jax as coarse\n"
        "mesh = coarse.make_mesh(workers=2)\n"
        "step = coarse.sync(lambda w, b: coarse.value_and_grad(lambda w, b: jnp.sum(b @ w))(w, b),"
        " mesh=mesh)\n"
        "try:\n"
        "    step(jnp.ones(3), jnp.ones((2, 3)))\n"
        "except TypeError as e:\n"
        "    print('ERR', e)\n"
    )
    env = dict(os.environ, JAX_ENABLE_X64="1", JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,  # import the installed package, not ./coarse_jax
    )
    assert "ERR" in out.stdout and "dtype float64" in out.stdout, out.stdout + out.stderr
    assert "astype(jnp.float32)" in out.stdout


# -- where state placed the jax way lives, and the two-tier mesh of old ------


def _apply(w, batch):
    """Flax's apply_model shape: loss, grads and per-example outputs."""
    loss, grads = coarse.value_and_grad(lambda w, b: jnp.mean((b @ w) ** 2))(w, batch)
    return loss, grads, batch @ w


@jax.jit
def update_model(w, grads):
    return w - 0.1 * grads


@pytest.mark.parametrize("proxies", PROXIES)
def test_state_placed_on_the_mesh_stays_on_the_workers(proxies):
    """State and batch placed as jax's guides place them, on the mesh make_mesh returned:
    nothing lands on a proxy's device, outputs mix with that state, no warning."""
    mesh = _mesh(proxies)
    workers = set(mesh.devices.flat)
    proxy_devices = set(two_tier_mesh(mesh).devices.flat) - workers

    apply_model = coarse.sync(_apply, mesh=mesh, batch_outputs=2)

    host_w = jnp.array([1.0, 0.5, -1.0])
    w = jax.device_put(host_w, NamedSharding(mesh, P()))
    batch = jax.device_put(jnp.arange(24.0).reshape(8, 3) / 24, NamedSharding(mesh, P("data")))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss, grads, logits = apply_model(w, batch)
    assert _devices(grads) == _devices(loss) == _devices(logits) == workers
    new_w = update_model(w, grads)
    assert _devices(new_w) == workers and not _devices(new_w) & proxy_devices
    _, grads2, _ = apply_model(host_w, np.asarray(batch))
    np.testing.assert_array_equal(grads, grads2)
    report = coarse.diagnostics.memory_report(apply_model, w, batch)
    assert report.proxy.xla_argument_bytes == report.proxy.xla_output_bytes == 0


@pytest.mark.parametrize("proxies", PROXIES)
def test_outputs_follow_state_placed_on_a_two_tier_mesh_with_one_warning(proxies):
    """Code written for the two-tier mesh (state on both tiers) still runs: its outputs
    follow onto that mesh, as jax.jit places them, and the first call warns with the cost."""
    mesh = two_tier_mesh(_mesh(proxies))
    everything = set(mesh.devices.flat)
    workers = set(workers_mesh(mesh).devices.flat)

    apply_model = coarse.sync(_apply, mesh=mesh, batch_outputs=2)

    batch = jnp.arange(24.0).reshape(8, 3) / 24
    host_w = jnp.array([1.0, 0.5, -1.0])
    w = jax.device_put(host_w, NamedSharding(mesh, P()))
    with pytest.warns(LegacyPlacement, match=r"copies \d+\.\d+ MiB .* measured at [\d.]+ ms.*Fix:"):
        loss, grads, logits = apply_model(w, batch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per step
        apply_model(w, batch)
    assert _devices(grads) == _devices(loss) == everything
    # Per-example outputs are split over "data" on the mesh where it lists each device once.
    assert _devices(logits) == (everything if proxies == 4 else workers)
    new_w = update_model(w, grads)  # the user's other jitted function mixes them
    assert _devices(new_w) == everything

    # The same step from host values stays on the workers, with the same numbers.
    _, grads2, logits2 = apply_model(host_w, batch)
    assert _devices(grads2) == workers
    np.testing.assert_array_equal(grads, grads2)
    np.testing.assert_array_equal(logits, logits2)
    np.testing.assert_array_equal(new_w, update_model(host_w, grads2))

    # What lands on a proxy's device is counted there.
    # jax keeps one buffer per mesh position: on a proxy shared by k workers, k copies.
    report = coarse.diagnostics.memory_report(apply_model, w, batch)
    k = 4 // proxies
    assert report.proxy.xla_argument_bytes == k * 3 * 4
    logits_block = 8 * 4 // 4 if proxies == 4 else 0
    assert report.proxy.xla_output_bytes == k * (4 + 3 * 4) + logits_block
    assert coarse.diagnostics.memory_report(apply_model, host_w, batch).proxy.xla_output_bytes == 0


# -- every kind of argument, drawn, against jax.jit -------------------------

_KINDS = [
    "bool",
    "int8",
    "int32",
    "uint8",
    "float16",
    "bfloat16",
    "float32",
    "float8_e4m3fn",
    "complex64",
    "key",
    "raw_key",
]
_PLACEMENTS = [
    "numpy",
    "uncommitted",
    "mesh",
    "workers",
    "one_worker",
    "one_proxy",
    "two_tier",
    "data_on_workers",
    "data_on_mesh",
]


def _value(kind: str, shape: tuple[int, ...], seed: int):
    rng = np.random.default_rng(seed)
    if kind == "key":
        return jax.random.key(seed)
    if kind == "raw_key":
        return jax.random.PRNGKey(seed)
    if kind == "bool":
        return rng.random(shape) > 0.5
    if kind == "complex64":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
    if kind.startswith(("int", "uint")):
        return rng.integers(0, 100, shape).astype(kind)
    return np.asarray(rng.standard_normal(shape), dtype=jnp.dtype(kind))


def _place(x, placement: str, mesh):
    workers = workers_mesh(mesh)
    if placement == "numpy":
        return x if isinstance(x, np.ndarray) else np.asarray(x)
    if placement == "uncommitted":
        return jnp.asarray(x)
    if placement == "mesh":
        return jax.device_put(x, NamedSharding(mesh, P()))
    if placement == "workers":
        return jax.device_put(x, NamedSharding(workers, P()))
    if placement == "one_worker":
        return jax.device_put(x, mesh.devices[0, -1])  # (the workers' mesh: one row)
    if placement == "one_proxy":
        return jax.device_put(x, two_tier_mesh(mesh).devices[1, -1])
    if placement == "two_tier":
        return jax.device_put(x, NamedSharding(two_tier_mesh(mesh), P()))
    if placement == "data_on_workers":
        return jax.device_put(x, NamedSharding(workers, P("data")))
    assert placement == "data_on_mesh"
    return jax.device_put(x, NamedSharding(mesh, P("data")))


def _twice(x):
    """What the step does to each argument: something that reads every element."""
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        return jax.random.fold_in(x, 3)
    if x.dtype == jnp.bool_:
        return ~x
    return x + x


def _bits(x):
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return np.asarray(x)


@st.composite
def _arguments(draw):
    proxies = draw(st.sampled_from(PROXIES))
    n = draw(st.integers(1, 3))
    args = []
    for _ in range(n):
        kind = draw(st.sampled_from(_KINDS))
        shape = () if kind in ("key", "raw_key") else draw(st.sampled_from([(), (4,), (4, 3)]))
        placements = [p for p in _PLACEMENTS if p != "numpy" or kind not in ("key",)]
        if kind == "key" or shape == () or kind == "raw_key":
            placements = [p for p in placements if not p.startswith("data_")]
        placement = draw(st.sampled_from(placements))
        donate = placement not in ("numpy",) and draw(st.booleans())
        args.append((kind, shape, placement, donate))
    return proxies, args


_MESHES: dict[int, object] = {}


@settings(
    max_examples=int(os.environ.get("COARSE_ARGUMENT_EXAMPLES", "24")),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(_arguments())
def test_every_kind_of_argument_against_jit(drawn):
    proxies, specs = drawn
    mesh = _MESHES.setdefault(proxies, _mesh(proxies))
    values = [_value(kind, shape, seed) for seed, (kind, shape, _, _) in enumerate(specs)]
    batch = np.arange(16.0, dtype=np.float32).reshape(8, 2)

    def fn(*args):
        *rest, b = args
        return tuple(_twice(jnp.asarray(x)) for x in rest), coarse.all_reduce(jnp.mean(b))

    def ref(*args):
        return tuple(_twice(jnp.asarray(x)) for x in args)

    want = jax.jit(ref)(*[jnp.asarray(v) for v in values])
    donate = tuple(i for i, (_, _, _, d) in enumerate(specs) if d)
    step = coarse.sync(fn, mesh=mesh, donate_argnums=donate)
    placed = [
        _place(v, placement, mesh) for v, (_, _, placement, _) in zip(values, specs, strict=True)
    ]
    got, mean = step(*placed, batch)
    assert float(mean) == pytest.approx(7.5)
    for g, w, (kind, shape, placement, _) in zip(got, want, specs, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (kind, shape, placement)
        np.testing.assert_array_equal(_bits(g), _bits(w), err_msg=f"{kind} {shape} {placement}")


# -- a training loop's repeated call -----------------------------------------


def test_a_repeated_call_reuses_its_layout_and_a_changed_one_does_not(mesh4):
    """`Arguments.repeat` finds the binding of a call with the same arrays' shapes, dtypes
    and shardings; any difference there takes the full path: placement onto the mesh, the
    batch check, a new program. Every result against plain numpy."""
    w = np.array([1.0, 0.5, -1.0], np.float32)

    @coarse.sync(mesh4)
    def step(w, batch):
        return coarse.all_reduce(jnp.sum(batch @ w), op="sum")

    def want(batch):
        return np.float32(np.sum(np.asarray(batch) @ w))

    workers = workers_mesh(mesh4)
    on_workers = jax.device_put(w, NamedSharding(workers, P()))
    batch = jax.device_put(jnp.arange(24.0).reshape(8, 3), NamedSharding(workers, P("data")))
    np.testing.assert_allclose(step(on_workers, batch), want(batch), rtol=1e-6)
    assert len(step._arguments._repeats) == 1
    for k in range(3):  # the repeats: same binding, new values
        b = batch + k
        assert step._arguments.repeat((on_workers, b), {}) is not None
        np.testing.assert_allclose(step(on_workers, b), want(b), rtol=1e-6)
    # w on the mesh make_mesh returned: the workers, so a repeat too.
    on_mesh = jax.device_put(w, NamedSharding(mesh4, P()))
    assert step._arguments.repeat((on_mesh, batch), {}) is not None
    # w on both tiers: moved onto the workers, not a repeat.
    on_both = jax.device_put(w, NamedSharding(two_tier_mesh(mesh4), P()))
    assert step._arguments.repeat((on_both, batch), {}) is None
    out = step(on_both, batch)
    assert set(out.sharding.device_set) == set(mesh4.devices.flat)
    np.testing.assert_allclose(out, want(batch), rtol=1e-6)
    # A batch the workers cannot split is refused as on a first call.
    bad = jax.device_put(jnp.ones((6, 3)), NamedSharding(workers, P()))
    with pytest.raises(ValueError, match=r"leading axis divisible by the 4 workers"):
        step(on_workers, bad)
    # A keyword call and a host value take the full path, with the same numbers.
    np.testing.assert_allclose(step(w=on_workers, batch=batch), want(batch), rtol=1e-6)
    np.testing.assert_allclose(step(w, np.asarray(batch)), want(batch), rtol=1e-6)
    assert len(step._arguments._repeats) == 1


def test_batch_argnums_empty_means_no_batch():
    """``batch_argnums=()`` replicates every argument (a step over state alone); only
    None, the default, splits the last argument over the workers. A tree whose leading
    axis divides the workers would otherwise be split silently."""
    mesh = coarse.make_mesh(workers=4)
    tree = jnp.arange(8.0)
    none = coarse.sync(lambda t: coarse.all_reduce(t), mesh=mesh, batch_argnums=())
    np.testing.assert_array_equal(none(tree), tree)  # the mean of 4 equal copies
    default = coarse.sync(lambda t: coarse.all_reduce(t), mesh=mesh)
    np.testing.assert_array_equal(default(tree), [3.0, 4.0])  # the mean of the 4 slices


def test_a_key_as_the_last_argument_is_not_taken_for_the_batch_silently():
    """``train_step(state, batch, rng)`` (Linen's VAE, dropout): without batch_argnums the
    default batch is the last argument, here a PRNG key that no worker can split. The
    error names the batch's likely position; with it the step runs, the key is the same
    on every worker (returned as it came) and folding in the worker gives each its own
    draws."""
    mesh = coarse.make_mesh(workers=4)
    w = jnp.arange(6.0).reshape(3, 2)
    x = jnp.arange(24.0).reshape(8, 3)
    key = jax.random.key(0)

    def train_step(w, batch, rng):
        noise = jax.random.normal(jax.random.fold_in(rng, lax.axis_index("data")), (1,))
        loss, grads = coarse.value_and_grad(lambda w: jnp.mean((batch @ w) ** 2))(w)
        return w - 0.1 * grads, loss, coarse.all_reduce(noise, op="sum"), rng

    with pytest.raises(ValueError, match=r"argument 2 is taken as the batch .*\(a PRNG key\)"):
        coarse.sync(mesh)(train_step)(w, x, key)
    with pytest.raises(ValueError, match=r"coarse.sync\(mesh, batch_argnums=1\)"):
        coarse.sync(mesh)(train_step)(w, x, key)
    new_w, loss, noise_sum, rng = coarse.sync(mesh, batch_argnums=1)(train_step)(w, x, key)
    want_loss, want_grads = jax.value_and_grad(lambda w: jnp.mean((x @ w) ** 2))(w)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    np.testing.assert_allclose(new_w, w - 0.1 * want_grads, rtol=1e-6)
    draws = [jax.random.normal(jax.random.fold_in(key, i), (1,)) for i in range(4)]
    np.testing.assert_allclose(noise_sum, sum(draws), rtol=1e-5)
    assert jax.random.key_data(rng).tolist() == jax.random.key_data(key).tolist()
