"""Default hyperparameters for the ResNet-18 example (a frozen dataclass, no ml_collections)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ResNet18Config:
    """Everything `train.train_and_evaluate` needs.

    Attributes:
      workers: data-parallel workers; coarse also uses as many proxies, so the
        run needs ``2 * workers`` devices.
      steps: optimizer steps per implementation.
      batch_size: global batch size, split evenly over the workers.
      width: channels of the first stage; stages have width * (1, 2, 4, 8)
        (ResNet-18 proper: 64). 8 keeps 200 coarse steps on a 2-core CPU
        near 2 minutes: XLA:CPU runs the convolutions inside coarse's
        worker-only ``lax.cond`` about 10x slower than outside one (width 16:
        ~1.5 s per coarse step against ~0.1 s for pmean).
      stage_sizes: basic blocks per stage ([2, 2, 2, 2] is ResNet-18).
      norm_groups: groups of the GroupNorm layers (must divide ``width``).
      num_classes: classes (10, as CIFAR-10).
      image_shape: (height, width, channels) of an example (CIFAR's).
      label_noise: scale of the Gaussian noise on the synthetic teacher's logits.
      eval_size: held-out examples used for the final accuracy.
      learning_rate: SGD learning rate. Kept modest: a deep net amplifies
        float32 rounding differences between the two all-reduces more the
        larger the steps are.
      momentum: SGD momentum. SGD rather than Adam: Adam divides by
        sqrt(second moment), which blows float32 summation-order rounding in
        near-zero gradients up to full-size updates; its loss curves then drift
        apart by ~1e-3 even between two valid all-reduce orders, which would
        hide whether coarse computes the same mean as pmean.
      seed: seeds the numpy data generator, the teacher and the parameter init.
      shard_bytes: coarse `Config.shard_bytes`; the last stage's kernels are
        cut into several shards.
      leading_modules: how many of the first modules in flatten order
        (``layer00_stem``, ``layer00_stem_norm``, ``layer01_block``, ...) are
        reduced among the workers (dual sync): 2 is the stem.
      impl: "coarse", "pmean" or "both" (set by main.py's --impl).
      data_dir: a directory holding CIFAR-10's python pickles (data_batch_1..5,
        test_batch; e.g. ``cifar-10-batches-py``); None: synthetic data.
        Nothing is downloaded.
      plot: write ``loss.png`` into the workdir.
    """

    workers: int = 4
    steps: int = 200
    batch_size: int = 32
    width: int = 8
    stage_sizes: tuple[int, ...] = (2, 2, 2, 2)
    norm_groups: int = 4
    num_classes: int = 10
    image_shape: tuple[int, int, int] = (32, 32, 3)
    label_noise: float = 0.5
    eval_size: int = 512
    learning_rate: float = 0.02
    momentum: float = 0.9
    seed: int = 0
    shard_bytes: int = 64 << 10
    leading_modules: int = 2
    worker_compute: str = "cond"  # coarse.Config.worker_compute ("all" is faster for conv nets on CPU)
    impl: str = "both"
    data_dir: str | None = None
    plot: bool = False


def get_config() -> ResNet18Config:
    """Returns the default ResNet-18 configuration."""
    return ResNet18Config()
