"""coarse_jax.kernels (pack, unpack, reduce) against a numpy oracle, on CPU and GPU.

The oracle shares no code with the kernels: numpy float32 arithmetic and
ml_dtypes' round-to-nearest-even casts. Both backends must match it bit for
bit (same f32 path, one rounding, sums in argument order). GPU cases run
when jax sees a GPU and the CUDA extension is built, and skip otherwise.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from helpers import gpu_or_skip

from coarse_jax import kernels

DTYPES = ["float32", "bfloat16", "float16"]
NP = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


@pytest.fixture(params=["cpu", "gpu"])
def device(request):
    if request.param == "cpu":
        return jax.devices("cpu")[0]
    return gpu_or_skip()[0]


def _random(rng, shape, dtype):
    # Fresh, non-zero, mixed-sign values with a spread of magnitudes.
    x = rng.standard_normal(shape).astype(np.float32) * rng.uniform(0.1, 10.0)
    return x.astype(NP[dtype])


def _pack_oracle(leaves, dtype, scale):
    parts = [(np.asarray(x, np.float32) * np.float32(scale)).ravel() for x in leaves]
    flat = np.concatenate(parts) if parts else np.zeros((0,), np.float32)
    return flat.astype(NP[dtype])


def _run(device, fn, *args):
    with jax.default_device(device):
        args = jax.device_put(args, device)
        return jax.device_get(jax.jit(fn)(*args))


def _same(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.reshape(-1).view(np.uint8), want.reshape(-1).view(np.uint8))


# Odd sizes so spans start misaligned in the buffer, a scalar, an empty leaf,
# one leaf long enough to span many blocks (16384 elements per block).
SHAPES = [(3,), (), (0,), (17, 5), (4097,), (2, 65539)]


@pytest.mark.parametrize("leaf_dtype", DTYPES)
@pytest.mark.parametrize("buf_dtype", DTYPES)
def test_pack_unpack_match_oracle(device, leaf_dtype, buf_dtype):
    rng = np.random.default_rng()
    leaves = [_random(rng, s, leaf_dtype) for s in SHAPES]
    scale = 0.25
    buf = _run(device, lambda xs: kernels.pack(xs, dtype=buf_dtype, scale=scale), leaves)
    _same(buf, _pack_oracle(leaves, buf_dtype, scale))

    outs = _run(device, lambda b: kernels.unpack(b, leaves, scale=4.0), buf)
    sizes = np.cumsum([0] + [int(np.prod(s)) for s in SHAPES])
    for i, (out, leaf) in enumerate(zip(outs, leaves, strict=True)):
        want = np.asarray(buf[sizes[i] : sizes[i + 1]], np.float32) * np.float32(4.0)
        _same(out, want.astype(NP[leaf_dtype]).reshape(leaf.shape))


def test_pack_mixed_dtypes_and_many_small_leaves(device):
    rng = np.random.default_rng()
    # 2,000 leaves of 1..40 elements, dtypes cycling: one launch on a GPU.
    leaves = [_random(rng, (int(rng.integers(1, 41)),), DTYPES[i % 3]) for i in range(2000)]
    buf = _run(device, lambda xs: kernels.pack(xs, dtype="float32"), leaves)
    _same(buf, _pack_oracle(leaves, "float32", 1.0))
    back = _run(device, lambda b: kernels.unpack(b, leaves), buf)
    for out, leaf in zip(back, leaves, strict=True):
        _same(out, leaf)  # f32 holds every bf16/f16 value exactly


def test_pack_of_nothing(device):
    buf = _run(device, lambda: kernels.pack([]))
    assert buf.shape == (0,) and buf.dtype == np.float32
    outs = _run(device, lambda b: kernels.unpack(b, [jnp.zeros((0, 3))]), buf)
    assert outs[0].shape == (0, 3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [1, 2, 3, 8])
@pytest.mark.parametrize("n", [0, 1, 7, 1027, 300001])
def test_reduce_matches_oracle(device, dtype, k, n):
    rng = np.random.default_rng()
    xs = [_random(rng, (n,), dtype) for _ in range(k)]
    scale = 1.0 / 3.0
    got = _run(device, lambda *a: kernels.reduce(*a, scale=scale), *xs)
    acc = np.asarray(xs[0], np.float32)
    for x in xs[1:]:
        acc = acc + np.asarray(x, np.float32)
    _same(got, (acc * np.float32(scale)).astype(NP[dtype]))


def test_jitted_program_chains_the_kernels(device):
    # The runtime's path for one shard in one program: pack two workers'
    # leaves, reduce with the 1/p scale, unpack into the leaves' types.
    rng = np.random.default_rng()
    like = [_random(rng, (33, 7), "bfloat16"), _random(rng, (5,), "float32")]
    w0 = [_random(rng, x.shape, str(x.dtype)) for x in like]
    w1 = [_random(rng, x.shape, str(x.dtype)) for x in like]

    def step(a, b):
        mean = kernels.reduce(kernels.pack(a), kernels.pack(b), scale=0.5)
        return kernels.unpack(mean, a)

    got = _run(device, step, w0, w1)
    for g, x0, x1 in zip(got, w0, w1, strict=True):
        want = (np.asarray(x0, np.float32) + np.asarray(x1, np.float32)) * np.float32(0.5)
        _same(g, want.astype(x0.dtype))


def test_errors_name_the_argument():
    with pytest.raises(TypeError, match=r"leaves\[1\] has dtype int32"):
        kernels.pack([jnp.ones(3), jnp.ones(3, jnp.int32)])
    with pytest.raises(TypeError, match="dtype has dtype float64"):
        kernels.pack([jnp.ones(3)], dtype=np.float64)
    with pytest.raises(ValueError, match=r"buffer has shape \(5,\), expected \(6,\)"):
        kernels.unpack(jnp.ones(5), [jnp.ones((2, 3))])
    with pytest.raises(ValueError, match="takes 1 to 8 arrays, got 9"):
        kernels.reduce(*[jnp.ones(2)] * 9)
    with pytest.raises(TypeError, match=r"arrays\[1\] has dtype bfloat16"):
        kernels.reduce(jnp.ones(2), jnp.ones(2, jnp.bfloat16))
    with pytest.raises(ValueError, match=r"arrays\[1\] has shape \(3,\)"):
        kernels.reduce(jnp.ones(2), jnp.ones(3))
