"""Gradient-tree shapes of well-known models, for benchmarks, the profiler CLI and tests."""

from __future__ import annotations

import collections

import jax
import numpy as np

# ResNet-50 (v1.5) parameters in network order: conv kernels HWIO, batchnorm
# scale/bias, then the classifier. Batchnorm running statistics are state,
# not gradients, so they are left out.
RESNET50_SHAPES: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("stem/conv/kernel", (7, 7, 3, 64)),
    ("stem/bn/scale", (64,)),
    ("stem/bn/bias", (64,)),
    ("stage1/block0/conv1/kernel", (1, 1, 64, 64)),
    ("stage1/block0/bn1/scale", (64,)),
    ("stage1/block0/bn1/bias", (64,)),
    ("stage1/block0/conv2/kernel", (3, 3, 64, 64)),
    ("stage1/block0/bn2/scale", (64,)),
    ("stage1/block0/bn2/bias", (64,)),
    ("stage1/block0/conv3/kernel", (1, 1, 64, 256)),
    ("stage1/block0/bn3/scale", (256,)),
    ("stage1/block0/bn3/bias", (256,)),
    ("stage1/block0/proj/kernel", (1, 1, 64, 256)),
    ("stage1/block0/proj_bn/scale", (256,)),
    ("stage1/block0/proj_bn/bias", (256,)),
    ("stage1/block1/conv1/kernel", (1, 1, 256, 64)),
    ("stage1/block1/bn1/scale", (64,)),
    ("stage1/block1/bn1/bias", (64,)),
    ("stage1/block1/conv2/kernel", (3, 3, 64, 64)),
    ("stage1/block1/bn2/scale", (64,)),
    ("stage1/block1/bn2/bias", (64,)),
    ("stage1/block1/conv3/kernel", (1, 1, 64, 256)),
    ("stage1/block1/bn3/scale", (256,)),
    ("stage1/block1/bn3/bias", (256,)),
    ("stage1/block2/conv1/kernel", (1, 1, 256, 64)),
    ("stage1/block2/bn1/scale", (64,)),
    ("stage1/block2/bn1/bias", (64,)),
    ("stage1/block2/conv2/kernel", (3, 3, 64, 64)),
    ("stage1/block2/bn2/scale", (64,)),
    ("stage1/block2/bn2/bias", (64,)),
    ("stage1/block2/conv3/kernel", (1, 1, 64, 256)),
    ("stage1/block2/bn3/scale", (256,)),
    ("stage1/block2/bn3/bias", (256,)),
    ("stage2/block0/conv1/kernel", (1, 1, 256, 128)),
    ("stage2/block0/bn1/scale", (128,)),
    ("stage2/block0/bn1/bias", (128,)),
    ("stage2/block0/conv2/kernel", (3, 3, 128, 128)),
    ("stage2/block0/bn2/scale", (128,)),
    ("stage2/block0/bn2/bias", (128,)),
    ("stage2/block0/conv3/kernel", (1, 1, 128, 512)),
    ("stage2/block0/bn3/scale", (512,)),
    ("stage2/block0/bn3/bias", (512,)),
    ("stage2/block0/proj/kernel", (1, 1, 256, 512)),
    ("stage2/block0/proj_bn/scale", (512,)),
    ("stage2/block0/proj_bn/bias", (512,)),
    ("stage2/block1/conv1/kernel", (1, 1, 512, 128)),
    ("stage2/block1/bn1/scale", (128,)),
    ("stage2/block1/bn1/bias", (128,)),
    ("stage2/block1/conv2/kernel", (3, 3, 128, 128)),
    ("stage2/block1/bn2/scale", (128,)),
    ("stage2/block1/bn2/bias", (128,)),
    ("stage2/block1/conv3/kernel", (1, 1, 128, 512)),
    ("stage2/block1/bn3/scale", (512,)),
    ("stage2/block1/bn3/bias", (512,)),
    ("stage2/block2/conv1/kernel", (1, 1, 512, 128)),
    ("stage2/block2/bn1/scale", (128,)),
    ("stage2/block2/bn1/bias", (128,)),
    ("stage2/block2/conv2/kernel", (3, 3, 128, 128)),
    ("stage2/block2/bn2/scale", (128,)),
    ("stage2/block2/bn2/bias", (128,)),
    ("stage2/block2/conv3/kernel", (1, 1, 128, 512)),
    ("stage2/block2/bn3/scale", (512,)),
    ("stage2/block2/bn3/bias", (512,)),
    ("stage2/block3/conv1/kernel", (1, 1, 512, 128)),
    ("stage2/block3/bn1/scale", (128,)),
    ("stage2/block3/bn1/bias", (128,)),
    ("stage2/block3/conv2/kernel", (3, 3, 128, 128)),
    ("stage2/block3/bn2/scale", (128,)),
    ("stage2/block3/bn2/bias", (128,)),
    ("stage2/block3/conv3/kernel", (1, 1, 128, 512)),
    ("stage2/block3/bn3/scale", (512,)),
    ("stage2/block3/bn3/bias", (512,)),
    ("stage3/block0/conv1/kernel", (1, 1, 512, 256)),
    ("stage3/block0/bn1/scale", (256,)),
    ("stage3/block0/bn1/bias", (256,)),
    ("stage3/block0/conv2/kernel", (3, 3, 256, 256)),
    ("stage3/block0/bn2/scale", (256,)),
    ("stage3/block0/bn2/bias", (256,)),
    ("stage3/block0/conv3/kernel", (1, 1, 256, 1024)),
    ("stage3/block0/bn3/scale", (1024,)),
    ("stage3/block0/bn3/bias", (1024,)),
    ("stage3/block0/proj/kernel", (1, 1, 512, 1024)),
    ("stage3/block0/proj_bn/scale", (1024,)),
    ("stage3/block0/proj_bn/bias", (1024,)),
    ("stage3/block1/conv1/kernel", (1, 1, 1024, 256)),
    ("stage3/block1/bn1/scale", (256,)),
    ("stage3/block1/bn1/bias", (256,)),
    ("stage3/block1/conv2/kernel", (3, 3, 256, 256)),
    ("stage3/block1/bn2/scale", (256,)),
    ("stage3/block1/bn2/bias", (256,)),
    ("stage3/block1/conv3/kernel", (1, 1, 256, 1024)),
    ("stage3/block1/bn3/scale", (1024,)),
    ("stage3/block1/bn3/bias", (1024,)),
    ("stage3/block2/conv1/kernel", (1, 1, 1024, 256)),
    ("stage3/block2/bn1/scale", (256,)),
    ("stage3/block2/bn1/bias", (256,)),
    ("stage3/block2/conv2/kernel", (3, 3, 256, 256)),
    ("stage3/block2/bn2/scale", (256,)),
    ("stage3/block2/bn2/bias", (256,)),
    ("stage3/block2/conv3/kernel", (1, 1, 256, 1024)),
    ("stage3/block2/bn3/scale", (1024,)),
    ("stage3/block2/bn3/bias", (1024,)),
    ("stage3/block3/conv1/kernel", (1, 1, 1024, 256)),
    ("stage3/block3/bn1/scale", (256,)),
    ("stage3/block3/bn1/bias", (256,)),
    ("stage3/block3/conv2/kernel", (3, 3, 256, 256)),
    ("stage3/block3/bn2/scale", (256,)),
    ("stage3/block3/bn2/bias", (256,)),
    ("stage3/block3/conv3/kernel", (1, 1, 256, 1024)),
    ("stage3/block3/bn3/scale", (1024,)),
    ("stage3/block3/bn3/bias", (1024,)),
    ("stage3/block4/conv1/kernel", (1, 1, 1024, 256)),
    ("stage3/block4/bn1/scale", (256,)),
    ("stage3/block4/bn1/bias", (256,)),
    ("stage3/block4/conv2/kernel", (3, 3, 256, 256)),
    ("stage3/block4/bn2/scale", (256,)),
    ("stage3/block4/bn2/bias", (256,)),
    ("stage3/block4/conv3/kernel", (1, 1, 256, 1024)),
    ("stage3/block4/bn3/scale", (1024,)),
    ("stage3/block4/bn3/bias", (1024,)),
    ("stage3/block5/conv1/kernel", (1, 1, 1024, 256)),
    ("stage3/block5/bn1/scale", (256,)),
    ("stage3/block5/bn1/bias", (256,)),
    ("stage3/block5/conv2/kernel", (3, 3, 256, 256)),
    ("stage3/block5/bn2/scale", (256,)),
    ("stage3/block5/bn2/bias", (256,)),
    ("stage3/block5/conv3/kernel", (1, 1, 256, 1024)),
    ("stage3/block5/bn3/scale", (1024,)),
    ("stage3/block5/bn3/bias", (1024,)),
    ("stage4/block0/conv1/kernel", (1, 1, 1024, 512)),
    ("stage4/block0/bn1/scale", (512,)),
    ("stage4/block0/bn1/bias", (512,)),
    ("stage4/block0/conv2/kernel", (3, 3, 512, 512)),
    ("stage4/block0/bn2/scale", (512,)),
    ("stage4/block0/bn2/bias", (512,)),
    ("stage4/block0/conv3/kernel", (1, 1, 512, 2048)),
    ("stage4/block0/bn3/scale", (2048,)),
    ("stage4/block0/bn3/bias", (2048,)),
    ("stage4/block0/proj/kernel", (1, 1, 1024, 2048)),
    ("stage4/block0/proj_bn/scale", (2048,)),
    ("stage4/block0/proj_bn/bias", (2048,)),
    ("stage4/block1/conv1/kernel", (1, 1, 2048, 512)),
    ("stage4/block1/bn1/scale", (512,)),
    ("stage4/block1/bn1/bias", (512,)),
    ("stage4/block1/conv2/kernel", (3, 3, 512, 512)),
    ("stage4/block1/bn2/scale", (512,)),
    ("stage4/block1/bn2/bias", (512,)),
    ("stage4/block1/conv3/kernel", (1, 1, 512, 2048)),
    ("stage4/block1/bn3/scale", (2048,)),
    ("stage4/block1/bn3/bias", (2048,)),
    ("stage4/block2/conv1/kernel", (1, 1, 2048, 512)),
    ("stage4/block2/bn1/scale", (512,)),
    ("stage4/block2/bn1/bias", (512,)),
    ("stage4/block2/conv2/kernel", (3, 3, 512, 512)),
    ("stage4/block2/bn2/scale", (512,)),
    ("stage4/block2/bn2/bias", (512,)),
    ("stage4/block2/conv3/kernel", (1, 1, 512, 2048)),
    ("stage4/block2/bn3/scale", (2048,)),
    ("stage4/block2/bn3/bias", (2048,)),
    ("head/dense/kernel", (2048, 1000)),
    ("head/dense/bias", (1000,)),
)


Shapes = tuple[tuple[str, tuple[int, ...]], ...]

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


def _tree(shapes: Shapes, dtype: object) -> collections.OrderedDict[str, jax.ShapeDtypeStruct]:
    # An OrderedDict keeps network order when flattened (a dict is sorted by key).
    return collections.OrderedDict(
        (name, jax.ShapeDtypeStruct(shape, dtype)) for name, shape in shapes
    )


def resnet50_tree(dtype: object = np.float32) -> collections.OrderedDict[str, jax.ShapeDtypeStruct]:
    """ResNet-50's gradient tree as ShapeDtypeStructs, in network order."""
    return _tree(RESNET50_SHAPES, dtype)


def bert_base_tree(
    dtype: object = np.float32,
) -> collections.OrderedDict[str, jax.ShapeDtypeStruct]:
    """BERT-base's gradient tree (encoder and pooler) as ShapeDtypeStructs, in network order."""
    return _tree(BERT_BASE_SHAPES, dtype)


def vit_b16_tree(dtype: object = np.float32) -> collections.OrderedDict[str, jax.ShapeDtypeStruct]:
    """ViT-B/16's gradient tree as ShapeDtypeStructs, in network order."""
    return _tree(VIT_B16_SHAPES, dtype)


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
