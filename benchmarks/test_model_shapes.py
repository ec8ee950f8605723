"""The model shape tables in benchmarks/model_shapes.py: leaf counts and exact parameter totals."""

from __future__ import annotations

import math

import model_shapes as shapes
import numpy as np
import pytest


def _params(table: shapes.Shapes) -> int:
    return sum(math.prod(shape) for _, shape in table)


@pytest.mark.parametrize(
    ("name", "leaves", "params"),
    [
        ("resnet50", 161, 25_557_032),
        # BertModel (embeddings, 12 layers, pooler; no MLM head): the published "110M".
        ("bert_base", 199, 109_482_240),
        # ViT-B/16 at 224x224 with a 1000-class head: the published "86.6M".
        ("vit_b16", 152, 86_567_656),
    ],
)
def test_leaf_and_parameter_counts(name: str, leaves: int, params: int) -> None:
    table = shapes.SHAPES[name]
    assert len(table) == leaves
    assert _params(table) == params
    assert len({n for n, _ in table}) == leaves  # names are unique


def test_bert_base_by_component() -> None:
    """BERT-base's total rebuilt from its published hyper-parameters."""
    h, inter, vocab, pos, types, layers = 768, 3072, 30522, 512, 2, 12
    embeddings = (vocab + pos + types) * h + 2 * h
    layer = 4 * (h * h + h) + 2 * h + (h * inter + inter) + (inter * h + h) + 2 * h
    pooler = h * h + h
    assert embeddings + layers * layer + pooler == _params(shapes.BERT_BASE_SHAPES)
    assert round(_params(shapes.BERT_BASE_SHAPES) / 1e6) == 109  # "110M" in the paper


def test_vit_b16_by_component() -> None:
    """ViT-B/16's total rebuilt from its published hyper-parameters."""
    h, mlp, patch, tokens, classes, layers = 768, 3072, 16, 14 * 14 + 1, 1000, 12
    embedding = patch * patch * 3 * h + h + h + tokens * h  # conv, cls token, positions
    block = 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + 2 * h + (h * mlp + mlp) + (mlp * h + h)
    head = 2 * h + h * classes + classes
    assert embedding + layers * block + head == _params(shapes.VIT_B16_SHAPES)
    assert round(_params(shapes.VIT_B16_SHAPES) / 1e5) == 866  # 86.6M


def test_layer_order() -> None:
    """Repeated layers are written out in network order, first to last."""
    bert = [n for n, _ in shapes.BERT_BASE_SHAPES]
    assert bert[5] == "encoder/layer0/attention/query/kernel"
    assert bert[-3] == "encoder/layer11/output/layer_norm/bias"
    vit = [n for n, _ in shapes.VIT_B16_SHAPES]
    assert vit[4] == "encoder/block0/ln1/scale"
    assert vit[-5] == "encoder/block11/mlp/dense2/bias"


@pytest.mark.parametrize("name", ["resnet50", "bert_base", "vit_b16"])
def test_trees(name: str) -> None:
    tree = shapes.TREES[name](np.float32)
    assert [(k, v.shape) for k, v in tree.items()] == list(shapes.SHAPES[name])
    assert all(v.dtype == np.float32 for v in tree.values())
