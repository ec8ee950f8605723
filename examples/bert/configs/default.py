"""Default hyperparameters for the BERT example (a frozen dataclass, no ml_collections)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Everything `train.train_and_evaluate` needs.

    Attributes:
      workers: data-parallel workers; coarse also uses as many proxies, so the
        run needs ``2 * workers`` devices.
      steps: optimizer steps per implementation.
      batch_size: global batch size (sequences), split evenly over the workers.
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
      eval_size: held-out sequences used for the final masked-token accuracy.
      learning_rate: SGD learning rate.
      momentum: SGD momentum. SGD rather than Adam: Adam divides by
        sqrt(second moment), which blows float32 summation-order rounding in
        near-zero gradients (e.g. embeddings of tokens absent from a batch)
        up to full-size updates; its loss curves then drift apart by ~1e-3
        even between two valid all-reduce orders, which would hide whether
        coarse computes the same mean as pmean.
      seed: seeds the numpy data generator, the masks and the parameter init.
      shard_bytes: coarse `Config.shard_bytes`.
      leading_modules: how many of the first modules in flatten order
        (``layer0_embed``, ``layer0_pos``, ``layer1_encoder``, ...) are reduced among the
        workers (dual sync): 2 is the token and position embeddings.
      impl: "coarse", "pmean" or "both" (set by main.py's --impl).
      noise_floor: with "both", also train pmean with the gradients summed in
        the reverse worker order and compare step-0 gradients (--noise-floor;
        see `common.trainer.run_comparison`).
      data_dir: a ``.npy`` file of int32 token ids (1-D, or 2-D rows that are
        concatenated), or a directory holding ``tokens.npy``; None: synthetic
        Markov-chain tokens. Ids are shifted by one to free id 0 for ``[MASK]``.
      plot: write ``loss.png`` into the workdir.
    """

    workers: int = 4
    steps: int = 200
    batch_size: int = 32
    vocab_size: int = 256
    seq_len: int = 32
    num_layers: int = 2
    d_model: int = 64
    num_heads: int = 4
    d_mlp: int = 256
    mask_rate: float = 0.15
    successors: int = 4
    eval_size: int = 256
    learning_rate: float = 0.1
    momentum: float = 0.9
    seed: int = 0
    shard_bytes: int = 32 << 10
    leading_modules: int = 2
    worker_compute: str = (
        "cond"  # coarse.Config.worker_compute ("all" is faster for conv nets on CPU)
    )
    impl: str = "both"
    noise_floor: bool = False
    data_dir: str | None = None
    plot: bool = False


def get_config() -> BertConfig:
    """Returns the default BERT configuration."""
    return BertConfig()
