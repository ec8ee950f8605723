"""Trains one Flax MLP twice: with coarse_jax and with plain ``shard_map`` + ``lax.pmean``.

Both runs start from the same parameters, see the same synthetic batches and
use the same optax optimizer, so their loss curves must agree to float32
rounding. The demo also times the gradient synchronization alone for both
implementations (``sync_timing_calls``). The comparison, timing and metrics
are `common.compare.run_comparison`'s, as in the other examples.

``XLA_FLAGS=--xla_force_host_platform_device_count=8`` must be set before jax
is imported (``main.py`` does that) so that the CPU offers 2 * workers devices.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

# examples/ onto the path for the shared `common` package (main.py does this
# too; here it lets train.py be imported on its own).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from common import classifier, compare, data

Batch = dict[str, Any]


class MLP(nn.Module):
    """A ReLU multilayer perceptron classifier."""

    hidden: Sequence[int]
    num_classes: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.num_classes)(x)


# ----------------------------------------------------------------------------- data


def teacher_vectors(config: Any, n_train: int) -> tuple[Batch, Batch]:
    """``n_train`` training and ``eval_size`` test examples labelled by a fixed random teacher.

    Gaussian vectors of ``config.input_dim`` features; the label is the argmax
    of a fixed random linear map plus ``config.label_noise`` times Gaussian
    noise. Deterministic in ``config.seed``.
    """
    rng = np.random.default_rng(config.seed)
    teacher = rng.normal(size=(config.input_dim, config.num_classes)) / np.sqrt(config.input_dim)

    def sample(n: int) -> Batch:
        x = rng.normal(size=(n, config.input_dim))
        logits = x @ teacher + config.label_noise * rng.normal(size=(n, config.num_classes))
        return {"x": x.astype(np.float32), "y": logits.argmax(-1).astype(np.int32)}

    return sample(n_train), sample(config.eval_size)


# ----------------------------------------------------------------------------- training


def train_and_evaluate(config: Any, workdir: str) -> dict[str, Any]:
    """Trains the MLP with coarse and/or pmean, compares the loss curves and times both.

    Args:
      config: a `configs.default.DemoConfig`.
      workdir: directory for ``metrics.jsonl`` (and ``loss.png``), created if missing.

    Returns:
      `common.compare.run_comparison`'s summary; ``eval`` holds the test
      accuracy, ``median_sync_s`` the sync-only times.
    """
    model = MLP(hidden=config.hidden, num_classes=config.num_classes)
    params = model.init(jax.random.key(config.seed), jnp.zeros((1, config.input_dim)))
    train, test = data.load_or_synthesize(config, None, teacher_vectors)
    return compare.run_comparison(
        config,
        workdir,
        name="demo",
        apply_fn=model.apply,
        params=params,
        make_loss=classifier.classification_loss,
        train_data=train,
        evaluate=classifier.accuracy(model.apply, test),
    )
