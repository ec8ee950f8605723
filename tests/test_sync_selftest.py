"""The whole sync protocol on each device backend, outside XLA (ffi/runtime/sync_selftest.h).

2p threads, p workers and p proxies, each with its own device, run the phases
of the four custom calls (the same C++ as the handlers: push pieces, proxies
sum and ring-reduce, workers ring-reduce the leading leaf and hand it over,
everyone pulls) for several steps, each a new session reusing the storage of
the one before. On a GPU every member has its own stream, so the CUDA
backend's events, staging buffers, kernels and peer-copy calls race as they
would across GPUs; a single GPU cannot hold an XLA mesh of 2p devices, so
this is how the CUDA transport is tested there. Oracles: the float64 numpy
mean, and for the GPU the CPU backend's result, which it must equal bit for
bit (same sums in the same order, the 1/p scale folded into the same step).
"""

import numpy as np
import pytest
from helpers import gpu_or_skip

# (p, proxy elements, piece, leading elements, route)
CASES = [
    (1, 10, 4, 3, "local"),
    (2, 0, 1, 0, "local"),
    (2, 1, 1, 1, "cross"),
    (3, 1000, 128, 7, "cross"),
    (4, 100003, 16384, 1003, "cross"),
    (4, 50000, 4096, 0, "dense"),
    (4, 0, 1, 70001, "local"),
    (8, 40000, 3000, 4099, "cross"),
]
IDS = [f"p{c[0]}-{c[1]}x{c[2]}-lead{c[3]}-{c[4]}" for c in CASES]


def _values(p, n):
    rng = np.random.default_rng()
    return (rng.standard_normal((p, n)) * rng.uniform(0.1, 10.0)).astype(np.float32)


def _check_mean(out, values, steps):
    p, n = values.shape
    assert out.shape == (steps, 2 * p, n)
    want = values.astype(np.float64).mean(axis=0)
    scale = max(1.0, float(np.abs(values).max(initial=0.0)))
    np.testing.assert_allclose(out, np.broadcast_to(want, out.shape), rtol=0, atol=4e-7 * p * scale)
    # Every device of both tiers holds the same bits, and every step (a fresh
    # session on reused storage) gives the same bits.
    assert (out == out[:1, :1]).all()


@pytest.mark.parametrize("p,proxy,piece,lead,route", CASES, ids=IDS)
def test_cpu_sync(p, proxy, piece, lead, route):
    from coarse_jax import _coarse_cpu

    values = _values(p, proxy + lead)
    _check_mean(_coarse_cpu.sync_selftest(values, lead, piece, route, 3), values, 3)
    assert _coarse_cpu.live_sessions() == 0


@pytest.mark.parametrize("p,proxy,piece,lead,route", CASES, ids=IDS)
def test_cuda_sync_matches_cpu_bitwise(p, proxy, piece, lead, route):
    cuda = gpu_or_skip()[1]
    from coarse_jax import _coarse_cpu

    values = _values(p, proxy + lead)
    out = cuda.sync_selftest(values, lead, piece, route, 4)
    _check_mean(out, values, 4)
    np.testing.assert_array_equal(
        out[0], _coarse_cpu.sync_selftest(values, lead, piece, route, 1)[0]
    )
    assert cuda.live_sessions() == 0


def test_cuda_sync_many_steps_new_values():
    # Storage reused across sessions with different inputs: a step that read
    # the previous step's data (a missing wait) would show here.
    cuda = gpu_or_skip()[1]
    for _ in range(20):
        values = _values(4, 65537 + 999)
        _check_mean(cuda.sync_selftest(values, 999, 8192, "cross", 1), values, 1)
