"""Default hyperparameters for the BERT example (`common.config.BaseConfig` plus the encoder's)."""

from __future__ import annotations

import dataclasses
import os
import sys

# examples/ onto the path for the shared `common` package (main.py does this
# too; here it lets this module be imported on its own).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from common.config import BaseConfig


@dataclasses.dataclass(frozen=True)
class BertConfig(BaseConfig):
    """Everything `train.train_and_evaluate` needs: `BaseConfig` (workers,
    steps, SGD and why not Adam, coarse settings, flags) and the fields below.

    Attributes:
      vocab_size: tokens, including the ``[MASK]`` token (id 0).
      seq_len: tokens per sequence.
      num_layers: transformer encoder layers.
      d_model: embedding width.
      num_heads: attention heads per layer.
      d_mlp: hidden width of each layer's MLP.
      mask_rate: fraction of positions masked (replaced by ``[MASK]``) and predicted.
      successors: likely next tokens per token in the synthetic Markov chain
        (its transition rows are Dirichlet with most mass on these), so the
        masked tokens are predictable from their neighbours.

    Defaults set here: ``batch_size`` 32 sequences, ``eval_size`` 256
    held-out sequences (masked-token accuracy), ``learning_rate`` 0.1,
    ``shard_bytes`` 32 KiB, ``leading_modules`` 2 (flatten order:
    ``layer0_embed``, ``layer0_pos``, ``layer1_encoder``, ...: the token and
    position embeddings). ``data_dir``: a ``.npy`` file of int32 token ids
    (1-D, or 2-D rows that are concatenated), or a directory holding
    ``tokens.npy``; None: synthetic Markov-chain tokens. Ids are shifted by
    one to free id 0 for ``[MASK]``.
    """

    batch_size: int = 32
    eval_size: int = 256
    learning_rate: float = 0.1
    shard_bytes: int = 32 << 10
    leading_modules: int = 2
    vocab_size: int = 256
    seq_len: int = 32
    num_layers: int = 2
    d_model: int = 64
    num_heads: int = 4
    d_mlp: int = 256
    mask_rate: float = 0.15
    successors: int = 4


def get_config() -> BertConfig:
    """Returns the default BERT configuration."""
    return BertConfig()
