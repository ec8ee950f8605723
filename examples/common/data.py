"""The comparison examples' data: one batch per step, made or loaded, then placed on a mesh.

Batches are numpy dicts with leading axes ``(steps, batch_size)``; both
implementations see the same ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import NamedSharding

Batch = dict[str, Any]
Load = Callable[[str, int, int, int], tuple[Batch, Batch]]
Synthesize = Callable[[Any, int], tuple[Batch, Batch]]


def load_or_synthesize(
    config: Any, load: Load | None, synthesize: Synthesize
) -> tuple[Batch, Batch]:
    """Train batches with leading axes ``(steps, batch_size)`` and a flat test set.

    ``load(data_dir, n, eval_size, seed)`` reads a local dataset when
    ``config.data_dir`` is set (nothing is ever downloaded; None: the example
    has synthetic data only); otherwise ``synthesize(config, n)`` makes the data.
    """
    n = config.steps * config.batch_size
    if config.data_dir:
        if load is None:
            raise ValueError(
                f"data_dir {config.data_dir!r} given, but this example has synthetic data only."
            )
        train, test = load(config.data_dir, n, config.eval_size, config.seed)
    else:
        train, test = synthesize(config, n)
    train = {k: v.reshape(config.steps, config.batch_size, *v.shape[1:]) for k, v in train.items()}
    return train, test


def first_batch(train: Batch) -> Batch:
    """Step 0's batch."""
    return {k: v[0] for k, v in train.items()}


def place_batches(train: Batch, sharding: NamedSharding) -> list[Batch]:
    """Places every step's batch on the devices up front, so steps time compute, not copies."""
    steps = len(next(iter(train.values())))
    return [jax.device_put({k: v[i] for k, v in train.items()}, sharding) for i in range(steps)]
