"""Running and timing: the training loop that times every step, and the sync timed alone.

Times are `common.clock`'s: wall clock around ``jax.block_until_ready``; the
first call compiles and is not counted.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from typing import Any

import jax
import numpy as np
from flax.training import train_state
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from tqdm import tqdm

import coarse_jax as coarse
from common import clock, steps

Batch = dict[str, Any]


@dataclasses.dataclass
class RunResult:
    """One implementation's training run."""

    state: train_state.TrainState
    losses: list[float]
    step_times_s: list[float]  # the first (compiling) step excluded

    @property
    def median_step_s(self) -> float:
        return statistics.median(self.step_times_s) if self.step_times_s else math.nan


def train(
    step: steps.StepFn, state: train_state.TrainState, data: list[Batch], desc: str
) -> RunResult:
    """Runs ``step`` over ``data`` with a progress bar, timing every step."""
    losses, times = [], []
    for batch in tqdm(data, desc=desc, unit="step", leave=True):
        (state, loss), seconds = clock.timed(step, state, batch)
        times.append(seconds)
        losses.append(float(loss))
    return RunResult(state, losses, times[1:])


def time_syncs(
    impls: tuple[str, ...],
    params: Any,
    coarse_mesh: Mesh,
    cfg: coarse.Config,
    calls: int,
    seed: int,
) -> dict[str, float]:
    """Median seconds of each implementation's gradient sync alone (`steps.sync_only`).

    The tree has ``params``' shapes and different Gaussian values on every
    worker (numpy, seeded with ``seed``).
    """
    p = coarse_mesh.shape["data"]
    rng = np.random.default_rng(seed)
    per_worker = jax.tree.map(lambda x: rng.normal(size=(p, *x.shape)).astype(np.float32), params)
    times = {}
    for impl in impls:
        mesh = steps.mesh_for(impl, coarse_mesh)
        placed = jax.device_put(per_worker, NamedSharding(mesh, P("data")))
        sync = steps.sync_only(mesh, impl, cfg)
        times[impl] = clock.median_s(functools.partial(sync, placed), calls, warmup=3)
    return times
