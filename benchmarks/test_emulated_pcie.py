"""COARSE-host, COARSE-devices, AllReduce and DENSE on emulated PCIe boards (issue 38, item 6).

The ResNet-50 and BERT-base gradient trees, 4 workers, on the "pcie4" preset
(`coarse_jax.emulation.pcie_link`: 25 GB/s per x16 link, two workers per root
complex), with 4 proxies (1:1) and 2 proxies (2:1). Each row is the runtime's
time on the emulated links beside `coarse.model.predict_plan_sync_s`'s
prediction for the same plan, from `coarse_jax.cli.proxy_placement` (each
placement routed from a profile of its own mesh).

Clocks:

* ``virtual`` (default): the links' simulated time, exact and independent of
  this host's load; it checks that the bytes the runtime moves, and the order
  it moves them in, are the ones the model counts.
* ``real`` (``COARSE_BENCH_CLOCK=real``): wall time on links slowed x300, host
  noise included; the ResNet-50 tree only.

Times are the links' own (the slowed time divided by 300).

Host work (the proxies' sums and copies) costs no simulated time, on either
placement. Run: ``pytest -q -s benchmarks/test_emulated_pcie.py -p no:cacheprovider``
(a few minutes; not in ``make bench``).
"""

from __future__ import annotations

import dataclasses
import os

import pytest
from model_shapes import bert_base_tree, resnet50_tree

from coarse_jax.cli import proxy_placement as placement

WORKERS = 4
PRESET = "pcie4"
CLOCK = os.environ.get("COARSE_BENCH_CLOCK", "virtual")
TREES = {"resnet50": resnet50_tree, "bert_base": bert_base_tree}
SCALE = 300.0  # the links are slowed this much; the rows are given in the links' own time


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("proxies", [4, 2])
@pytest.mark.parametrize("tree", list(TREES) if CLOCK == "virtual" else ["resnet50"])
def test_placements_on_pcie(tree: str, proxies: int) -> None:
    scaled = placement.compare_placements(
        TREES[tree](), PRESET, WORKERS, proxies, time_scale=SCALE, clock=CLOCK, reps=2
    )
    rows = [
        dataclasses.replace(
            r,
            predicted_s=r.predicted_s / SCALE,
            taken_s=None if r.taken_s is None else r.taken_s / SCALE,
        )
        for r in scaled
    ]
    print(f"\n{tree}, {WORKERS} workers, {proxies} proxies, {PRESET}, {CLOCK} clock, links' time")
    print(placement.table(rows, f"{CLOCK} ms"))
    for r in rows:
        assert r.taken_s is not None
        print(f"  {r.scheme:<15} taken / predicted {r.taken_s / r.predicted_s:.4f}")
    print(placement.favoured(rows, PRESET))
