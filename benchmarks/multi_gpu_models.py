"""The two models of the multi-device benchmark (test_multi_gpu.py): ResNet-50 and
BERT-base, each at its published size and in a reduced configuration for a smoke run.

* **ResNet-50**: the bottleneck network (stages of 3, 4, 6, 3 blocks, width 64,
  ImageNet's 224x224x3 and 1000 classes), Flax Linen. GroupNorm stands where the
  paper has BatchNorm: the same parameters (a scale and a bias per channel),
  so the same 25,557,032 of them (model_shapes.RESNET50_SHAPES' total), and no
  running statistics, which a plain ``(params, batch)`` step does not carry.
* **BERT-base**: the bert example's encoder (examples/bert/train.py: pre-LayerNorm
  layers, a vocabulary projection) at L=12, H=768, A=12, intermediate 3072,
  vocab 30522, sequences of 128; the masked-LM loss of the example. 132,066,618
  parameters: the published 109,482,240 (model_shapes.BERT_BASE_SHAPES) less the
  pooler, the token types and 384 of the 512 positions, plus the example's own
  (untied) vocabulary projection.

A `Model` gives its loss, its initial parameters and one worker's batch.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import numpy as np
import optax

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples", "bert"))
from train import Bert, make_loss


class Bottleneck(nn.Module):
    """1x1, 3x3 (strided), 1x1 x4 convolutions with GroupNorm; a projection when the
    shape changes."""

    features: int
    strides: int
    groups: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        s = (self.strides, self.strides)
        y = nn.relu(nn.GroupNorm(self.groups)(nn.Conv(self.features, (1, 1), use_bias=False)(x)))
        y = nn.Conv(self.features, (3, 3), s, use_bias=False)(y)
        y = nn.relu(nn.GroupNorm(self.groups)(y))
        y = nn.Conv(4 * self.features, (1, 1), use_bias=False)(y)
        y = nn.GroupNorm(self.groups, scale_init=nn.initializers.zeros)(y)
        if x.shape != y.shape:
            x = nn.Conv(4 * self.features, (1, 1), s, use_bias=False)(x)
            x = nn.GroupNorm(self.groups)(x)
        return nn.relu(x + y)


class ResNet(nn.Module):
    """ImageNet-style ResNet of bottleneck blocks: 7x7/2 stem, 3x3/2 max pool, stages,
    global average pool, Dense."""

    stage_sizes: tuple[int, ...] = (3, 4, 6, 3)
    width: int = 64
    groups: int = 32
    num_classes: int = 1000

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.Conv(self.width, (7, 7), (2, 2), padding=[(3, 3), (3, 3)], use_bias=False)(x)
        x = nn.relu(nn.GroupNorm(self.groups)(x))
        x = nn.max_pool(x, (3, 3), (2, 2), padding="SAME")
        for i, blocks in enumerate(self.stage_sizes):
            for j in range(blocks):
                x = Bottleneck(self.width * 2**i, 2 if i > 0 and j == 0 else 1, self.groups)(x)
        return nn.Dense(self.num_classes)(x.mean(axis=(1, 2)))


@dataclasses.dataclass(frozen=True)
class Model:
    """A model's loss ``(params, batch) -> scalar``, parameters and one worker's batch."""

    name: str
    module: nn.Module
    loss: Callable[[Any, dict], jax.Array]
    example: Callable[[int, int], dict]  # (rows, seed) -> batch

    def init(self) -> Any:
        x = jax.tree.map(lambda v: v[:1], self.example(1, 0))
        first = x["images"] if "images" in x else x["inputs"]
        return jax.jit(self.module.init)(jax.random.key(0), first)

    def batch(self, rows: int, seed: int = 1) -> dict:
        return self.example(rows, seed)


def resnet50(full: bool) -> Model:
    """ResNet-50 at 224x224 (``full``) or one bottleneck block at 16x16, for a smoke run."""
    if full:
        module, side, classes = ResNet(), 224, 1000
    else:
        module, side, classes = ResNet((1,), width=8, groups=4, num_classes=10), 16, 10

    def loss(params, batch):
        logits = module.apply(params, batch["images"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

    def example(rows: int, seed: int) -> dict:
        rng = np.random.default_rng(seed)
        return {
            "images": rng.standard_normal((rows, side, side, 3)).astype(np.float32),
            "labels": rng.integers(0, classes, rows).astype(np.int32),
        }

    return Model("ResNet-50" if full else "ResNet (reduced)", module, loss, example)


def bert_base(full: bool) -> Model:
    """BERT-base at sequence 128 (``full``) or one layer of width 32 at sequence 8."""
    if full:
        dims = {"vocab_size": 30522, "seq_len": 128, "num_layers": 12, "d_model": 768}
        dims |= {"num_heads": 12, "d_mlp": 3072}
    else:
        dims = {"vocab_size": 64, "seq_len": 8, "num_layers": 1, "d_model": 32}
        dims |= {"num_heads": 2, "d_mlp": 64}
    module = Bert(**dims)

    def example(rows: int, seed: int) -> dict:
        rng = np.random.default_rng(seed)
        tokens = rng.integers(1, dims["vocab_size"], (rows, dims["seq_len"])).astype(np.int32)
        weights = (rng.random(tokens.shape) < 0.15).astype(np.float32)
        weights[:, 0] = 1.0  # at least one masked position per sequence
        return {
            "inputs": np.where(weights > 0, 0, tokens).astype(np.int32),
            "targets": tokens,
            "weights": weights,
        }

    name = "BERT-base" if full else "BERT (reduced)"
    return Model(name, module, make_loss(module.apply), example)


def n_params(params: Any) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
