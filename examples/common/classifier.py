"""The loss and the held-out metric of the classifier examples (demo, cnn, resnet18).

A batch is ``{"x": inputs, "y": integer labels}``; the model's ``apply``
returns logits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax
from flax.training import train_state

Batch = dict[str, Any]


def classification_loss(apply_fn: Callable[..., jax.Array]) -> Callable[[Any, Batch], jax.Array]:
    """Mean softmax cross-entropy of one worker's batch, as a function of (params, batch)."""

    def loss(params: Any, batch: Batch) -> jax.Array:
        logits = apply_fn(params, batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

    return loss


def accuracy(
    apply_fn: Callable[..., jax.Array], test: Batch, chunk: int | None = None
) -> Callable[[train_state.TrainState], float]:
    """An ``evaluate(state)``: top-1 accuracy of ``apply_fn`` on ``test["x"]`` / ``test["y"]``.

    ``chunk``: predict that many examples at a time (bounds the memory of
    big models); None: all at once.
    """
    predict = jax.jit(apply_fn)

    def evaluate(state: train_state.TrainState) -> float:
        params = jax.device_get(state.params)
        n = len(test["y"])
        step = chunk or n
        hits = [
            np.asarray(predict(params, test["x"][i : i + step])).argmax(-1)
            == test["y"][i : i + step]
            for i in range(0, n, step)
        ]
        return float(np.concatenate(hits).mean())

    return evaluate
