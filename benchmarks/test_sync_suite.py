"""One run comparing every gradient-sync implementation on three model trees and 1/2/4 workers.

Parametrized over

* ``impl``: ``coarse_ffi`` (`coarse.sync` + `coarse.all_reduce`, C++ runtime,
  default Config: each worker through its local proxy), ``coarse_reference``
  (the same with ``Config(mode="reference")``, pure JAX collectives), ``pmean``
  (``jit(shard_map(lax.pmean))`` over a p-device ``("data",)`` mesh) and
  ``dense`` (``schemes.scheme_config("dense", Config(), p)``: every worker
  pushes to and pulls from proxy 0, on the host's real transport);
* ``workers``: p = 1, 2, 4 (p workers + p proxies for the coarse impls);
* ``tree``: ``resnet50`` (97.5 MiB), ``bert_base`` (417.6 MiB), ``vit_b16``
  (330.2 MiB) from benchmarks/model_shapes.py, float32.

Each worker reduces its own values: the tree is passed with a leading axis of
one slice per worker. Compilation, a correctness check and a warm-up call
happen outside the timed calls; each timed call ends in ``block_until_ready``.
``extra_info`` holds impl, workers, tree, bytes (per worker), the median
seconds and the bus bandwidth (NCCL convention: bytes / time * 2 (p - 1) / p,
0 for p = 1); ``benchmarks/report.py`` turns the JSON into a table and a plot.

Select trees with ``--bench-trees=resnet50,vit_b16`` (or ``$COARSE_BENCH_TREES``)
and worker counts with ``--bench-workers=1,2`` (or ``$COARSE_BENCH_WORKERS``);
default all. Rounds: ``$COARSE_BENCH_ROUNDS`` (default 3).

Memory: the C++ runtime keeps up to two spare buffer sets per plan for up to 8
plans (the host pool in ffi/cpu/cpu_storage.cc) and never returns them, so
every coarse_ffi/dense case leaves about 2 x (tree bytes x p) or more resident
until the process ends: BERT-base alone, all worker counts in one process,
peaks near 17 GiB. ``make bench`` therefore runs one process per (tree, worker
count) (measured peak 14.4 GB RSS, BERT at p = 4) and merges the JSON files in
``benchmarks/report.py``. Running all trees in one process may need more than
24 GiB.

Run: ``make bench``, or from outside the repo (so the installed package is imported):
``pytest -q /path/to/benchmarks/test_sync_suite.py -p no:cacheprovider``.
"""

from __future__ import annotations

import collections
import gc
import os
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from model_shapes import SHAPES

import coarse_jax as coarse
from coarse_jax.cli import schemes

WORKER_COUNTS = (1, 2, 4)
ROUNDS = int(os.environ.get("COARSE_BENCH_ROUNDS", "3"))

Impl = Callable[[int], tuple[Callable[[Any], Any], NamedSharding]]


def coarse_impl(config: Callable[[int], coarse.Config]) -> Impl:
    """``coarse.all_reduce`` of the per-worker tree inside a `coarse.sync` step."""

    def build(p: int) -> tuple[Callable[[Any], Any], NamedSharding]:
        mesh = coarse.make_mesh(workers=p)

        @coarse.sync(mesh, config=config(p))
        def sync_grads(per_worker: Any) -> Any:
            # Each worker (and its proxy) holds a (1, ...) slice of the batch.
            return coarse.all_reduce(jax.tree.map(lambda x: x[0], per_worker))

        return sync_grads, NamedSharding(mesh, P("data"))

    return build


def pmean_impl(p: int) -> tuple[Callable[[Any], Any], NamedSharding]:
    """``lax.pmean`` of the per-worker tree over a p-device data mesh."""
    mesh = jax.make_mesh((p,), ("data",), devices=jax.devices()[:p])

    def sync_grads(per_worker: Any) -> Any:
        return lax.pmean(jax.tree.map(lambda x: x[0], per_worker), "data")

    fn = jax.jit(jax.shard_map(sync_grads, mesh=mesh, in_specs=P("data"), out_specs=P()))
    return fn, NamedSharding(mesh, P("data"))


