"""The command line of Flax's two MNIST examples (flax_mnist_linen, flax_mnist_nnx).

Flax's ``main.py`` takes ``--workdir`` and an ml_collections ``--config``
through absl flags; here argparse sets the config's fields one flag each
(no ml_collections). The flags marked ``# coarse:`` are not Flax's. Each
``main.py`` reads top to bottom: `parse_flags`, `apply_flags` to its default
config, ``train.train_and_evaluate``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any


def parse_flags(name: str, description: str, defaults: Any) -> argparse.Namespace:
    """The flags, with ``defaults``' values (``--workdir`` defaults to ``out/<name>``)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--workdir", default=os.path.join("out", name))
    parser.add_argument("--steps", type=int, default=defaults.num_steps)
    parser.add_argument("--data-dir", default=None, help="holds mnist.npz; synthetic if omitted")
    parser.add_argument("--workers", type=int, default=defaults.workers)  # coarse
    parser.add_argument(  # coarse
        "--proxies",
        type=int,
        default=defaults.proxies,
        help="coarse's proxies, dividing --workers (COARSE k:1); default one per worker",
    )
    parser.add_argument("--impl", choices=("flax", "coarse", "both"), default="both")  # coarse
    parser.add_argument(  # coarse
        "--state-on-mesh",
        action="store_true",
        help="place the train state on the coarse mesh, replicated, before training "
        "(as jax's and flax's sharding guides place state)",
    )
    return parser.parse_args()


def apply_flags(config: Any, flags: argparse.Namespace) -> Any:
    """``config`` with the fields the flags set replaced by their values."""
    return dataclasses.replace(
        config,
        num_steps=flags.steps,
        data_dir=flags.data_dir,
        workers=flags.workers,  # coarse
        proxies=flags.proxies,  # coarse
        impl=flags.impl,  # coarse
        state_on_mesh=flags.state_on_mesh,  # coarse
    )
