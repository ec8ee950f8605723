"""Default hyperparameters for the coarse_jax demo (`common.config.BaseConfig` plus the MLP's)."""

from __future__ import annotations

import dataclasses
import os
import sys

# examples/ onto the path for the shared `common` package (main.py does this
# too; here it lets this module be imported on its own).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from common.config import BaseConfig


@dataclasses.dataclass(frozen=True)
class DemoConfig(BaseConfig):
    """Everything `train.train_and_evaluate` needs: `BaseConfig` (workers,
    steps, SGD and why not Adam, coarse settings, flags) and the fields below.

    Attributes:
      input_dim: features per synthetic example.
      hidden: widths of the MLP's hidden layers.
      num_classes: classes of the synthetic teacher.
      label_noise: scale of the Gaussian noise added to the teacher's logits,
        so the task is not perfectly separable.

    Defaults set here: ``steps`` 300, ``batch_size`` 128, ``eval_size``
    2048, ``leading_modules`` 1 (the first Dense layer), ``shard_bytes`` 64 KiB
    (the biggest kernel is cut into several shards) and ``sync_timing_calls``
    20 (the demo times the gradient sync alone).
    """

    steps: int = 300
    batch_size: int = 128
    eval_size: int = 2048
    shard_bytes: int = 64 << 10
    leading_modules: int = 1
    sync_timing_calls: int = 20
    input_dim: int = 64
    hidden: tuple[int, ...] = (256, 256)
    num_classes: int = 10
    label_noise: float = 0.5


def get_config() -> DemoConfig:
    """Returns the default demo configuration."""
    return DemoConfig()
