"""Entry point of the coarse_jax demo: ``python examples/demo/main.py [--steps N]``.

Trains a small Flax MLP with coarse_jax (4 workers + 4 proxies) and with plain
``shard_map`` + ``lax.pmean`` (4 devices), then compares them and times a step
and the gradient sync alone. Flags as the other examples' (`common.cli`),
without --data-dir (the data are synthetic). The exit status is 1 if the two
loss curves differ by a relative 1e-4 or more at any step. See
`train.train_and_evaluate`.
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
    flags = cli.parse_flags("demo", __doc__.splitlines()[0], default.get_config(), data_dir=False)
    config = cli.apply_flags(default.get_config(), flags)
    summary = train.train_and_evaluate(config, flags.workdir)
    return cli.exit_status(config, summary)


if __name__ == "__main__":
    sys.exit(main())
