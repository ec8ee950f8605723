"""COARSE(2:1) beside DENSE, AllReduce and COARSE(1:1) on emulated V100 links (paper Fig. 16(d)).

One run, 4 workers, the "v100" preset slowed x300, on the ResNet-50 (97.5 MiB)
and BERT-base (417.7 MiB) gradient trees:

* DENSE: every worker pushes to one proxy, no ring: ``make_mesh(4, proxies=1)``,
  5 devices;
* AllReduce: the worker ring over the whole tree; it uses no proxy (4 devices);
* COARSE(1:1): ``make_mesh(4)``, 8 devices; COARSE(2:1): ``make_mesh(4, proxies=2)``,
  6 devices. Each COARSE's routes, threshold and shard size come from a profile
  of its own mesh on the same links (`coarse.diagnostics.profile` + `Config.from_profile`).

Per scheme and tree: the runtime's simulated time on the virtual clock (exact,
repeatable; host copies take no simulated time), `predict_plan_sync_s`, the
links' bound (`link_bound`) and what binds it; on the ResNet-50 tree also the
wall time on the real clock (the links really sleep; median of 2 rounds).
Memory per proxy is `coarse.diagnostics.memory_report`'s proxy row for a
`coarse.value_and_update` (adam) step on the tree: the runtime's session
storage plus the master parameters and optimizer state the proxy holds.

Run: ``pytest -q -s -p no:cacheprovider benchmarks/test_shared_proxies.py``
from outside the repository (about 4 minutes here).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from common.clock import median_s
from model_shapes import bert_base_tree, resnet50_tree

import coarse_jax as coarse
from coarse_jax.cli import schemes
from coarse_jax.perf_model import link_bound, predict_plan_sync_s

WORKERS = 4
SCALE = 300.0
TREES = {"ResNet-50": resnet50_tree, "BERT-base": bert_base_tree}
# scheme -> (proxies in its mesh, devices it uses, schemes.scheme_config name)
SCHEMES = {
    "DENSE": (1, WORKERS + 1, "dense"),
    "AllReduce": (WORKERS, WORKERS, "allreduce"),
    "COARSE(1:1)": (WORKERS, 2 * WORKERS, "coarse"),
    "COARSE(2:1)": (WORKERS // 2, WORKERS + WORKERS // 2, "coarse"),
}


def _mesh(proxies: int) -> Any:
    cpu = jax.devices("cpu")
    return coarse.make_mesh(WORKERS, proxies, devices=cpu[:WORKERS] + cpu[4 : 4 + proxies])


def _config(proxies: int, clock: str) -> coarse.Config:
    """COARSE on this mesh, planned from a profile of its own links."""
    probe = coarse.Topology.preset("v100", WORKERS, proxies=proxies, time_scale=50, clock="virtual")
    prof = coarse.diagnostics.profile(
        _mesh(proxies), topology=probe, sizes=tuple(4**k for k in range(5, 12))
    )
    topo = coarse.Topology.preset("v100", WORKERS, proxies=proxies, time_scale=SCALE, clock=clock)
    return coarse.Config.from_profile(prof, topology=topo)


def _proxy_memory(mesh: Any, cfg: coarse.Config, tree: Any) -> int:
    opt = coarse.optim.adam(1e-3)

    def loss(params: Any, x: jax.Array) -> jax.Array:
        return sum(jnp.vdot(v, v) for v in jax.tree.leaves(params)) * jnp.mean(x)

    @coarse.sync(mesh, config=dataclasses.replace(cfg, topology=None))
    def step(params: Any, x: jax.Array) -> Any:
        value, params = coarse.value_and_update(loss, opt)(params, x)
        return params, value

    report = coarse.diagnostics.memory_report(
        step, tree, jax.ShapeDtypeStruct((WORKERS,), jnp.float32)
    )
    return report.proxy_bytes


@pytest.mark.timeout(1800)
def test_coarse_two_to_one_beside_the_paper_schemes() -> None:
    configs = {
        (q, clock): _config(q, clock) for q in (1, 2, WORKERS) for clock in ("virtual", "real")
    }
    rows = []
    for tree_name, make_tree in TREES.items():
        tree = make_tree()
        nbytes = sum(math.prod(s.shape) * s.dtype.itemsize for s in jax.tree.leaves(tree))
        for name, (q, devices, kind) in SCHEMES.items():
            mesh = _mesh(q)
            virtual = schemes.scheme_config(kind, configs[q, "virtual"], WORKERS)
            simulated = schemes.time_sync(mesh, tree, virtual, reps=1)
            plan = coarse.diagnostics.plan(tree, mesh, virtual)
            predicted = predict_plan_sync_s(plan, virtual.topology)
            bound = link_bound(plan, virtual.topology)
            wall = None
            if tree_name == "ResNet-50":
                real = schemes.scheme_config(kind, configs[q, "real"], WORKERS)
                run, _ = schemes.sync_step(mesh, tree, real)
                wall = median_s(run, 2)
            memory = _proxy_memory(mesh, virtual, tree) if kind != "allreduce" else 0
            rows.append((tree_name, name, devices, simulated, wall, predicted, bound, memory))
            jax.clear_caches()
        print(f"\n{tree_name}: {nbytes / 2**20:.1f} MiB per worker, 4 workers, v100 x{SCALE:g}")
    print(
        f"\n{'tree':<10} {'scheme':<12} {'devices':>7} {'simulated ms':>13} {'real ms':>9} "
        f"{'model ms':>9} {'bound ms':>9} {'MiB/proxy':>10}  bound set by"
    )
    for tree_name, name, devices, simulated, wall, predicted, bound, memory in rows:
        real = f"{wall * 1e3:9.1f}" if wall is not None else f"{'-':>9}"
        print(
            f"{tree_name:<10} {name:<12} {devices:>7} {simulated * 1e3:>13.1f} {real} "
            f"{predicted * 1e3:>9.1f} {bound.seconds * 1e3:>9.1f} {memory / 2**20:>10.1f}  "
            f"{bound.binding}"
        )
        # The model is the runtime's schedule: on the virtual clock they agree.
        assert abs(simulated - predicted) <= 1e-6 * predicted, (tree_name, name)
