"""Trains a ResNet-18-style Flax CNN with coarse_jax and with ``shard_map`` + ``lax.pmean``.

CIFAR-sized inputs (32x32x3, 10 classes). By default the data are synthetic
and deterministic: Gaussian noise plus a randomly shifted, fixed random
template of the image's class (`template_images`). With ``config.data_dir`` the
images come from local CIFAR-10 python pickles instead. Both runs share the
initial parameters and the batches (see `common.compare`).

Normalization is GroupNorm, not BatchNorm. BatchNorm's running statistics
are a second, non-differentiated state collection ("batch_stats") that every
step must update and keep replicated (each worker sees another batch, so it
would need its own mean over workers), which a plain ``TrainState`` of params
does not carry; and its batch statistics change with the per-worker batch
size. GroupNorm normalizes each example on its own: the model is a pure
function of (params, x) and both implementations train exactly the same thing.
"""

from __future__ import annotations

import os
import pickle
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


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with GroupNorm and a residual connection (1x1 projection if needed)."""

    features: int
    strides: int
    groups: int
    activation: str = "gelu"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        act = getattr(nn, self.activation)
        y = nn.Conv(self.features, (3, 3), (self.strides, self.strides), use_bias=False)(x)
        y = act(nn.GroupNorm(num_groups=self.groups)(y))
        y = nn.Conv(self.features, (3, 3), use_bias=False)(y)
        # Zero-initialized scale: each block starts as the identity (as in
        # "Bag of Tricks"), which keeps the early steps of a deep net calm.
        y = nn.GroupNorm(num_groups=self.groups, scale_init=nn.initializers.zeros)(y)
        if x.shape != y.shape:
            x = nn.Conv(self.features, (1, 1), (self.strides, self.strides), use_bias=False)(x)
            x = nn.GroupNorm(num_groups=self.groups)(x)
        return act(x + y)


class ResNet(nn.Module):
    """CIFAR-style ResNet: 3x3 stem, stages of basic blocks, global average pool, Dense.

    ``activation`` names a `flax.linen` function ("gelu", "relu", ...).
    """

    stage_sizes: tuple[int, ...]
    width: int
    groups: int
    num_classes: int
    activation: str = "gelu"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        # Names sort in layer order ("layer00_stem" < "layer01_block" < ...), so the
        # flatten order coarse pushes in (its reverse) and splits the leading
        # layers from is the network's order.
        x = nn.Conv(self.width, (3, 3), use_bias=False, name="layer00_stem")(x)
        act = getattr(nn, self.activation)
        x = act(nn.GroupNorm(num_groups=self.groups, name="layer00_stem_norm")(x))
        k = 0
        for i, blocks in enumerate(self.stage_sizes):
            for j in range(blocks):
                k += 1
                strides = 2 if i > 0 and j == 0 else 1
                x = BasicBlock(
                    self.width * 2**i,
                    strides,
                    self.groups,
                    self.activation,
                    name=f"layer{k:02d}_block",
                )(x)
        x = x.mean(axis=(1, 2))
        return nn.Dense(self.num_classes, name=f"layer{k + 1:02d}_head")(x)


# ----------------------------------------------------------------------------- data


def _unpickle(path: str) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as f:
        d = pickle.load(f, encoding="bytes")
    x = np.asarray(d[b"data"], np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return x, np.asarray(d[b"labels"], np.int32)


def load_cifar10(data_dir: str, n_train: int, eval_size: int, seed: int) -> tuple[Batch, Batch]:
    """CIFAR-10 from the python pickles in ``data_dir``, standardized; never downloads."""
    names = [f"data_batch_{i}" for i in range(1, 6)]
    present = [n for n in names if os.path.exists(os.path.join(data_dir, n))]
    if not present or not os.path.exists(os.path.join(data_dir, "test_batch")):
        raise FileNotFoundError(
            f"no CIFAR-10 python batches (data_batch_1..5, test_batch) in {data_dir}. Fix: point "
            "--data-dir at an extracted cifar-10-batches-py, or leave it out for synthetic data."
        )
    parts = [_unpickle(os.path.join(data_dir, n)) for n in present]
    x_train, y_train = np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])
    x_test, y_test = _unpickle(os.path.join(data_dir, "test_batch"))
    mean = np.array([0.4914, 0.4822, 0.4465], np.float32)
    std = np.array([0.2470, 0.2435, 0.2616], np.float32)

    def prep(x: np.ndarray) -> np.ndarray:
        return (x.astype(np.float32) / 255.0 - mean) / std

    # A fixed permutation, repeated over epochs as needed: the same batches for both runs.
    rng = np.random.default_rng(seed)
    order = np.concatenate(
        [rng.permutation(len(x_train)) for _ in range(-(-n_train // len(x_train)))]
    )[:n_train]
    return (
        {"x": prep(x_train[order]), "y": y_train[order]},
        {"x": prep(x_test[:eval_size]), "y": y_test[:eval_size]},
    )


def template_images(config: Any, n_train: int) -> tuple[Batch, Batch]:
    """``n_train`` training and ``eval_size`` test images: a shifted class template in noise.

    Each class has a fixed random template, blocky (Gaussian on a grid
    ``config.template_block`` times coarser, upsampled) and of unit standard
    deviation. An image of class y is unit Gaussian noise plus
    ``config.template_scale`` times class y's template, rolled by a random
    (circular) shift. The task is translation invariant on purpose: a
    ResNet's global average pool discards position, so a teacher that reads
    fixed pixel positions (the cnn example's ``teacher_images``) is one it
    cannot learn in 200 steps (the loss stayed at ln 10).
    Deterministic in ``config.seed``.
    """
    rng = np.random.default_rng(config.seed)
    h, w, c = config.image_shape
    b = config.template_block
    coarse_grid = rng.normal(size=(config.num_classes, h // b, w // b, c))
    templates = coarse_grid.repeat(b, axis=1).repeat(b, axis=2).astype(np.float32)

    def sample(n: int) -> Batch:
        y = rng.integers(config.num_classes, size=n)
        dy, dx = rng.integers(h, size=n), rng.integers(w, size=n)
        x = rng.normal(size=(n, h, w, c)).astype(np.float32)
        for i in range(n):
            x[i] += config.template_scale * np.roll(templates[y[i]], (dy[i], dx[i]), axis=(0, 1))
        return {"x": x, "y": y.astype(np.int32)}

    return sample(n_train), sample(config.eval_size)


# ----------------------------------------------------------------------------- training


def train_and_evaluate(config: Any, workdir: str) -> dict[str, Any]:
    """Trains the ResNet with coarse and/or pmean, compares the loss curves and times the steps.

    Args:
      config: a `configs.default.ResNet18Config`.
      workdir: directory for ``metrics.jsonl`` (and ``loss.png``), created if missing.

    Returns:
      `common.compare.run_comparison`'s summary; ``eval`` holds the test accuracy.
    """
    model = ResNet(
        stage_sizes=config.stage_sizes,
        width=config.width,
        groups=config.norm_groups,
        num_classes=config.num_classes,
        activation=config.activation,
    )
    params = model.init(jax.random.key(config.seed), jnp.zeros((1, *config.image_shape)))
    train, test = data.load_or_synthesize(config, load_cifar10, template_images)
    return compare.run_comparison(
        config,
        workdir,
        name="resnet18",
        apply_fn=model.apply,
        params=params,
        make_loss=classifier.classification_loss,
        train_data=train,
        evaluate=classifier.accuracy(model.apply, test, chunk=128),
    )
