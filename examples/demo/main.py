"""Entry point of the coarse_jax demo: ``python examples/demo/main.py [--steps N]``.

Trains a small Flax MLP with coarse_jax (4 workers + 4 proxies) and with plain
``shard_map`` + ``lax.pmean`` (4 devices), then compares and times them. See
`train.train_and_evaluate`.
"""

from __future__ import annotations

import os

# The CPU must offer 8 devices (4 workers + 4 proxies); XLA reads this only
# when jax initializes its backend, so it is set before anything imports jax.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse
import dataclasses
import sys

import train
from configs import default


def parse_args() -> argparse.Namespace:
    defaults = default.get_config()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=defaults.steps, help="optimizer steps per implementation"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=defaults.workers,
        help="data-parallel workers (coarse uses as many proxies)",
    )
    parser.add_argument(
        "--workdir", default=os.path.join("out", "demo"), help="where metrics.jsonl is written"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    config = dataclasses.replace(default.get_config(), steps=args.steps, workers=args.workers)
    summary = train.train_and_evaluate(config, args.workdir)
    ok = summary["max_rel_loss_diff"] < 1e-4
    print(f"loss curves match (relative diff < 1e-4): {ok}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
