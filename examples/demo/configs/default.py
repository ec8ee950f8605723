"""Default hyperparameters for the coarse_jax demo (a plain dataclass, no ml_collections)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """Everything `train.train_and_evaluate` needs.

    Attributes:
      workers: data-parallel workers; coarse also uses as many proxies, so the
        run needs ``2 * workers`` devices.
      steps: optimizer steps per implementation.
      batch_size: global batch size, split evenly over the workers.
      input_dim: features per synthetic example.
      hidden: widths of the MLP's hidden layers.
      num_classes: classes of the synthetic teacher.
      label_noise: scale of the Gaussian noise added to the teacher's logits,
        so the task is not perfectly separable.
      eval_size: held-out examples used for the final accuracy.
      learning_rate: SGD learning rate.
      momentum: SGD momentum. SGD rather than Adam: Adam divides by
        sqrt(second moment), which blows float32 summation-order rounding in
        near-zero gradients up to full-size updates; after ~100 steps its loss
        curves drift apart by ~1e-3 even between two valid all-reduce orders,
        which would hide whether coarse computes the same mean as pmean.
      seed: seeds both the numpy data generator and the parameter init.
      shard_bytes: coarse `Config.shard_bytes`; small enough that the biggest
        kernel is cut into several shards.
      leading_layers: how many of the first Dense layers are reduced among the
        workers (coarse dual sync); their size becomes `Config.leading_bytes`.
      timing_calls: calls per median when timing the gradient sync alone.
    """

    workers: int = 4
    steps: int = 300
    batch_size: int = 128
    input_dim: int = 64
    hidden: tuple[int, ...] = (256, 256)
    num_classes: int = 10
    label_noise: float = 0.5
    eval_size: int = 2048
    learning_rate: float = 0.01
    momentum: float = 0.9
    seed: int = 0
    shard_bytes: int = 64 << 10
    leading_layers: int = 1
    timing_calls: int = 20


def get_config() -> DemoConfig:
    """Returns the default demo configuration."""
    return DemoConfig()
