"""Flax's NNX MNIST example with coarse_jax: Flax's step beside the coarse one.

Run: ``python examples/flax_mnist_nnx/main.py [--impl both] [--steps N]``.

Flags: --impl {flax,coarse,both} (default both: train with each from the same
initial parameters and batches, print both final losses and the largest
per-step difference), --steps, --workers, --proxies (COARSE k:1),
--state-on-mesh (the train state placed on the coarse mesh first), --workdir
(metrics.jsonl), --data-dir (a directory holding Keras' mnist.npz; synthetic
data if omitted, nothing is ever downloaded). Lines that differ from Flax's
main.py are marked ``# coarse:``.
"""

from __future__ import annotations

import os
import sys

# coarse: the CPU must offer 8 devices (4 workers + 4 proxies); XLA reads this
# only when jax initializes its backend, so it is set before anything imports jax.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")  # coarse
# examples/ onto the path for the shared `common` package (this directory is
# already there, as the script's own).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import train
from common import mnist_cli
from configs import default


def main() -> None:
    """Parses the flags into the default config, then trains and evaluates."""
    flags = mnist_cli.parse_flags("flax_mnist_nnx", __doc__.splitlines()[0], default.get_config())
    config = mnist_cli.apply_flags(default.get_config(), flags)
    train.train_and_evaluate(config, flags.workdir)


if __name__ == "__main__":
    main()
