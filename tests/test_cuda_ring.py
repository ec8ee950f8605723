"""The ring protocol on each device backend, outside XLA (ffi/ring_selftest.h).

p worker threads run the workers' ring all-reduce (the code of
coarse_worker_ring) for several steps, each a new session reusing the storage
of the one before. On CPU the members share host memory; on a GPU each member
has its own stream, so the CUDA backend's events, staging buffers and peer
copies race as they would across GPUs (a single GPU cannot hold an XLA mesh
of 2p devices). Oracles: the numpy mean (float64), and, for the GPU, the CPU
backend's result, which the GPU must match bit for bit (same sums in the same
order, the 1/p scale folded into the same step).
"""

import numpy as np
import pytest

from helpers import gpu_or_skip

CASES = [(1, 5), (2, 0), (2, 1), (3, 7), (4, 1003), (4, (1 << 20) + 3), (8, 4099)]


def _values(p, n):
    rng = np.random.default_rng()
    return (rng.standard_normal((p, n)) * rng.uniform(0.1, 10.0)).astype(np.float32)


def _check_mean(out, values, steps):
    p, n = values.shape
    assert out.shape == (steps, p, n)
    want = values.astype(np.float64).mean(axis=0)
    scale = max(1.0, float(np.abs(values).max(initial=0.0)))
    np.testing.assert_allclose(out, np.broadcast_to(want, out.shape), rtol=0, atol=4e-7 * p * scale)
    # Every worker holds the same bits, and every step (a fresh session on
    # reused storage) gives the same bits: the reduction order is fixed.
    assert (out == out[:1, :1]).all()


@pytest.mark.parametrize("p,n", CASES)
def test_cpu_ring(p, n):
    from coarse_jax import _coarse_cpu

    values = _values(p, n)
    _check_mean(_coarse_cpu.ring_selftest(values, 3), values, 3)
    assert _coarse_cpu.live_sessions() == 0


@pytest.mark.parametrize("p,n", CASES)
def test_cuda_ring_matches_cpu_bitwise(p, n):
    cuda = gpu_or_skip()[1]
    from coarse_jax import _coarse_cpu

    values = _values(p, n)
    out = cuda.ring_selftest(values, 4)
    _check_mean(out, values, 4)
    np.testing.assert_array_equal(out[0], _coarse_cpu.ring_selftest(values, 1)[0])
    assert cuda.live_sessions() == 0


def test_cuda_ring_many_steps_new_values():
    # Storage reused across sessions with different inputs: a step that read
    # the previous step's data (a missing wait) would show here.
    cuda = gpu_or_skip()[1]
    for _ in range(20):
        values = _values(4, 65537)
        _check_mean(cuda.ring_selftest(values, 1), values, 1)
