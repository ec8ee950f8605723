"""The fields every example's config shares (a frozen dataclass, no ml_collections).

Each ``examples/<name>/configs/default.py`` subclasses `BaseConfig`, overrides
the defaults it needs and adds its model's and data's fields; its docstring
documents only those. `common.cli` sets ``steps``, ``workers``, ``proxies``,
``impl``, ``data_dir``, ``plot``, ``noise_floor``, ``sync_timing_calls`` and
``optimizer`` from the flags; `common.compare.run_comparison` reads the rest.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class BaseConfig:
    """The common fields of `train.train_and_evaluate`'s config.

    Attributes:
      workers: data-parallel workers; coarse also uses ``proxies`` proxies, so
        the run needs ``workers + proxies`` devices.
      proxies: coarse's proxies, dividing ``workers`` (COARSE k:1, each proxy
        shared by workers / proxies workers); None: one per worker.
      steps: optimizer steps per implementation.
      batch_size: global batch size, split evenly over the workers.
      eval_size: held-out examples used for the final evaluation.
      learning_rate: SGD learning rate.
      momentum: SGD momentum. SGD rather than Adam: Adam divides by
        sqrt(second moment), which blows float32 summation-order rounding in
        near-zero gradients (e.g. embeddings of tokens absent from a batch) up
        to full-size updates; its loss curves then drift apart by ~1e-3 even
        between two valid all-reduce orders, which would hide whether coarse
        computes the same mean as pmean.
      seed: seeds the numpy data generator (and any fixed teacher, templates
        or chain) and the parameter init.
      shard_bytes: coarse `Config.shard_bytes`.
      leading_modules: how many of the first top-level modules in flatten
        (sorted-name) order are reduced among the workers (coarse dual sync);
        their size becomes `Config.leading_bytes`.
      impl: "coarse", "pmean" or "both" (--impl).
      noise_floor: with "both", also train pmean with the gradients summed in
        the reverse worker order and compare step-0 gradients (--noise-floor;
        see `common.compare.run_comparison`).
      data_dir: a local dataset, in the format the example's config describes
        (--data-dir); None: synthetic data. Nothing is ever downloaded.
      plot: write ``loss.png`` into the workdir (--plot).
      optimizer: where coarse's optimizer runs (--optimizer): "workers" (optax
        SGD on every device after `coarse.value_and_grad`, the default) or
        "proxy" (`coarse.optim.sgd` on the proxies through
        `coarse.value_and_update`: the workers hold no optimizer state). The
        pmean run always uses optax.
      sync_timing_calls: also time the gradient synchronization alone, on a
        gradient-shaped tree with different values per worker: the median of
        this many calls per implementation (--sync-timing-calls); 0: off.
    """

    workers: int = 4
    proxies: int | None = None
    steps: int = 200
    batch_size: int = 32
    eval_size: int = 512
    learning_rate: float = 0.01
    momentum: float = 0.9
    seed: int = 0
    shard_bytes: int = 64 << 10
    leading_modules: int = 1
    impl: str = "both"
    noise_floor: bool = False
    data_dir: str | None = None
    plot: bool = False
    sync_timing_calls: int = 0
    optimizer: str = "workers"
