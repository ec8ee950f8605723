"""Default hyperparameters for the CNN example (a frozen dataclass, no ml_collections)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class CNNConfig:
    """Everything `train.train_and_evaluate` needs.

    Attributes:
      workers: data-parallel workers; coarse also uses as many proxies, so the
        run needs ``2 * workers`` devices.
      steps: optimizer steps per implementation.
      batch_size: global batch size, split evenly over the workers.
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
      eval_size: held-out examples used for the final accuracy.
      learning_rate: SGD learning rate.
      momentum: SGD momentum. SGD rather than Adam: Adam divides by
        sqrt(second moment), which blows float32 summation-order rounding in
        near-zero gradients up to full-size updates; its loss curves then drift
        apart by ~1e-3 even between two valid all-reduce orders, which would
        hide whether coarse computes the same mean as pmean.
      seed: seeds the numpy data generator, the teacher and the parameter init.
      shard_bytes: coarse `Config.shard_bytes`; small enough that the biggest
        kernel (the hidden Dense layer) is cut into several shards.
      leading_modules: how many of the first modules (flatten order: Conv_0,
        Conv_1, Dense_0, ...) are reduced among the workers (dual sync).
      impl: "coarse", "pmean" or "both" (set by main.py's --impl).
      noise_floor: with "both", also train pmean with the gradients summed in
        the reverse worker order and compare step-0 gradients (--noise-floor;
        see `common.trainer.run_comparison`).
      data_dir: a directory holding Keras' ``mnist.npz`` (x_train, y_train,
        x_test, y_test); None: synthetic data. Nothing is downloaded.
      plot: write ``loss.png`` into the workdir.
    """

    workers: int = 4
    steps: int = 200
    batch_size: int = 64
    features: tuple[int, ...] = (16, 32)
    dense: int = 64
    activation: str = "gelu"
    num_classes: int = 10
    image_shape: tuple[int, int, int] = (28, 28, 1)
    label_noise: float = 0.5
    eval_size: int = 1024
    learning_rate: float = 0.01
    momentum: float = 0.9
    seed: int = 0
    shard_bytes: int = 128 << 10
    leading_modules: int = 1
    worker_compute: str = (
        "cond"  # coarse.Config.worker_compute ("all" is faster for conv nets on CPU)
    )
    impl: str = "both"
    noise_floor: bool = False
    data_dir: str | None = None
    plot: bool = False


def get_config() -> CNNConfig:
    """Returns the default CNN configuration."""
    return CNNConfig()
