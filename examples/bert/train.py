"""Trains a small BERT-style encoder (masked LM) with coarse_jax and with shard_map + pmean.

Token + position embeddings, ``num_layers`` pre-LayerNorm transformer layers
(self-attention and an MLP), a final LayerNorm and an output projection; the
loss is cross-entropy on the masked positions only. By default the tokens are
synthetic and deterministic: walks of a fixed random Markov chain whose rows
put most of their mass on a few successors, so a masked token is predictable
from its neighbours. With ``config.data_dir`` they come from a local ``.npy``
file. Both runs share the initial parameters and the batches (see `common.compare`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

# examples/ onto the path for the shared `common` package (main.py does this
# too; here it lets train.py be imported on its own).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from common import compare

Batch = dict[str, Any]
MASK_ID = 0


class EncoderLayer(nn.Module):
    """Pre-LayerNorm transformer layer: x + SelfAttention(LN(x)), then x + MLP(LN(x))."""

    num_heads: int
    d_mlp: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        h = nn.LayerNorm()(x)
        x = x + nn.SelfAttention(num_heads=self.num_heads, deterministic=True)(h)
        h = nn.LayerNorm()(x)
        h = nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(self.d_mlp)(h)))
        return x + h


class Bert(nn.Module):
    """Embeddings, encoder layers, final LayerNorm and a vocabulary projection (logits).

    ``remat=True`` rematerializes each encoder layer (activation checkpointing):
    the layer runs under ``nn.remat`` with ``jax.checkpoint_policies.nothing_saveable``,
    so the backward pass keeps only each layer's input and recomputes the rest.
    The parameters (their names and values) and the loss are the same either way.
    """

    vocab_size: int
    seq_len: int
    num_layers: int
    d_model: int
    num_heads: int
    d_mlp: int
    remat: bool = False

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        # Names sort in layer order, so coarse's flatten order (it pushes in
        # the reverse, and splits the leading layers from it) is the network's.
        tok = nn.Embed(self.vocab_size, self.d_model, name="layer0_embed")(tokens)
        pos = self.param("layer0_pos", nn.initializers.normal(0.02), (self.seq_len, self.d_model))
        x = tok + pos[: tokens.shape[-1]]
        layer = EncoderLayer
        if self.remat:
            layer = nn.remat(EncoderLayer, policy=jax.checkpoint_policies.nothing_saveable)
        for i in range(self.num_layers):
            x = layer(self.num_heads, self.d_mlp, name=f"layer{i + 1}_encoder")(x)
        x = nn.LayerNorm(name=f"layer{self.num_layers + 1}_norm")(x)
        return nn.Dense(self.vocab_size, name=f"layer{self.num_layers + 2}_out")(x)


def build_model(config: Any) -> Bert:
    """The encoder a `configs.default.BertConfig` describes."""
    return Bert(
        vocab_size=config.vocab_size,
        seq_len=config.seq_len,
        num_layers=config.num_layers,
        d_model=config.d_model,
        num_heads=config.num_heads,
        d_mlp=config.d_mlp,
    )


# ----------------------------------------------------------------------------- data


def markov_tokens(config: Any, n_seqs: int, rng: np.random.Generator) -> np.ndarray:
    """``n_seqs`` walks of a fixed random Markov chain over ids 1..vocab_size-1."""
    v = config.vocab_size - 1
    chain_rng = np.random.default_rng(config.seed)  # the chain itself is fixed by the seed
    weights = np.full((v, v), 0.02 / v)
    for row in range(v):
        weights[row, chain_rng.choice(v, config.successors, replace=False)] += chain_rng.dirichlet(
            np.ones(config.successors)
        )
    cdf = np.cumsum(weights / weights.sum(1, keepdims=True), axis=1)
    seqs = np.empty((n_seqs, config.seq_len), np.int64)
    seqs[:, 0] = rng.integers(v, size=n_seqs)
    for t in range(1, config.seq_len):
        u = rng.random(n_seqs)[:, None]
        seqs[:, t] = np.minimum((cdf[seqs[:, t - 1]] < u).sum(1), v - 1)
    return (seqs + 1).astype(np.int32)


def load_tokens(config: Any, n_seqs: int, rng: np.random.Generator) -> np.ndarray:
    """``n_seqs`` windows of a local int32 token file, ids shifted by one (0 is ``[MASK]``)."""
    path = config.data_dir
    if os.path.isdir(path):
        path = os.path.join(path, "tokens.npy")
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} not found. Fix: pass --data-dir a .npy file of int32 token ids (or a "
            "directory with tokens.npy), or leave it out for synthetic tokens."
        )
    ids = np.load(path).reshape(-1).astype(np.int64)
    if ids.min() < 0 or ids.max() + 1 >= config.vocab_size:
        raise ValueError(
            f"{path}: token ids must lie in [0, {config.vocab_size - 2}] (vocab_size "
            f"{config.vocab_size}, id 0 reserved for [MASK]), got [{ids.min()}, {ids.max()}]. "
            "Fix: raise vocab_size in configs/default.py."
        )
    if len(ids) < config.seq_len:
        raise ValueError(f"{path}: {len(ids)} tokens, fewer than seq_len {config.seq_len}.")
    starts = rng.integers(len(ids) - config.seq_len + 1, size=n_seqs)
    return (ids[starts[:, None] + np.arange(config.seq_len)] + 1).astype(np.int32)


def mask(tokens: np.ndarray, rate: float, rng: np.random.Generator) -> Batch:
    """BERT-style inputs: ``rate`` of the positions (at least one per sequence) become [MASK]."""
    where = rng.random(tokens.shape) < rate
    where[np.arange(len(tokens)), rng.integers(tokens.shape[1], size=len(tokens))] = True
    return {
        "inputs": np.where(where, MASK_ID, tokens).astype(np.int32),
        "targets": tokens,
        "weights": where.astype(np.float32),
    }


def make_data(config: Any) -> tuple[Batch, Batch]:
    """Train batches with leading axes ``(steps, batch_size)`` and a flat test set."""
    rng = np.random.default_rng(config.seed + 1)
    n = config.steps * config.batch_size + config.eval_size
    tokens = load_tokens(config, n, rng) if config.data_dir else markov_tokens(config, n, rng)
    data = mask(tokens, config.mask_rate, rng)
    split = config.steps * config.batch_size
    train = {k: v[:split].reshape(config.steps, config.batch_size, -1) for k, v in data.items()}
    return train, {k: v[split:] for k, v in data.items()}


# ----------------------------------------------------------------------------- training


def make_loss(apply_fn: Callable[..., jax.Array]) -> Callable[[Any, Batch], jax.Array]:
    """Mean cross-entropy over one worker's masked positions, as a function of (params, batch)."""

    def loss(params: Any, batch: Batch) -> jax.Array:
        logits = apply_fn(params, batch["inputs"])
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
        return (ce * batch["weights"]).sum() / batch["weights"].sum()

    return loss


def train_and_evaluate(config: Any, workdir: str) -> dict[str, Any]:
    """Trains the encoder with coarse and/or pmean, compares the loss curves and times the steps.

    Args:
      config: a `configs.default.BertConfig`.
      workdir: directory for ``metrics.jsonl`` (and ``loss.png``), created if missing.

    Returns:
      `common.compare.run_comparison`'s summary; ``eval`` holds the masked-token accuracy.
    """
    model = build_model(config)
    params = model.init(jax.random.key(config.seed), jnp.zeros((1, config.seq_len), jnp.int32))
    train, test = make_data(config)
    predict = jax.jit(model.apply)

    def evaluate(state: Any) -> float:
        pred = np.asarray(predict(jax.device_get(state.params), test["inputs"])).argmax(-1)
        w = test["weights"]
        return float(((pred == test["targets"]) * w).sum() / w.sum())

    return compare.run_comparison(
        config,
        workdir,
        name="bert",
        apply_fn=model.apply,
        params=params,
        make_loss=make_loss,
        train_data=train,
        evaluate=evaluate,
        eval_name="masked-token accuracy",
    )
