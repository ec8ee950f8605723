"""Trains a small Flax CNN classifier with coarse_jax and with ``shard_map`` + ``lax.pmean``.

MNIST-sized inputs (28x28x1, 10 classes). By default the data are synthetic
and deterministic: Gaussian images labelled by a fixed random teacher (a
linear map of the 7x7-pooled image plus noise), so the loss goes down. With
``config.data_dir`` the images come from a local ``mnist.npz`` instead.
Both runs share the initial parameters and the batches (see `common.compare`).
"""

from __future__ import annotations

import os
import sys
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


class CNN(nn.Module):
    """Conv(3x3) + activation + 2x2 average pool per entry of ``features``, then Dense,
    activation, Dense.

    ``activation`` names a `flax.linen` function ("gelu", "relu", ...).
    """

    features: tuple[int, ...]
    dense: int
    num_classes: int
    activation: str = "gelu"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        act = getattr(nn, self.activation)
        for f in self.features:
            x = act(nn.Conv(f, (3, 3))(x))
            x = nn.avg_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape(x.shape[0], -1)
        x = act(nn.Dense(self.dense)(x))
        return nn.Dense(self.num_classes)(x)


# ----------------------------------------------------------------------------- data


def load_mnist(data_dir: str, n_train: int, eval_size: int, seed: int) -> tuple[Batch, Batch]:
    """MNIST from ``<data_dir>/mnist.npz`` (Keras' layout), standardized; never downloads."""
    path = os.path.join(data_dir, "mnist.npz")
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} not found. Fix: put Keras' mnist.npz (keys x_train, y_train, x_test, "
            "y_test) there, or leave out --data-dir for synthetic data."
        )
    with np.load(path) as f:
        x_train, y_train, x_test, y_test = (
            f[k] for k in ("x_train", "y_train", "x_test", "y_test")
        )

    def prep(x: np.ndarray) -> np.ndarray:
        return ((x.astype(np.float32) / 255.0 - 0.1307) / 0.3081)[..., None]

    # A fixed permutation, repeated over epochs as needed: the same batches for both runs.
    rng = np.random.default_rng(seed)
    order = np.concatenate(
        [rng.permutation(len(x_train)) for _ in range(-(-n_train // len(x_train)))]
    )[:n_train]
    return (
        {"x": prep(x_train[order]), "y": y_train[order].astype(np.int32)},
        {"x": prep(x_test[:eval_size]), "y": y_test[:eval_size].astype(np.int32)},
    )


def teacher_images(config: Any, n_train: int) -> tuple[Batch, Batch]:
    """``n_train`` training and ``eval_size`` test images labelled by a fixed random teacher.

    Gaussian images of ``config.image_shape``; the label is the argmax of a
    random linear map of the 4x4-pooled image plus ``config.label_noise``, so
    the loss can go down. Deterministic in ``config.seed``.
    """
    rng = np.random.default_rng(config.seed)
    h, w, c = config.image_shape
    pooled = (h // 4) * (w // 4) * c
    teacher = rng.normal(size=(pooled, config.num_classes)) / np.sqrt(pooled)

    def sample(n: int) -> Batch:
        x = rng.normal(size=(n, h, w, c)).astype(np.float32)
        feats = x.reshape(n, h // 4, 4, w // 4, 4, c).mean((2, 4)).reshape(n, -1) * 4.0
        logits = feats @ teacher + config.label_noise * rng.normal(size=(n, config.num_classes))
        return {"x": x, "y": logits.argmax(-1).astype(np.int32)}

    return sample(n_train), sample(config.eval_size)


# ----------------------------------------------------------------------------- training


def train_and_evaluate(config: Any, workdir: str) -> dict[str, Any]:
    """Trains the CNN with coarse and/or pmean, compares the loss curves and times the steps.

    Args:
      config: a `configs.default.CNNConfig`.
      workdir: directory for ``metrics.jsonl`` (and ``loss.png``), created if missing.

    Returns:
      `common.compare.run_comparison`'s summary; ``eval`` holds the test accuracy.
    """
    model = CNN(
        features=config.features,
        dense=config.dense,
        num_classes=config.num_classes,
        activation=config.activation,
    )
    params = model.init(jax.random.key(config.seed), jnp.zeros((1, *config.image_shape)))
    train, test = data.load_or_synthesize(config, load_mnist, teacher_images)
    return compare.run_comparison(
        config,
        workdir,
        name="cnn",
        apply_fn=model.apply,
        params=params,
        make_loss=classifier.classification_loss,
        train_data=train,
        evaluate=classifier.accuracy(model.apply, test),
    )
