"""The two figures a jax upgrade could lose, one run (issue 23): run under each jax.

* the 1 KiB ``coarse.all_reduce`` (sum) against ``lax.psum`` over the same 4
  workers: a call's fixed cost, which depends on jit's C++ dispatch path (a
  custom call with a JAX effect loses it: coarse_jax/_ffi/primitive.py);
* the ResNet-50 gradient tree's sync against ``lax.pmean`` (161 leaves, 97.5 MiB).

Each is a median over many calls, coarse and its baseline interleaved in one
process; the ratio is what to compare across jax versions. ``make
bench-versions`` runs this file under jax 0.10.2 (.venv) and the newest
(.venv-newest) and prints both.
"""

from __future__ import annotations

import collections
import functools

import jax
import numpy as np
import pytest
from baselines import psum_over
from common.clock import interleaved, medians, warm_up
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from test_sync_resnet50 import WORKERS, coarse_sync, pmean_sync

import coarse_jax as coarse
from coarse_jax.cli.resnet50 import RESNET50_SHAPES

_LINES: list[str] = []


def _interleaved_medians(fns: dict, x: dict, calls: int) -> dict[str, float]:
    runs = {name: functools.partial(fn, x[name]) for name, fn in fns.items()}
    for run in runs.values():  # compile and warm up
        warm_up(run, 2)
    return medians(interleaved(runs, calls))


def _report(what: str, medians: dict[str, float], base: str) -> None:
    other = next(n for n in medians if n != base)
    _LINES.append(
        f"jax {jax.__version__}: {what}: {other} {medians[other] * 1e6:,.0f} us, "
        f"{base} {medians[base] * 1e6:,.0f} us, ratio {medians[other] / medians[base]:.2f}"
    )
    print("\n" + "\n".join(_LINES))


def test_one_kib_all_reduce_against_psum(benchmark):
    mesh = coarse.make_mesh(workers=WORKERS)
    psum, flat = psum_over(WORKERS)
    # xla_below_bytes=0: the proxies' path (1 KiB would take the latency route).
    cfg = coarse.Config(xla_below_bytes=0)
    step = coarse.sync(lambda x: coarse.all_reduce(x, op="sum"), mesh, config=cfg)
    x = np.arange(WORKERS * 256, dtype=np.float32) % 7  # 1 KiB per worker
    args = {
        "coarse all_reduce": jax.device_put(x, NamedSharding(mesh, P("data"))),
        "psum": jax.device_put(x, NamedSharding(flat, P("data"))),
    }
    medians: dict[str, float] = {}

    def measure():
        medians.update(
            _interleaved_medians({"coarse all_reduce": step, "psum": psum}, args, calls=300)
        )

    benchmark.pedantic(measure, rounds=1, iterations=1)
    _report("1 KiB sum", medians, "psum")


@pytest.mark.timeout(900)
def test_resnet50_tree_against_pmean(benchmark):
    rng = np.random.default_rng(0)
    grads = collections.OrderedDict(
        (name, rng.standard_normal((WORKERS, *shape), dtype=np.float32))
        for name, shape in RESNET50_SHAPES
    )
    (ffi, ffi_sharding), (pmean, pmean_sharding) = coarse_sync("ffi"), pmean_sync()
    args = {
        "coarse": jax.device_put(grads, ffi_sharding),
        "pmean": jax.device_put(grads, pmean_sharding),
    }
    medians: dict[str, float] = {}

    def measure():
        medians.update(_interleaved_medians({"coarse": ffi, "pmean": pmean}, args, calls=15))

    benchmark.pedantic(measure, rounds=1, iterations=1)
    _report("ResNet-50 tree mean", medians, "pmean")
