"""Where a user places a step's inputs: the mesh `coarse.make_mesh` returned, against the workers.

jax's and flax's sharding guides place state and batches on the mesh the user
has: ``NamedSharding(mesh, P())`` and ``NamedSharding(mesh, P("data"))``. The
mesh `coarse.make_mesh` returns is the workers', so that placement must cost
what placing on ``coarse_jax.mesh.workers_mesh(mesh)`` costs (the goal: at most
1.1x). Each case all-reduces (mean) a tree over 4 workers with 4 device
proxies, called with its inputs placed:

* ``mesh``: on the mesh `make_mesh` returned (the natural placement);
* ``workers``: on ``workers_mesh(mesh)``;
* ``two_tier``: the old public mesh, state on both tiers: a step decorated with
  ``two_tier_mesh(mesh)``, its inputs placed on that mesh, so its outputs follow
  onto every proxy's device (what `coarse_jax.mesh.LegacyPlacement` warns of);
* ``pmean``: ``jit(shard_map(pmean))`` over the same 4 devices.

Two trees: ResNet-50's 161 gradient leaves (97.5 MiB) and one 1 KiB leaf. The
cases are interleaved, one call each per round, so load on the machine falls
on all of them alike; the ratios are of medians within one run.

Run: ``pytest -q benchmarks/test_placement.py -p no:cacheprovider -s``.
"""

from __future__ import annotations

import functools
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pytest
from common.clock import interleaved, medians
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse
from coarse_jax.cli.resnet50 import RESNET50_SHAPES
from coarse_jax.mesh import LegacyPlacement, two_tier_mesh, workers_mesh

WORKERS = 4
ROUNDS = {"resnet50": 15, "1KiB": 200}


def _trees() -> dict[str, OrderedDict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    resnet = OrderedDict(
        (name, rng.standard_normal((WORKERS, *shape), dtype=np.float32))
        for name, shape in RESNET50_SHAPES
    )
    small = OrderedDict(w=rng.standard_normal((WORKERS, 256), dtype=np.float32))
    return {"resnet50": resnet, "1KiB": small}


def _mean_of_slices(per_worker: Any) -> Any:
    return coarse.all_reduce(jax.tree.map(lambda x: x[0], per_worker))


def _cases(tree: Any) -> dict[str, tuple[Callable[[Any], Any], Any]]:
    """name -> (step, its inputs placed)."""
    mesh = coarse.make_mesh(workers=WORKERS)
    step = coarse.sync(mesh)(_mean_of_slices)
    full = two_tier_mesh(mesh)
    old_step = coarse.sync(full)(_mean_of_slices)
    pmean_mesh = jax.make_mesh((WORKERS,), ("data",), devices=list(mesh.devices.flat))
    pmean = jax.jit(
        jax.shard_map(
            lambda t: lax.pmean(jax.tree.map(lambda x: x[0], t), "data"),
            mesh=pmean_mesh,
            in_specs=P("data"),
            out_specs=P(),
        )
    )

    def put(m: Any) -> Any:
        return jax.block_until_ready(jax.device_put(tree, NamedSharding(m, P("data"))))

    return {
        "mesh": (step, put(mesh)),
        "workers": (step, put(workers_mesh(mesh))),
        "two_tier": (old_step, put(full)),
        "pmean": (pmean, put(pmean_mesh)),
    }


@pytest.mark.parametrize("tree_name", list(ROUNDS))
def test_the_natural_placement_costs_what_the_workers_cost(benchmark: Any, tree_name: str) -> None:
    tree = _trees()[tree_name]
    cases = _cases(tree)
    want = {k: v.mean(axis=0) for k, v in tree.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LegacyPlacement)  # the two-tier case's, measured here
        for fn, x in cases.values():  # compile, warm up and check outside the timing
            out = jax.block_until_ready(fn(x))
            key = next(iter(want))
            np.testing.assert_allclose(np.asarray(out[key]), want[key], rtol=1e-5, atol=1e-6)
            jax.block_until_ready(fn(x))
    runs = {name: functools.partial(fn, x) for name, (fn, x) in cases.items()}
    times = benchmark.pedantic(interleaved, args=(runs, ROUNDS[tree_name]), rounds=1, iterations=1)
    median = medians(times)
    ratio = {name: median[name] / median["workers"] for name in median}
    benchmark.extra_info.update({f"{k}_ms": v * 1e3 for k, v in median.items()})
    benchmark.extra_info.update({f"{k}_over_workers": v for k, v in ratio.items()})
    print(
        f"\n{tree_name}: median ms "
        + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in median.items())
        + " | over workers: "
        + ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items())
    )
