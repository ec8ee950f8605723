"""The three synchronization schemes the paper compares, on one mesh and one set of links.

* ``"coarse"``: the given Config (routes, threshold, shards, dual-sync split);
* ``"allreduce"``: every leaf reduced among the workers (the worker ring),
  the decentralized baseline;
* ``"dense"``: every worker pushes to and pulls from proxy 0, which sums
  (no ring), the centralized parameter-server baseline (it needs one proxy:
  ``coarse.make_mesh(workers=p, proxies=1)`` runs it on p + 1 devices).

On a COARSE k:1 mesh (``make_mesh(workers=p, proxies=q)``) ``"coarse"`` is
COARSE(k:1).

All three run through the same runtime and, with ``Config(topology=...)``,
on the same emulated links, so their times compare like for like.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from coarse_jax._ffi import virtual_sync_seconds
from coarse_jax.api import all_reduce, sync
from coarse_jax.config import Config
from coarse_jax.mesh import DATA, workers_mesh

SCHEMES = ("dense", "allreduce", "coarse")


def scheme_config(scheme: str, config: Config, workers: int) -> Config:
    """``config`` turned into ``scheme`` (see the module docstring)."""
    if scheme == "coarse":
        return config
    if scheme == "allreduce":
        return dataclasses.replace(config, leading_bytes=1 << 62, routes=None)
    if scheme == "dense":
        return dataclasses.replace(config, leading_bytes=0, routes=((0, 0),) * workers)
    raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}.")


def sync_step(mesh: Any, shapes: Any, config: Config) -> tuple[Callable[[], Any], Any]:
    """A compiled, warmed-up `coarse.all_reduce` of a tree shaped like ``shapes``.

    Each worker holds different values (a leading axis of one slice per
    worker). Returns ``(run, tree)``: ``run()`` performs one synchronization
    and waits for it.
    """
    p = mesh.shape[DATA]
    rng = np.random.default_rng(0)
    per_worker = jax.tree.map(lambda s: rng.standard_normal((p, *s.shape)).astype(s.dtype), shapes)
    # On the workers: a COARSE k:1 mesh repeats each shared proxy, and jax
    # cannot split an array over a mesh that lists a device twice.
    tree = jax.device_put(per_worker, NamedSharding(workers_mesh(mesh), P(DATA)))

    @sync(mesh, config=config)
    def step(x: Any) -> Any:
        return all_reduce(jax.tree.map(lambda v: v[0], x))

    def run() -> Any:
        return jax.block_until_ready(step(tree))

    run()  # compile and warm up
    return run, tree


def time_sync(mesh: Any, shapes: Any, config: Config, reps: int = 3) -> float:
    """Median seconds of one synchronization (see `sync_step`), compile and warm-up excluded.

    On a virtual-clock topology (``EmulatedTopology(clock="virtual")``) the seconds
    are the simulated ones the runtime reports (exact and repeatable);
    otherwise wall time.
    """
    run, _ = sync_step(mesh, shapes, config)
    virtual = config.topology is not None and config.topology.clock == "virtual"
    virtual_sync_seconds()  # forget the warm-up's
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        run()
        elapsed = time.perf_counter() - start
        if virtual:
            spans = virtual_sync_seconds()
            if len(spans) != 1:
                raise RuntimeError(f"time_sync: expected one simulated time per step, got {spans}.")
            elapsed = spans[0]
        times.append(elapsed)
    return statistics.median(times)
