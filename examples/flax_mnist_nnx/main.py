"""Flax's NNX MNIST example with coarse_jax: Flax's step beside the coarse one.

Run: ``python examples/flax_mnist_nnx/main.py [--impl both] [--steps N]``.

Flags: --impl {flax,coarse,both} (default both: train with each from the same
initial parameters and batches, print both final losses and the largest
per-step difference), --steps, --workers, --workdir (metrics.jsonl),
--data-dir (a directory holding Keras' mnist.npz; synthetic data if omitted,
nothing is ever downloaded). Lines that differ from Flax's main.py are
marked ``# coarse:``.
"""

from __future__ import annotations

import argparse
import os

# coarse: the CPU must offer 8 devices (4 workers + 4 proxies); XLA reads this
# only when jax initializes its backend, so it is set before anything imports jax.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")  # coarse

import train
from configs import default


def main() -> None:
    # Flax uses absl flags and ml_collections; argparse here, same roles.
    config = default.get_config()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=os.path.join("out", "flax_mnist_nnx"))
    parser.add_argument("--steps", type=int, default=config.num_steps)
    parser.add_argument("--data-dir", default=None, help="holds mnist.npz; synthetic if omitted")
    parser.add_argument("--workers", type=int, default=config.workers)  # coarse
    parser.add_argument("--impl", choices=("flax", "coarse", "both"), default="both")  # coarse
    args = parser.parse_args()
    config.num_steps = args.steps
    config.data_dir = args.data_dir
    config.workers = args.workers  # coarse
    config.impl = args.impl  # coarse
    train.train_and_evaluate(config, args.workdir)


if __name__ == "__main__":
    main()
