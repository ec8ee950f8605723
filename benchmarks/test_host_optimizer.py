"""The host proxies' Adam/AdamW update against memory bandwidth and optax (issue 38, item 2).

One run, three kinds of figures over the same number of f32 elements
(``COARSE_BENCH_HOST_N``, default 2**22: 16 MiB per array, far more than the
caches hold):

* ``coarse_*``: one pass of the CPU backend's optimizer, what a proxy runs on
  its share of the parameters (``_coarse_lab_cpu.HostOptimizerBench``): the AVX2
  loop and the scalar one on one thread, and the AVX2 loop split over the
  bounded host pool (``_pool``, as a proxy runs a large share), each counted
  as 32 bytes per element (reads the gradient, the master weight and two
  moments; writes the weight twice, the master's other buffer and the
  gradient's place, and two moments).
* ``triad``: a STREAM triad ``a = b + s * c`` over the same page-aligned
  memory, 12 bytes per element (STREAM's count): this machine's memory
  bandwidth for one thread.
* ``optax_adamw_jit``: ``optax.adamw`` (update + apply_updates), jitted on one
  CPU device with the params and state donated, counted as the 28 bytes per
  element it must move at least (no second write of the weight). XLA:CPU may
  run it on more than one thread; the coarse loop runs on one (a proxy's).

The GB/s and the ratios (coarse / triad, coarse / optax in elements per
second) are printed at the end (``pytest -s``) and kept in each benchmark's
``extra_info``. Nothing is asserted about speed.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from coarse_jax import _ffi
from coarse_jax._lab import lab_cpu

N = int(os.environ.get("COARSE_BENCH_HOST_N", 1 << 22))
BYTES = {"coarse_adamw_avx2": 32, "coarse_adamw_scalar": 32, "coarse_adam_avx2": 32}
BYTES |= {"coarse_adamw_avx2_pool": 32}
BYTES |= {"triad": 12, "optax_adamw_jit": 28}
RESULTS: dict[str, float] = {}  # impl -> median seconds


@pytest.fixture(scope="module")
def host_bench():
    bench = lab_cpu().HostOptimizerBench(N)
    yield bench
    _print_summary()


def _print_summary() -> None:
    if not RESULTS:
        return
    threads = _ffi.cpu_module().host_threads()
    print(f"\nhost optimizer, {N} f32 elements, one thread unless _pool ({threads} threads):")
    for impl, t in RESULTS.items():
        print(f"  {impl:<22} {t * 1e3:8.2f} ms  {BYTES[impl] * N / t / 1e9:6.2f} GB/s")
    gbs = {k: BYTES[k] * N / t / 1e9 for k, t in RESULTS.items()}
    if "coarse_adamw_avx2" in gbs and "triad" in gbs:
        print(f"  adamw / triad bandwidth: {gbs['coarse_adamw_avx2'] / gbs['triad']:.2f}")
    if "coarse_adamw_avx2" in RESULTS and "optax_adamw_jit" in RESULTS:
        speedup = RESULTS["optax_adamw_jit"] / RESULTS["coarse_adamw_avx2"]
        print(f"  adamw elements/s, coarse / optax jit: {speedup:.2f}")
    if "coarse_adamw_avx2_pool" in gbs and "triad" in gbs:
        pool = gbs["coarse_adamw_avx2_pool"] / gbs["triad"]
        print(f"  adamw on the pool / one thread's triad bandwidth: {pool:.2f}")
    if "coarse_adamw_avx2" in RESULTS and "coarse_adamw_scalar" in RESULTS:
        vec = RESULTS["coarse_adamw_scalar"] / RESULTS["coarse_adamw_avx2"]
        print(f"  adamw, AVX2 / scalar: {vec:.2f}")


def _record(benchmark, impl: str) -> None:
    median = benchmark.stats.stats.median
    RESULTS[impl] = median
    benchmark.extra_info["gb_per_s"] = BYTES[impl] * N / median / 1e9
    benchmark.extra_info["elements"] = N


@pytest.mark.parametrize(
    "impl, adamw, vectorized, parallel",
    [
        ("coarse_adamw_avx2", True, True, False),
        ("coarse_adamw_scalar", True, False, False),
        ("coarse_adam_avx2", False, True, False),
        ("coarse_adamw_avx2_pool", True, True, True),
    ],
)
def test_coarse_host_optimizer(benchmark, host_bench, impl, adamw, vectorized, parallel):
    args = (adamw, vectorized, parallel)
    host_bench.adam(*args)  # warm up
    benchmark.pedantic(host_bench.adam, args=args, rounds=10, warmup_rounds=1)
    _record(benchmark, impl)


def test_triad(benchmark, host_bench):
    host_bench.triad()
    benchmark.pedantic(host_bench.triad, rounds=10, warmup_rounds=1)
    _record(benchmark, "triad")


def test_optax_adamw_jit(benchmark, host_bench):
    cpu = jax.devices("cpu")[0]
    tx = optax.adamw(1e-3, weight_decay=1e-2)
    i = np.arange(N, dtype=np.float32)
    params = jax.device_put(np.cos(0.3 * i), cpu)
    grads = jax.device_put(1e-2 * np.sin(0.1 * i), cpu)
    held = [params, tx.init(params)]

    def update(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    step = jax.jit(update, donate_argnums=(0, 1))

    def run():
        held[0], held[1] = step(held[0], held[1], grads)
        jax.block_until_ready(held[0])

    run()  # compile and warm up
    benchmark.pedantic(run, rounds=10, warmup_rounds=1)
    _record(benchmark, "optax_adamw_jit")
    assert jnp.isfinite(held[0]).all()
