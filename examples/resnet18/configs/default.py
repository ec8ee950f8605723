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
      activation: the nonlinearity (a `flax.linen` function name). GELU, not
        ReLU: ReLU's derivative jumps at 0, so when float32 rounding of the
        all-reduce moves a pre-activation across 0 the two runs' gradients
        differ by a whole example's contribution, not by rounding; from then
        on the curves separate. Measured over 200 steps (pmean against pmean
        with the worker sum reversed, --noise-floor): ReLU 1.1e-3 relative,
        GELU 1.6e-6.
      num_classes: classes (10, as CIFAR-10).
      image_shape: (height, width, channels) of an example (CIFAR's).
      template_scale: amplitude of the class template added to the synthetic
        images' unit Gaussian noise (`train.template_images`).
      template_block: the templates are random on a grid this many times
        coarser than the image, upsampled (blocky, so a 3x3 conv sees them).
      eval_size: held-out examples used for the final accuracy.
      learning_rate: SGD learning rate. Kept modest: larger steps amplify
        float32 rounding differences between two all-reduce orders even with
        GELU (noise floor over 200 steps: 0.02: 1.6e-6, 0.05: 5.2e-2; 0.01
        barely learns: loss 2.32 -> 2.23).
      momentum: SGD momentum. SGD rather than Adam: Adam divides by
        sqrt(second moment), which blows float32 summation-order rounding in
        near-zero gradients up to full-size updates; its loss curves then drift
        apart by ~1e-3 even between two valid all-reduce orders, which would
        hide whether coarse computes the same mean as pmean.
      seed: seeds the numpy data generator, the templates and the parameter init.
      shard_bytes: coarse `Config.shard_bytes`; the last stage's kernels are
        cut into several shards.
      leading_modules: how many of the first modules in flatten order
        (``layer00_stem``, ``layer00_stem_norm``, ``layer01_block``, ...) are
        reduced among the workers (dual sync): 2 is the stem.
      impl: "coarse", "pmean" or "both" (set by main.py's --impl).
      noise_floor: with "both", also train pmean with the gradients summed in
        the reverse worker order and compare step-0 gradients (--noise-floor;
        see `common.trainer.run_comparison`).
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
    activation: str = "gelu"
    num_classes: int = 10
    image_shape: tuple[int, int, int] = (32, 32, 3)
    template_scale: float = 1.0
    template_block: int = 4
    eval_size: int = 512
    learning_rate: float = 0.02
    momentum: float = 0.9
    seed: int = 0
    shard_bytes: int = 64 << 10
    leading_modules: int = 2
    worker_compute: str = (
        "cond"  # coarse.Config.worker_compute ("all" is faster for conv nets on CPU)
    )
    impl: str = "both"
    noise_floor: bool = False
    data_dir: str | None = None
    plot: bool = False


def get_config() -> ResNet18Config:
    """Returns the default ResNet-18 configuration."""
    return ResNet18Config()
