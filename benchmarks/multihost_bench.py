"""One process of benchmarks/test_multihost.py (run by ``python -m coarse_jax.launch``).

Times, in one run, the mean over all 8 workers of a ResNet-50 gradient tree
(161 float32 leaves, ~97.5 MiB per worker) on 2 processes x (4 workers + 4
proxies):

* ``coarse``: `coarse.all_reduce` in a `coarse.sync` step on the
  ``("host", "tier", "data")`` mesh: the runtime within each process, then
  the proxies' ``all_gather`` over "host" (gloo) and the in-host hand-out;
* ``pmean``: ``lax.pmean`` over ("host", "data") of the same 8 worker devices
  (gloo for every byte, the in-process ones too);
* ``coarse_host_only``: for the breakdown, each process's own 4 + 4 devices
  alone (`coarse_jax.mesh.local_mesh`), both processes at once: the
  intra-host part, without the inter-host step.

The two are timed alternately, ``ROUNDS`` calls each after a warm-up; the
medians and their ratio are printed as a ``RESULT`` line.
"""

from __future__ import annotations

import collections
import json
import statistics
import sys
import time
from typing import Any

import jax
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse
from coarse_jax.bench.shapes import RESNET50_SHAPES
from coarse_jax.launch import initialize
from coarse_jax.mesh import local_mesh

P_LOCAL = 4


def main() -> None:
    assert initialize(), "run me with python -m coarse_jax.launch"
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    mesh = coarse.make_mesh(workers=P_LOCAL)
    hosts = jax.process_count()
    axes = ("host", "data")
    rng = np.random.default_rng(jax.process_index())
    local = collections.OrderedDict(
        (name, rng.standard_normal((P_LOCAL, *shape), dtype=np.float32))
        for name, shape in RESNET50_SHAPES
    )

    @coarse.sync(mesh)
    def coarse_sync(per_worker: Any) -> Any:
        return coarse.all_reduce(jax.tree.map(lambda x: x[0], per_worker))

    wmesh = Mesh(mesh.devices[:, 0, :], axes)  # the same 8 workers
    pmean_sync = jax.jit(
        jax.shard_map(
            lambda t: lax.pmean(jax.tree.map(lambda x: x[0], t), axes),
            mesh=wmesh,
            in_specs=P(axes),
            out_specs=P(),
        )
    )

    def put(m: Mesh) -> Any:
        sharding = NamedSharding(m, P(axes))
        return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), local)

    lmesh = local_mesh(mesh)

    @coarse.sync(lmesh)
    def host_only(per_worker: Any) -> Any:
        return coarse.all_reduce(jax.tree.map(lambda x: x[0], per_worker))

    impls = {
        "coarse": (coarse_sync, put(mesh)),
        "pmean": (pmean_sync, put(wmesh)),
        "coarse_host_only": (host_only, jax.device_put(local, NamedSharding(lmesh, P("data")))),
    }
    outs = {k: jax.block_until_ready(f(t)) for k, (f, t) in impls.items()}  # compile, warm up
    for name in ("stem/conv/kernel", "head/dense/bias"):
        np.testing.assert_allclose(
            np.asarray(outs["coarse"][name]), np.asarray(outs["pmean"][name]), rtol=1e-5, atol=1e-6
        )
    del outs
    times: dict[str, list[float]] = {k: [] for k in impls}
    for _ in range(rounds):
        for k, (f, t) in impls.items():
            start = time.perf_counter()
            jax.block_until_ready(f(t))
            times[k].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    nbytes = sum(x.nbytes // P_LOCAL for x in local.values())
    workers = hosts * P_LOCAL
    result = {
        "processes": hosts,
        "workers_per_process": P_LOCAL,
        "bytes_per_worker": nbytes,
        "rounds": rounds,
        "median_s": med,
        "min_s": {k: min(v) for k, v in times.items()},
        "busbw_GBps": {k: nbytes / s * 2 * (workers - 1) / workers / 1e9 for k, s in med.items()},
        "coarse_over_pmean": med["coarse"] / med["pmean"],
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
