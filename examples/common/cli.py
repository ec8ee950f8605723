"""The command line every example's ``main.py`` shares.

``main.py`` sets ``XLA_FLAGS`` (8 CPU devices) before anything imports jax,
puts ``examples/`` on ``sys.path`` and calls `main` with its config (a
`common.config.BaseConfig`) and ``train.train_and_evaluate``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

MATCH_RTOL = 1e-4  # same as trainer.MATCH_RTOL; repeated so this module needs no jax import


def parse_args(
    name: str, description: str, defaults: Any, data_dir: bool = True
) -> argparse.Namespace:
    """The shared flags; ``data_dir=False`` leaves out ``--data-dir`` (synthetic data only)."""
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
        "--worker-compute",
        choices=("auto", "cond", "all"),
        default=defaults.worker_compute,
        help="coarse.Config.worker_compute: deprecated, no effect (the proxies run no "
        "XLA program, so the model runs on the workers only); kept so old command "
        "lines still work",
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
    args = parser.parse_args()
    if args.noise_floor and args.impl != "both":
        parser.error("--noise-floor needs --impl both")
    if args.sync_timing_calls < 0:
        parser.error("--sync-timing-calls must be >= 0")
    return args


def main(
    name: str,
    description: str,
    get_config: Callable[[], Any],
    train_and_evaluate: Callable[[Any, str], dict[str, Any]],
    *,
    data_dir: bool = True,
) -> None:
    """Parses the flags, trains, and exits non-zero if the two loss curves differ.

    With ``--impl both`` the exit status is 1 when the curves differ by a
    relative ``1e-4`` or more at any step (the demo's rule). ``data_dir=False``:
    the example has synthetic data only, so there is no ``--data-dir``.
    """
    args = parse_args(name, description, get_config(), data_dir)
    config = dataclasses.replace(
        get_config(),
        steps=args.steps,
        workers=args.workers,
        proxies=args.proxies,
        impl=args.impl,
        data_dir=getattr(args, "data_dir", None),
        plot=args.plot,
        worker_compute=args.worker_compute,
        noise_floor=args.noise_floor,
        sync_timing_calls=args.sync_timing_calls,
        optimizer=args.optimizer,
    )
    summary = train_and_evaluate(config, args.workdir)
    if args.impl != "both":
        sys.exit(0)
    ok = summary["max_rel_loss_diff"] < MATCH_RTOL
    print(f"loss curves match (relative diff < 1e-4): {ok}")
    sys.exit(0 if ok else 1)
