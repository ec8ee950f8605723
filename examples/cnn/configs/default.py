"""Default hyperparameters for the CNN example (`common.config.BaseConfig` plus the CNN's)."""

from __future__ import annotations

import dataclasses
import os
import sys

# examples/ onto the path for the shared `common` package (main.py does this
# too; here it lets this module be imported on its own).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from common.config import BaseConfig


@dataclasses.dataclass(frozen=True)
class CNNConfig(BaseConfig):
    """Everything `train.train_and_evaluate` needs: `BaseConfig` (workers,
    steps, SGD and why not Adam, coarse settings, flags) and the fields below.

    Attributes:
      features: output channels of the 3x3 convolutions (each followed by the
        activation and 2x2 average pooling).
      dense: width of the hidden Dense layer before the classifier.
      activation: the nonlinearity (a `flax.linen` function name). GELU, not
        ReLU: ReLU's derivative jumps at 0, so when float32 rounding of the
        all-reduce moves a pre-activation across 0 the two runs' gradients
        differ by a whole example's contribution, not by rounding; from then
        on the curves separate. Measured over 200 steps (pmean against pmean
        with the worker sum reversed, --noise-floor): ReLU 6.0e-3 relative,
        GELU 2.1e-7 (also at learning rate 0.03).
      num_classes: classes (10, as MNIST).
      image_shape: (height, width, channels) of an example (MNIST's).
      label_noise: scale of the Gaussian noise on the synthetic teacher's
        logits, so the task is not perfectly separable.

    Defaults set here: ``batch_size`` 64, ``eval_size`` 1024,
    ``shard_bytes`` 128 KiB (the biggest kernel, the hidden Dense layer, is
    cut into several shards), ``leading_modules`` 1 (flatten order: Conv_0,
    Conv_1, Dense_0, ...). ``data_dir``: a directory holding Keras'
    ``mnist.npz`` (x_train, y_train, x_test, y_test).
    """

    batch_size: int = 64
    eval_size: int = 1024
    shard_bytes: int = 128 << 10
    leading_modules: int = 1
    features: tuple[int, ...] = (16, 32)
    dense: int = 64
    activation: str = "gelu"
    num_classes: int = 10
    image_shape: tuple[int, int, int] = (28, 28, 1)
    label_noise: float = 0.5


def get_config() -> CNNConfig:
    """Returns the default CNN configuration."""
    return CNNConfig()
