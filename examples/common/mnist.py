"""The data of Flax's two MNIST examples (the role of Flax's ``input_pipeline.py``).

`get_datasets` reads Keras' ``mnist.npz`` from ``config.data_dir`` (never
downloads) or makes synthetic MNIST-like data. Their command line is
`common.mnist_cli`.
"""

from __future__ import annotations

import os

import numpy as np

Dataset = dict[str, np.ndarray]


def get_datasets(config) -> tuple[Dataset, Dataset]:
    """Train and test sets: Keras' ``mnist.npz`` from ``config.data_dir``, else synthetic."""
    if config.data_dir:
        path = os.path.join(config.data_dir, "mnist.npz")
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"{path} not found. Fix: put Keras' mnist.npz (x_train, y_train, x_test, "
                "y_test) there, or leave out --data-dir for synthetic data."
            )
        with np.load(path) as f:
            x_train, y_train, x_test, y_test = (
                f[k] for k in ("x_train", "y_train", "x_test", "y_test")
            )
        n = config.test_size
        return (
            {"image": x_train[..., None] / np.float32(255.0), "label": y_train.astype(np.int32)},
            {
                "image": x_test[:n, ..., None] / np.float32(255.0),
                "label": y_test[:n].astype(np.int32),
            },
        )
    # Synthetic, MNIST-like: each class has a fixed "digit", a random pattern of
    # 4x4 blocks (a quarter of them on); an example is its class's digit with
    # random pixel intensities, 20% salt noise, shifted by up to 6 pixels.
    rng = np.random.default_rng(1234)
    digits = np.kron(rng.uniform(size=(10, 7, 7)) > 0.75, np.ones((4, 4))).astype(np.float32)

    def sample(n):
        labels = rng.integers(0, 10, size=n).astype(np.int32)
        images = digits[labels] * rng.uniform(size=(n, 28, 28)).astype(np.float32)
        images = np.maximum(images, rng.uniform(size=(n, 28, 28)) < 0.2).astype(np.float32)
        shifts = rng.integers(-6, 7, size=(n, 2))
        images = np.stack(
            [np.roll(x, tuple(s), (0, 1)) for x, s in zip(images, shifts, strict=True)]
        )
        return {"image": images[..., None], "label": labels}

    return sample(config.train_size), sample(config.test_size)
