"""Default hyperparameters for the ResNet-18 example (`common.config.BaseConfig` plus the net's)."""

from __future__ import annotations

import dataclasses
import os
import sys

# examples/ onto the path for the shared `common` package (main.py does this
# too; here it lets this module be imported on its own).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from common.config import BaseConfig


@dataclasses.dataclass(frozen=True)
class ResNet18Config(BaseConfig):
    """Everything `train.train_and_evaluate` needs: `BaseConfig` (workers,
    steps, SGD and why not Adam, coarse settings, flags) and the fields below.

    Attributes:
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

    Defaults set here: ``learning_rate`` 0.02, kept modest: larger steps
    amplify float32 rounding differences between two all-reduce orders even
    with GELU (noise floor over 200 steps: 0.02: 1.6e-6, 0.05: 5.2e-2; 0.01
    barely learns: loss 2.32 -> 2.23). ``shard_bytes`` 64 KiB (the last
    stage's kernels are cut into several shards), ``leading_modules`` 2
    (flatten order: ``layer00_stem``, ``layer00_stem_norm``,
    ``layer01_block``, ...: the stem). ``data_dir``: a directory holding
    CIFAR-10's python pickles (data_batch_1..5, test_batch; e.g.
    ``cifar-10-batches-py``).
    """

    learning_rate: float = 0.02
    shard_bytes: int = 64 << 10
    leading_modules: int = 2
    width: int = 8
    stage_sizes: tuple[int, ...] = (2, 2, 2, 2)
    norm_groups: int = 4
    activation: str = "gelu"
    num_classes: int = 10
    image_shape: tuple[int, int, int] = (32, 32, 3)
    template_scale: float = 1.0
    template_block: int = 4


def get_config() -> ResNet18Config:
    """Returns the default ResNet-18 configuration."""
    return ResNet18Config()
