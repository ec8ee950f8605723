"""Example: a small Flax CNN on MNIST-sized data, coarse_jax vs pmean.

Run: ``python examples/cnn/main.py [--impl both] [--steps N]``.

Flags: --impl {coarse,pmean,both} (default both), --steps, --workers,
--proxies (COARSE k:1), --workdir, --data-dir (a local dataset; nothing is
ever downloaded), --plot (loss.png), --noise-floor (also train pmean with the
worker sum reversed, the distance two valid all-reduce orders drift apart,
and compare the step-0 gradients), --sync-timing-calls N (also time the
gradient sync alone), --optimizer {workers,proxy} (where coarse's SGD runs).
With --impl both the exit status is 1 if the two loss curves differ by a
relative 1e-4 or more at any step. See `train.train_and_evaluate`.
"""

from __future__ import annotations

import os
import sys

# The CPU must offer 8 devices (4 workers + 4 proxies); XLA reads this only
# when jax initializes its backend, so it is set before anything imports jax.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# examples/ onto the path for the shared `common` package (this directory is
# already there, as the script's own).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import train
from common import cli
from configs import default


def main() -> int:
    """Parses the flags into the default config, trains, and returns the exit status."""
    flags = cli.parse_flags("cnn", __doc__.splitlines()[0], default.get_config())
    config = cli.apply_flags(default.get_config(), flags)
    summary = train.train_and_evaluate(config, flags.workdir)
    return cli.exit_status(config, summary)


if __name__ == "__main__":
    sys.exit(main())
