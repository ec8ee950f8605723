"""Flax's Linen MNIST example (same model, loss, optimizer and step), trained with coarse_jax.

The shape of Flax's ``examples/mnist/train.py`` (Linen version): `CNN`,
`apply_model` (gradients, loss and accuracy of one batch), `update_model`,
`train_epoch`, `create_train_state`, `train_and_evaluate`. Flax's step is
kept unchanged as the reference (``impl="flax"``, one device); the coarse
step beside it differs in the lines marked ``# coarse:``.

Data: synthetic MNIST-shaped images (28x28x1 in [0, 1], 10 classes labelled
by a fixed random teacher) unless ``config.data_dir`` holds Keras'
``mnist.npz``; nothing is ever downloaded.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state
from jax.sharding import NamedSharding, PartitionSpec

import coarse_jax as coarse  # coarse

# examples/ on the path for the shared data (see examples/common/__init__.py).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common.mnist import get_datasets


class CNN(nn.Module):
    """A simple CNN model."""

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(features=32, kernel_size=(3, 3))(x)
        x = nn.relu(x)
        x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
        x = nn.Conv(features=64, kernel_size=(3, 3))(x)
        x = nn.relu(x)
        x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))  # flatten
        x = nn.Dense(features=256)(x)
        x = nn.relu(x)
        x = nn.Dense(features=10)(x)
        return x


# Flax's step, unchanged: the reference (impl "flax", one device).
@jax.jit
def apply_model(state, images, labels):
    """Computes gradients, loss and accuracy for a single batch."""

    def loss_fn(params):
        logits = state.apply_fn({"params": params}, images)
        one_hot = jax.nn.one_hot(labels, 10)
        loss = jnp.mean(optax.softmax_cross_entropy(logits=logits, labels=one_hot))
        return loss, logits

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (loss, logits), grads = grad_fn(state.params)
    accuracy = jnp.mean(jnp.argmax(logits, -1) == labels)
    return grads, loss, accuracy


def coarse_apply_model(mesh):  # coarse: the step is built on a mesh
    # The same step, data-parallel over the mesh's workers, gradients synced by COARSE.
    @coarse.sync(mesh, batch_argnums=(1, 2))  # coarse: was @jax.jit
    def apply_model(state, images, labels):
        """Computes gradients, loss and accuracy for a single batch."""

        def loss_fn(params):
            logits = state.apply_fn({"params": params}, images)
            one_hot = jax.nn.one_hot(labels, 10)
            loss = jnp.mean(optax.softmax_cross_entropy(logits=logits, labels=one_hot))
            return loss, logits

        grad_fn = coarse.value_and_grad(loss_fn, has_aux=True)  # coarse: was jax.value_and_grad
        (loss, logits), grads = grad_fn(state.params)
        accuracy = coarse.all_reduce(jnp.mean(jnp.argmax(logits, -1) == labels))  # coarse
        return grads, loss, accuracy

    return apply_model  # coarse


@jax.jit
def update_model(state, grads):
    return state.apply_gradients(grads=grads)


def train_epoch(apply_model, state, train_ds, batch_size, rng, max_steps):
    """Train for a single epoch (at most ``max_steps`` steps; returns per-step values)."""
    train_ds_size = len(train_ds["image"])
    steps_per_epoch = train_ds_size // batch_size

    perms = jax.random.permutation(rng, len(train_ds["image"]))
    perms = perms[: steps_per_epoch * batch_size]  # skip incomplete batch
    perms = perms.reshape((steps_per_epoch, batch_size))[:max_steps]

    epoch_loss = []
    epoch_accuracy = []

    for perm in np.asarray(perms):
        batch_images = train_ds["image"][perm, ...]
        batch_labels = train_ds["label"][perm, ...]
        grads, loss, accuracy = apply_model(state, batch_images, batch_labels)
        state = update_model(state, grads)
        epoch_loss.append(float(loss))
        epoch_accuracy.append(float(accuracy))
    return state, epoch_loss, epoch_accuracy


def create_train_state(rng, config):
    """Creates initial `TrainState`."""
    cnn = CNN()
    params = cnn.init(rng, jnp.ones([1, 28, 28, 1]))["params"]
    tx = optax.sgd(config.learning_rate, config.momentum)
    return train_state.TrainState.create(apply_fn=cnn.apply, params=params, tx=tx)


def train(apply_model, config, train_ds, test_ds, name, mesh=None) -> dict[str, Any]:
    """Flax's epoch loop with ``apply_model`` (Flax's or coarse's); ``config.num_steps`` steps.

    ``mesh`` (coarse, with ``config.state_on_mesh``): the state is placed on it, replicated,
    as jax's sharding guide places state; the jitted ``update_model`` then takes it together
    with the coarse step's gradients, which come back on the same mesh.
    """
    rng = jax.random.key(config.seed)
    rng, init_rng = jax.random.split(rng)
    state = create_train_state(init_rng, config)
    if mesh is not None and config.state_on_mesh:  # coarse
        state = jax.device_put(state, NamedSharding(mesh, PartitionSpec()))  # coarse
    losses, history = [], []
    epoch = 0
    while len(losses) < config.num_steps:
        epoch += 1
        rng, input_rng = jax.random.split(rng)
        state, epoch_loss, epoch_accuracy = train_epoch(
            apply_model,
            state,
            train_ds,
            config.batch_size,
            input_rng,
            config.num_steps - len(losses),
        )
        _, test_loss, test_accuracy = apply_model(state, test_ds["image"], test_ds["label"])
        losses += epoch_loss
        record = {
            "impl": name,
            "epoch": epoch,
            "steps": len(losses),
            "train_loss": float(np.mean(epoch_loss)),
            "train_accuracy": float(np.mean(epoch_accuracy)) * 100,
            "test_loss": float(test_loss),
            "test_accuracy": float(test_accuracy) * 100,
        }
        history.append(record)
        print(
            f"{name:6s} epoch:{epoch:3d}, steps: {len(losses)}, "
            f"train_loss: {record['train_loss']:.4f}, "
            f"train_accuracy: {record['train_accuracy']:.2f}, "
            f"test_loss: {record['test_loss']:.4f}, "
            f"test_accuracy: {record['test_accuracy']:.2f}"
        )
    return {"losses": losses, "history": history}


def train_and_evaluate(config, workdir: str) -> dict[str, Any]:
    """Execute model training and evaluation loop.

    Args:
      config: a `configs.default.Config`; ``config.impl`` picks Flax's step,
        coarse's, or both (then the loss curves are compared step by step).
      workdir: directory for ``metrics.jsonl`` (one line per epoch and impl).

    Returns:
      ``{impl: {"losses": per-step losses, "history": per-epoch records}}``,
      plus ``max_rel_loss_diff`` with impl "both".
    """
    train_ds, test_ds = get_datasets(config)
    impls = ("flax", "coarse") if config.impl == "both" else (config.impl,)
    runs = {}
    for impl in impls:
        if impl == "flax":
            runs[impl] = train(apply_model, config, train_ds, test_ds, impl)
        else:
            mesh = coarse.make_mesh(workers=config.workers, proxies=config.proxies)  # coarse
            runs[impl] = train(coarse_apply_model(mesh), config, train_ds, test_ds, impl, mesh)

    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
        for run in runs.values():
            for record in run["history"]:
                f.write(json.dumps(record) + "\n")
    if config.impl == "both":
        a, b = np.array(runs["flax"]["losses"]), np.array(runs["coarse"]["losses"])
        diff = np.abs(a - b)
        rel = float(np.max(diff / np.maximum(np.abs(a), 1e-6)))
        runs["max_rel_loss_diff"] = rel
        print(f"final loss: flax {a[-1]:.6f}, coarse {b[-1]:.6f}")
        print(
            f"max |loss_coarse - loss_flax| over {len(a)} steps: {diff.max():.3e} "
            f"(relative {rel:.3e})"
        )
        # ReLU's derivative jumps at 0: once rounding moves a pre-activation
        # across it, the curves part by more than rounding (see README).
        close = diff / np.maximum(np.abs(a), 1e-6) < 1e-4
        agree = len(a) if close.all() else int(np.argmin(close))
        print(f"curves agree to a relative 1e-4 for the first {agree} of {len(a)} steps")
    return runs
