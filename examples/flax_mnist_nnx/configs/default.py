"""Default hyperparameters for the NNX MNIST example (Flax's, plus the coarse ones)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Config:
    """Flax's NNX MNIST hyperparameters (a dataclass: ml_collections is not a dependency).

    Attributes:
      learning_rate, momentum: ``optax.sgd``'s, as Flax's example (Flax: 0.1 at
        batch 128; 0.05 here at batch 32).
      batch_size: examples per step (Flax: 32), split over the workers.
      num_steps: optimizer steps (Flax: ``train_steps`` 1200).
      eval_every: steps between train/test metric logs (Flax: 200); the last
        step logs too.
      train_size, test_size: sizes of the synthetic data sets (with
        ``data_dir``: the first ``test_size`` test images; all training images).
      data_dir: a directory holding Keras' ``mnist.npz``; None: synthetic data.
      workers: data-parallel workers (coarse adds as many proxies).
      proxies: coarse's proxies, dividing ``workers`` (each serves
        ``workers / proxies`` of them, COARSE k:1); None: one per worker.
      impl: "flax" (Flax's step, one device), "coarse", or "both".
      state_on_mesh: coarse only: place the train state on the coarse mesh,
        replicated (``NamedSharding(mesh, P())``), before training, as jax's
        and flax's sharding guides place state; the step's outputs then come
        back on that mesh too.
      seed: initial parameters and batch order.
    """

    learning_rate: float = 0.05
    momentum: float = 0.9
    batch_size: int = 32
    num_steps: int = 100
    eval_every: int = 25
    train_size: int = 3200
    test_size: int = 1024
    data_dir: str | None = None
    workers: int = 4  # coarse
    proxies: int | None = None  # coarse
    impl: str = "both"  # coarse
    state_on_mesh: bool = False  # coarse
    seed: int = 0


def get_config() -> Config:
    """Returns the default configuration."""
    return Config()
