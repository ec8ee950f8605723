"""Gradient synchronization of a ResNet-50-sized tree: coarse_jax vs ``lax.pmean``.

Each implementation all-reduces (mean) the 161 float32 leaves of a ResNet-50
gradient tree (~25.6M parameters, ~97.5 MiB) over 4 workers:

* ``coarse_ffi``: a `coarse.sync` step calling `coarse.all_reduce`, C++ runtime
  (4 workers + 4 proxies, 8 devices);
* ``coarse_reference``: the same with ``Config(mode="reference")`` (pure JAX
  collectives over the same 8 devices);
* ``coarse_ffi_2to1``: ``coarse_ffi`` with 2 proxies, each shared by 2 workers
  (COARSE(2:1), ``make_mesh(workers=4, proxies=2)``, 6 devices);
* ``pmean``: ``jit(shard_map(pmean))`` over a 4-device ``("data",)`` mesh;
* ``coarse_host`` / ``coarse_host_p8``: ``coarse_ffi`` with the proxies in host
  memory (``make_mesh(..., proxies_on="host")``, issue 38): 4 workers on 4
  devices, and 8 workers on all 8 devices (8 host proxies), against ``pmean``
  and ``pmean_p8`` (8 devices) on the same devices.

The tree is passed as a batch argument with a leading axis of one slice per
worker, so each worker reduces its own values as it would after a backward
pass. Compilation and warm-up happen outside the timed calls. Bus bandwidth
follows the NCCL convention: bytes / time * 2 (p - 1) / p.

Run: ``make bench``, or from outside the repo (so the installed package is
imported): ``pytest -q benchmarks -p no:cacheprovider``.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse
from coarse_jax.cli.resnet50 import RESNET50_SHAPES  # the 161 leaves, written out

WORKERS = 4  # the default; the *_p8 cases run 8
MAX_WORKERS = 8
ROUNDS = 30


def test_shapes_are_resnet50() -> None:
    """The table above is ResNet-50: 161 leaves, 25,557,032 parameters."""
    assert len(RESNET50_SHAPES) == 161
    assert sum(math.prod(shape) for _, shape in RESNET50_SHAPES) == 25_557_032


@pytest.fixture(scope="module")
def per_worker_grads() -> collections.OrderedDict[str, np.ndarray]:
    """One float32 gradient tree per worker, stacked on a leading axis of size 8 (a case
    of p workers takes the first p).

    An OrderedDict keeps network order when flattened (a dict would be sorted
    by name), which is the order coarse pushes in reverse.
    """
    rng = np.random.default_rng(0)
    return collections.OrderedDict(
        (name, rng.standard_normal((MAX_WORKERS, *shape), dtype=np.float32))
        for name, shape in RESNET50_SHAPES
    )


def coarse_sync(
    mode: str, proxies: int = WORKERS, workers: int = WORKERS, proxies_on: str = "devices"
) -> tuple[Callable[[Any], Any], NamedSharding]:
    """``coarse.all_reduce`` of the per-worker tree inside a `coarse.sync` step."""
    mesh = coarse.make_mesh(workers=workers, proxies=proxies, proxies_on=proxies_on)

    @coarse.sync(mesh, config=coarse.Config(mode=mode))
    def sync_grads(per_worker: Any) -> Any:
        # Each worker (and its proxy) holds a (1, ...) slice of the batch.
        return coarse.all_reduce(jax.tree.map(lambda x: x[0], per_worker))

    # Split over the workers (a k:1 mesh lists each shared proxy k times, which
    # jax cannot split an array over).
    return sync_grads, NamedSharding(mesh, P("data"))


def pmean_sync(workers: int = WORKERS) -> tuple[Callable[[Any], Any], NamedSharding]:
    """``lax.pmean`` of the per-worker tree over a ``workers``-device data mesh."""
    mesh = jax.make_mesh((workers,), ("data",), devices=jax.devices()[:workers])

    def sync_grads(per_worker: Any) -> Any:
        return lax.pmean(jax.tree.map(lambda x: x[0], per_worker), "data")

    fn = jax.jit(jax.shard_map(sync_grads, mesh=mesh, in_specs=P("data"), out_specs=P()))
    return fn, NamedSharding(mesh, P("data"))


IMPLS: dict[str, Callable[[], tuple[Callable[[Any], Any], NamedSharding]]] = {
    "coarse_ffi": lambda: coarse_sync("ffi"),
    "coarse_reference": lambda: coarse_sync("reference"),
    "coarse_ffi_2to1": lambda: coarse_sync("ffi", proxies=WORKERS // 2),
    "coarse_host": lambda: coarse_sync("ffi", proxies_on="host"),
    "pmean": pmean_sync,
    "coarse_host_p8": lambda: coarse_sync("ffi", 8, 8, "host"),
    "pmean_p8": lambda: pmean_sync(8),
}


def workers_of(impl: str) -> int:
    return 8 if impl.endswith("_p8") else WORKERS


@pytest.mark.parametrize("impl", list(IMPLS))
def test_sync_resnet50(
    benchmark: Any,
    impl: str,
    per_worker_grads: collections.OrderedDict[str, np.ndarray],
    sync_results: dict[str, dict[str, float]],
) -> None:
    """Times one all-reduce of the ResNet-50 gradient tree."""
    fn, sharding = IMPLS[impl]()
    workers = workers_of(impl)
    mine = {name: x[:workers] for name, x in per_worker_grads.items()}
    tree = jax.block_until_ready(jax.device_put(mine, sharding))

    # Compile, warm up, and check the result once, all outside the timed calls.
    out = jax.block_until_ready(fn(tree))
    for name in ("stem/conv/kernel", "stage4/block2/conv2/kernel", "head/dense/bias"):
        np.testing.assert_allclose(
            np.asarray(out[name]), mine[name].mean(axis=0), rtol=1e-5, atol=1e-6
        )
    del out
    jax.block_until_ready(fn(tree))

    benchmark.pedantic(
        lambda: jax.block_until_ready(fn(tree)), rounds=ROUNDS, iterations=1, warmup_rounds=1
    )

    nbytes = sum(x.nbytes // workers for x in mine.values())
    median_s = benchmark.stats.stats.median
    busbw_gbs = nbytes / median_s * 2 * (workers - 1) / workers / 1e9
    benchmark.extra_info.update(
        {"bytes": nbytes, "time_per_call_s": median_s, "busbw_GBps": busbw_gbs}
    )
    sync_results[impl] = {
        "bytes": nbytes,
        "median_s": median_s,
        "busbw_gbs": busbw_gbs,
        "workers": workers,
    }
