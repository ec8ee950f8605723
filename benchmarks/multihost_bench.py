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

With a second argument ``emulated`` it times instead COARSE and the
AllReduce baseline (coarse_jax/cli/schemes.py) on the emulated "v100"
links x300 with the preset's 100 Gb/s inter-host link, on the real clock,
beside `coarse.model.predict_hosts_sync_s`, each also on each host alone
(the intra-host part, beside `predict_plan_sync_s`). COARSE's routes,
threshold and shard size come from a virtual-clock profile of one host's
devices (both processes get the same one: a virtual profile is exact).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import pathlib
import sys
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax import lax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse
from coarse_jax.cli.resnet50 import RESNET50_SHAPES
from coarse_jax.launch import initialize
from coarse_jax.mesh import local_mesh

# The examples' clock, as the benchmarks' conftest.py gives it to them (a script here).
sys.path.append(str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
from common.clock import interleaved, medians

P_LOCAL = 4
SYNC_SCALE = 300.0


def _time(
    impls: dict[str, tuple[Any, Any]], rounds: int, align: bool = False
) -> dict[str, list[float]]:
    """Each impl ``rounds`` times, alternating call by call.

    ``align``: the processes meet (untimed) before each call. A call on each
    host alone leaves the two processes apart by up to a second here, which
    the next step across hosts would otherwise count as its own time (at
    its per-call barrier, coarse_jax/dispatch/arrival.py).
    """

    @contextlib.contextmanager
    def meet(k: str, r: int) -> Iterator[None]:
        multihost_utils.sync_global_devices(f"bench/{k}/{r}")
        yield

    runs = {k: functools.partial(f, t) for k, (f, t) in impls.items()}
    return interleaved(runs, rounds, around=meet if align else None)


def emulated(rounds: int) -> None:
    """COARSE vs AllReduce on emulated v100 links + a 100 Gb/s inter-host link (real clock)."""
    from coarse_jax.cli import schemes
    from coarse_jax.cli.resnet50 import resnet50_tree
    from coarse_jax.perf_model import (
        inter_host_bytes,
        link_bound,
        predict_hosts_sync_s,
        predict_plan_sync_s,
    )

    mesh = coarse.make_mesh(workers=P_LOCAL)
    lmesh = local_mesh(mesh)
    hosts = jax.process_count()
    axes = ("host", "data")
    probe = coarse.Topology.preset("v100", P_LOCAL, clock="virtual")
    prof = coarse.diagnostics.profile(
        lmesh, topology=probe, sizes=tuple(4**k for k in range(5, 12)), reps=2
    )
    topo = coarse.Topology.preset("v100", P_LOCAL, time_scale=SYNC_SCALE)
    base = coarse.Config.from_profile(prof, topology=topo)
    rng = np.random.default_rng(jax.process_index())
    local = collections.OrderedDict(
        (name, rng.standard_normal((P_LOCAL, *shape), dtype=np.float32))
        for name, shape in RESNET50_SHAPES
    )
    tree = resnet50_tree()
    impls: dict[str, tuple[Any, Any]] = {}
    info: dict[str, dict[str, Any]] = {}
    for scheme in ("allreduce", "coarse"):
        cfg = schemes.scheme_config(scheme, base, P_LOCAL)

        @coarse.sync(mesh, config=cfg)
        def across(per_worker: Any) -> Any:
            return coarse.all_reduce(jax.tree.map(lambda x: x[0], per_worker))

        @coarse.sync(lmesh, config=cfg)
        def alone(per_worker: Any) -> Any:
            return coarse.all_reduce(jax.tree.map(lambda x: x[0], per_worker))

        sharding = NamedSharding(mesh, P(axes))
        global_tree = {
            name: jax.make_array_from_process_local_data(sharding, v) for name, v in local.items()
        }
        impls[scheme] = (across, global_tree)
        impls[scheme + "_host_only"] = (
            alone,
            jax.device_put(local, NamedSharding(lmesh, P("data"))),
        )
        plan = coarse.diagnostics.plan(tree, lmesh, cfg)
        info[scheme] = {
            "predicted_s": predict_hosts_sync_s(plan, topo, hosts),
            "predicted_host_only_s": predict_plan_sync_s(plan, topo),
            "bound_host_only_s": link_bound(plan, topo).seconds,
            "inter_host_bytes": inter_host_bytes(plan, hosts),
            "inter_host_s": topo.inter_host_s(inter_host_bytes(plan, hosts)),
            "routes": str(cfg.routes),
        }
    for f, t in impls.values():  # compile, warm up
        jax.block_until_ready(f(t))
    times = _time(impls, rounds, align=True)
    med = medians(times)
    result = {
        "processes": hosts,
        "workers_per_process": P_LOCAL,
        "bytes_per_worker": sum(x.nbytes // P_LOCAL for x in local.values()),
        "rounds": rounds,
        "time_scale": SYNC_SCALE,
        "inter_host_gbps": topo.inter_host_gbps,
        "inter_host_us": topo.inter_host_us,
        "median_s": med,
        "all_s": times,
        "schemes": info,
    }
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    assert initialize(), "run me with python -m coarse_jax.launch"
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    if len(sys.argv) > 2 and sys.argv[2] == "emulated":
        emulated(rounds)
        return
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

    wmesh = Mesh(mesh.devices[:, 0, :], axes)  # the same 8 workers, on axes ("host", "data")
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
    times = _time(impls, rounds)
    med = medians(times)
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
