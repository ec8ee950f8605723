"""The command line of the comparison examples (demo, cnn, resnet18, bert).

Each ``main.py`` reads top to bottom: `parse_flags`, `apply_flags` to its
default config, ``train.train_and_evaluate``, then `exit_status`. Every flag
sets one field of a `common.config.BaseConfig`, except ``--workdir``. This
module imports no jax, so ``main.py`` can set ``XLA_FLAGS`` first.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

MATCH_RTOL = 1e-4  # the demo's rule: curves must agree to a relative 1e-4 at every step


def parse_flags(
    name: str, description: str, defaults: Any, data_dir: bool = True
) -> argparse.Namespace:
    """The shared flags, with ``defaults``' values; ``data_dir=False`` leaves out ``--data-dir``
    (the example has synthetic data only)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--impl",
        choices=("coarse", "pmean", "both"),
        default="both",
        help="which gradient synchronization to train with (both: compare)",
    )
    parser.add_argument(
        "--steps", type=int, default=defaults.steps, help="optimizer steps per implementation"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=defaults.workers,
        help="data-parallel workers (coarse uses as many proxies, or --proxies)",
    )
    parser.add_argument(
        "--proxies",
        type=int,
        default=defaults.proxies,
        help="coarse's proxies, dividing --workers: each serves workers/proxies workers "
        "(COARSE k:1, e.g. --workers 4 --proxies 2); default one per worker",
    )
    parser.add_argument(
        "--workdir",
        default=os.path.join("out", name),
        help="where metrics.jsonl (and loss.png) are written",
    )
    if data_dir:
        parser.add_argument(
            "--data-dir",
            default=None,
            help="local dataset (never downloaded); synthetic data if omitted",
        )
    parser.add_argument(
        "--plot", action="store_true", help="write loss.png with the loss curves into the workdir"
    )
    parser.add_argument(
        "--noise-floor",
        action="store_true",
        help="with --impl both, also train pmean with the gradients summed in "
        "the reverse worker order (an equally valid float32 all-reduce) and "
        "compare the step-0 gradients: how far two valid orders drift apart",
    )
    parser.add_argument(
        "--sync-timing-calls",
        type=int,
        default=defaults.sync_timing_calls,
        metavar="N",
        help="also time the gradient sync alone: median of N calls per implementation (0: off)",
    )
    parser.add_argument(
        "--optimizer",
        choices=("workers", "proxy"),
        default=defaults.optimizer,
        help="where coarse's SGD runs: 'workers' (optax after coarse.value_and_grad, default) or "
        "'proxy' (coarse.optim.sgd through coarse.value_and_update: the proxies hold the "
        "optimizer state)",
    )
    flags = parser.parse_args()
    if flags.noise_floor and flags.impl != "both":
        parser.error("--noise-floor needs --impl both")
    if flags.sync_timing_calls < 0:
        parser.error("--sync-timing-calls must be >= 0")
    return flags


def apply_flags(config: Any, flags: argparse.Namespace) -> Any:
    """``config`` with the fields the flags set replaced by their values."""
    return dataclasses.replace(
        config,
        steps=flags.steps,
        workers=flags.workers,
        proxies=flags.proxies,
        impl=flags.impl,
        data_dir=getattr(flags, "data_dir", None),
        plot=flags.plot,
        noise_floor=flags.noise_floor,
        sync_timing_calls=flags.sync_timing_calls,
        optimizer=flags.optimizer,
    )


def exit_status(config: Any, summary: dict[str, Any]) -> int:
    """0, or 1 when both implementations ran and their loss curves differ.

    With ``impl`` "both" it prints whether the curves agree to a relative
    `MATCH_RTOL` at every step, and returns 1 if they do not.
    """
    if config.impl != "both":
        return 0
    ok = summary["max_rel_loss_diff"] < MATCH_RTOL
    print(f"loss curves match (relative diff < 1e-4): {ok}")
    return 0 if ok else 1
