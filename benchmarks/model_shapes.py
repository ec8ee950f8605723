"""Gradient-tree shapes of well-known models, for the benchmarks (shapes only).

ResNet-50's table is the product's (`coarse_jax.cli.resnet50`: the profiler's
command line syncs it); BERT-base and ViT-B/16 are the benchmarks' own.
`benchmarks/test_model_shapes.py` checks the tables against the published totals.
"""

from __future__ import annotations

import collections

import jax
import numpy as np

from coarse_jax.cli.resnet50 import RESNET50_SHAPES, Shapes, resnet50_tree, tree_of

__all__ = [
    "BERT_BASE_SHAPES",
    "RESNET50_SHAPES",
    "SHAPES",
    "TREES",
    "VIT_B16_SHAPES",
    "Shapes",
    "bert_base_tree",
    "resnet50_tree",
    "vit_b16_tree",
]
# BERT-base (uncased; L=12, H=768, A=12, intermediate 3072, vocab 30522, 512
# positions, 2 token types): the encoder `BertModel` with its pooler, dense
# kernels stored (in, out), LayerNorms as scale/bias. The MLM/NSP pre-training
# heads are left out (the MLM decoder's kernel is tied to the word embeddings),
# so the total is the published 109,482,240 ("110M"). 5 + 12 * 16 + 2 = 199 leaves.
_BERT_EMBEDDINGS: Shapes = (
    ("embeddings/word_embeddings", (30522, 768)),
    ("embeddings/position_embeddings", (512, 768)),
    ("embeddings/token_type_embeddings", (2, 768)),
    ("embeddings/layer_norm/scale", (768,)),
    ("embeddings/layer_norm/bias", (768,)),
)

# The 16 leaves of one encoder layer; "{}" is the layer index.
_BERT_LAYER: Shapes = (
    ("encoder/layer{}/attention/query/kernel", (768, 768)),
    ("encoder/layer{}/attention/query/bias", (768,)),
    ("encoder/layer{}/attention/key/kernel", (768, 768)),
    ("encoder/layer{}/attention/key/bias", (768,)),
    ("encoder/layer{}/attention/value/kernel", (768, 768)),
    ("encoder/layer{}/attention/value/bias", (768,)),
    ("encoder/layer{}/attention/output/kernel", (768, 768)),
    ("encoder/layer{}/attention/output/bias", (768,)),
    ("encoder/layer{}/attention/layer_norm/scale", (768,)),
    ("encoder/layer{}/attention/layer_norm/bias", (768,)),
    ("encoder/layer{}/intermediate/kernel", (768, 3072)),
    ("encoder/layer{}/intermediate/bias", (3072,)),
    ("encoder/layer{}/output/kernel", (3072, 768)),
    ("encoder/layer{}/output/bias", (768,)),
    ("encoder/layer{}/output/layer_norm/scale", (768,)),
    ("encoder/layer{}/output/layer_norm/bias", (768,)),
)

_BERT_POOLER: Shapes = (
    ("pooler/dense/kernel", (768, 768)),
    ("pooler/dense/bias", (768,)),
)

BERT_BASE_SHAPES: Shapes = (
    _BERT_EMBEDDINGS
    # layers 0..11 in order, each the 16 leaves of _BERT_LAYER
    + tuple((name.format(i), shape) for i in range(12) for name, shape in _BERT_LAYER)
    + _BERT_POOLER
)

# ViT-B/16 at 224x224 (patch 16, hidden 768, 12 heads, MLP 3072, 1000 classes),
# as in the original JAX/timm models: a 16x16 conv (HWIO) patch embedding, a
# class token, 197 = 14 * 14 + 1 learned position embeddings, pre-norm
# encoder blocks with a fused qkv projection (768 -> 3 * 768), a final
# LayerNorm and the classifier head. Total 86,567,656 ("86.6M"), 4 + 12 * 12 +
# 4 = 152 leaves.
_VIT_EMBEDDINGS: Shapes = (
    ("embedding/kernel", (16, 16, 3, 768)),
    ("embedding/bias", (768,)),
    ("cls_token", (1, 1, 768)),
    ("pos_embedding", (1, 197, 768)),
)

# The 12 leaves of one encoder block; "{}" is the block index.
_VIT_BLOCK: Shapes = (
    ("encoder/block{}/ln1/scale", (768,)),
    ("encoder/block{}/ln1/bias", (768,)),
    ("encoder/block{}/attention/qkv/kernel", (768, 2304)),
    ("encoder/block{}/attention/qkv/bias", (2304,)),
    ("encoder/block{}/attention/out/kernel", (768, 768)),
    ("encoder/block{}/attention/out/bias", (768,)),
    ("encoder/block{}/ln2/scale", (768,)),
    ("encoder/block{}/ln2/bias", (768,)),
    ("encoder/block{}/mlp/dense1/kernel", (768, 3072)),
    ("encoder/block{}/mlp/dense1/bias", (3072,)),
    ("encoder/block{}/mlp/dense2/kernel", (3072, 768)),
    ("encoder/block{}/mlp/dense2/bias", (768,)),
)

_VIT_HEAD: Shapes = (
    ("encoder/ln_final/scale", (768,)),
    ("encoder/ln_final/bias", (768,)),
    ("head/kernel", (768, 1000)),
    ("head/bias", (1000,)),
)

VIT_B16_SHAPES: Shapes = (
    _VIT_EMBEDDINGS
    # blocks 0..11 in order, each the 12 leaves of _VIT_BLOCK
    + tuple((name.format(i), shape) for i in range(12) for name, shape in _VIT_BLOCK)
    + _VIT_HEAD
)


def bert_base_tree(
    dtype: object = np.float32,
) -> collections.OrderedDict[str, jax.ShapeDtypeStruct]:
    """BERT-base's gradient tree (encoder and pooler) as ShapeDtypeStructs, in network order."""
    return tree_of(BERT_BASE_SHAPES, dtype)


def vit_b16_tree(dtype: object = np.float32) -> collections.OrderedDict[str, jax.ShapeDtypeStruct]:
    """ViT-B/16's gradient tree as ShapeDtypeStructs, in network order."""
    return tree_of(VIT_B16_SHAPES, dtype)


# Tree name -> its leaf table and tree builder, for benchmarks and reports.
SHAPES: dict[str, Shapes] = {
    "resnet50": RESNET50_SHAPES,
    "bert_base": BERT_BASE_SHAPES,
    "vit_b16": VIT_B16_SHAPES,
}
TREES = {
    "resnet50": resnet50_tree,
    "bert_base": bert_base_tree,
    "vit_b16": vit_b16_tree,
}