IMPLS: dict[str, Impl] = {
    "coarse_ffi": coarse_impl(lambda p: coarse.Config(mode="ffi")),
    "coarse_reference": coarse_impl(lambda p: coarse.Config(mode="reference")),
    "pmean": pmean_impl,
    "dense": coarse_impl(lambda p: schemes.scheme_config("dense", coarse.Config(mode="ffi"), p)),
}


def _selected(config: pytest.Config, option: str, env: str, choices: list[str]) -> list[str]:
    raw = config.getoption(option, None) or os.environ.get(env, "")
    names = [t.strip() for t in raw.split(",") if t.strip()] or choices
    unknown = sorted(set(names) - set(choices))
    if unknown:
        raise pytest.UsageError(f"{option}: unknown {unknown}; choose from {choices}.")
    return names


def selected_workers(config: pytest.Config) -> list[int]:
    choices = [str(p) for p in WORKER_COUNTS]
    return [int(p) for p in _selected(config, "--bench-workers", "COARSE_BENCH_WORKERS", choices)]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Module scope: pytest runs every test of one tree before building the next.
    if "tree" in metafunc.fixturenames:
        trees = _selected(metafunc.config, "--bench-trees", "COARSE_BENCH_TREES", list(SHAPES))
        metafunc.parametrize("tree", trees, scope="module")
    if "workers" in metafunc.fixturenames:
        metafunc.parametrize("workers", selected_workers(metafunc.config))


@pytest.fixture(scope="module")
def per_worker_grads(
    tree: str, pytestconfig: pytest.Config
) -> Iterator[collections.OrderedDict[str, np.ndarray]]:
    """One float32 gradient tree per worker, stacked on a leading axis (the most workers run).

    An OrderedDict keeps network order when flattened. Freed before the next tree.
    """
    rng = np.random.default_rng(0)
    most = max(selected_workers(pytestconfig))
    grads = collections.OrderedDict(
        (name, rng.standard_normal((most, *shape), dtype=np.float32))
        for name, shape in SHAPES[tree]
    )
    yield grads
    del grads
    gc.collect()


@pytest.mark.parametrize("impl", list(IMPLS))
def test_sync(
    benchmark: Any,
    impl: str,
    workers: int,
    tree: str,
    per_worker_grads: collections.OrderedDict[str, np.ndarray],
) -> None:
    """Times one all-reduce (mean) of ``tree`` over ``workers`` workers with ``impl``."""
    p = workers
    fn, sharding = IMPLS[impl](p)
    batch = jax.block_until_ready(
        jax.device_put({k: v[:p] for k, v in per_worker_grads.items()}, sharding)
    )
    batch = collections.OrderedDict((k, batch[k]) for k in per_worker_grads)

    # Compile, check, and warm up, all outside the timed calls.
    out = jax.block_until_ready(fn(batch))
    first, last = next(iter(per_worker_grads)), next(reversed(per_worker_grads))
    for name in (first, last):
        np.testing.assert_allclose(
            np.asarray(out[name]), per_worker_grads[name][:p].mean(axis=0), rtol=1e-5, atol=1e-6
        )
    del out
    jax.block_until_ready(fn(batch))

    def timed() -> None:
        jax.block_until_ready(fn(batch))  # the result is dropped at once

    benchmark.pedantic(timed, rounds=ROUNDS, iterations=1, warmup_rounds=0)

    nbytes = sum(v[0].nbytes for v in per_worker_grads.values())
    median_s = benchmark.stats.stats.median
    busbw_gbs = nbytes / median_s * 2 * (p - 1) / p / 1e9 if p > 1 else 0.0
    benchmark.extra_info.update(
        {
            "impl": impl,
            "workers": p,
            "tree": tree,
            "bytes": nbytes,
            "median_s": median_s,
            "busbw_GBps": busbw_gbs,
        }
    )
    # batch, fn and the compiled step go with this frame; the runtime's pooled
    # buffers stay (see the module docstring).
