"""Flax's NNX MNIST example (same model, loss, optimizer and steps), trained with coarse_jax.

Flax's NNX MNIST as ``examples/mnist/train.py`` writes it: `CNN` (an
``nnx.Module`` with BatchNorm and Dropout) called with an ``nnx.Rngs``, `loss_fn`
taking the ``rngs`` too, `train_step` and `eval_step` updating an
``nnx.Optimizer`` (SGD with momentum) and an ``nnx.MultiMetric`` in place, and
the loop switching ``model.train()`` / ``model.eval()``; it logs the metrics
every ``eval_every`` steps. Flax's steps are kept
unchanged as the reference (``impl="flax"``, one device); the coarse steps
beside them differ in the lines marked ``# coarse:``: ``@nnx.jit`` becomes
``@coarse.sync(mesh)`` and ``nnx.value_and_grad`` becomes
``coarse.value_and_grad``. The metrics each worker accumulates on its shard
are averaged over the workers by ``coarse.sync``, so ``metrics.compute()``
is the global value.

Data: synthetic MNIST-shaped images (28x28x1 in [0, 1], 10 classes labelled
by a fixed random teacher) unless ``config.data_dir`` holds Keras'
``mnist.npz``; nothing is ever downloaded.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

import coarse_jax as coarse  # coarse

# examples/ on the path for the shared data (see examples/common/__init__.py).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common.mnist import Dataset, get_datasets


class CNN(nnx.Module):
    """A simple CNN model."""

    def __init__(self, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(1, 32, kernel_size=(3, 3), rngs=rngs)
        self.batch_norm1 = nnx.BatchNorm(32, rngs=rngs)
        self.dropout1 = nnx.Dropout(rate=0.025)
        self.conv2 = nnx.Conv(32, 64, kernel_size=(3, 3), rngs=rngs)
        self.batch_norm2 = nnx.BatchNorm(64, rngs=rngs)
        self.avg_pool = functools.partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
        self.linear1 = nnx.Linear(3136, 256, rngs=rngs)
        self.dropout2 = nnx.Dropout(rate=0.025)
        self.linear2 = nnx.Linear(256, 10, rngs=rngs)

    def __call__(self, x, rngs: nnx.Rngs):
        x = self.avg_pool(nnx.relu(self.batch_norm1(self.dropout1(self.conv1(x), rngs=rngs))))
        x = self.avg_pool(nnx.relu(self.batch_norm2(self.conv2(x))))
        x = x.reshape(x.shape[0], -1)  # flatten
        x = nnx.relu(self.dropout2(self.linear1(x), rngs=rngs))
        x = self.linear2(x)
        return x


def loss_fn(model: CNN, batch, rngs):
    logits = model(batch["image"], rngs)
    loss = optax.softmax_cross_entropy_with_integer_labels(
        logits=logits, labels=batch["label"]
    ).mean()
    return loss, logits


# Flax's steps, unchanged: the reference (impl "flax", one device).
@nnx.jit
def train_step(model: CNN, optimizer: nnx.Optimizer, metrics: nnx.MultiMetric, batch, rngs):
    """Train for a single step."""
    grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
    (loss, logits), grads = grad_fn(model, batch, rngs)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])  # In-place updates.
    optimizer.update(model, grads)  # In-place updates.


@nnx.jit
def eval_step(model: CNN, metrics: nnx.MultiMetric, batch):
    loss, logits = loss_fn(model, batch, None)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])  # In-place updates.


def coarse_steps(mesh):  # coarse: the steps are built on a mesh
    # The same steps, data-parallel over the mesh's workers, gradients synced by COARSE.
    @coarse.sync(mesh)  # coarse: was @nnx.jit
    def train_step(model: CNN, optimizer: nnx.Optimizer, metrics: nnx.MultiMetric, batch, rngs):
        """Train for a single step."""
        grad_fn = coarse.value_and_grad(loss_fn, has_aux=True)  # coarse: was nnx.value_and_grad
        (loss, logits), grads = grad_fn(model, batch, rngs)
        metrics.update(loss=loss, logits=logits, labels=batch["label"])  # In-place updates.
        optimizer.update(model, grads)  # In-place updates.

    @coarse.sync(mesh)  # coarse: was @nnx.jit
    def eval_step(model: CNN, metrics: nnx.MultiMetric, batch):
        loss, logits = loss_fn(model, batch, None)
        metrics.update(loss=loss, logits=logits, labels=batch["label"])  # In-place updates.

    return train_step, eval_step  # coarse


def batches(ds: Dataset, batch_size: int, seed: int | None) -> Iterator[Dataset]:
    """Batches of ``ds``, shuffled each epoch with ``seed`` (None: one pass, in order)."""
    n = len(ds["label"]) // batch_size * batch_size
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(ds["label"])) if seed is not None else np.arange(n)
        for i in range(0, n, batch_size):
            yield {k: v[order[i : i + batch_size]] for k, v in ds.items()}
        if seed is None:
            return


def train(steps, config, train_ds, test_ds, name, mesh=None, dropout_seed=0) -> dict[str, Any]:
    """Flax's NNX training loop with ``steps`` = (train_step, eval_step), Flax's or coarse's.

    ``mesh`` (coarse, with ``config.state_on_mesh``): the model, optimizer and metrics state
    is placed on it, replicated, as flax's sharding guide places state. ``dropout_seed``:
    the ``nnx.Rngs`` passed to the steps (Flax: 0).
    """
    train_step, eval_step = steps
    model = CNN(rngs=nnx.Rngs(config.seed))
    optimizer = nnx.Optimizer(
        model, optax.sgd(config.learning_rate, config.momentum), wrt=nnx.Param
    )
    metrics = nnx.MultiMetric(
        accuracy=nnx.metrics.Accuracy(),
        loss=nnx.metrics.Average("loss"),
    )
    if mesh is not None and config.state_on_mesh:  # coarse
        objects = (model, optimizer, metrics)
        replicated = NamedSharding(mesh, PartitionSpec())
        nnx.update(objects, jax.device_put(nnx.state(objects), replicated))  # coarse
    metrics_history: dict[str, list[float]] = {
        "train_loss": [],
        "train_accuracy": [],
        "test_loss": [],
        "test_accuracy": [],
    }
    history = []
    rngs = nnx.Rngs(dropout_seed)
    train_batches = batches(train_ds, config.batch_size, config.seed)
    model.train()  # Switch to train mode
    for step, batch in zip(range(config.num_steps), train_batches, strict=False):
        # Run the optimization for one step and make a stateful update to the following:
        # - The train state's model parameters
        # - The optimizer state
        # - The training loss and accuracy batch metrics
        train_step(model, optimizer, metrics, batch, rngs)

        if step > 0 and (step % config.eval_every == 0 or step == config.num_steps - 1):
            # Log the training metrics.
            for metric, value in metrics.compute().items():  # Compute the metrics.
                metrics_history[f"train_{metric}"].append(float(value))  # Record the metrics.
            metrics.reset()  # Reset the metrics for the test set.

            # Compute the metrics on the test set after each training epoch.
            model.eval()  # Switch to eval mode
            for test_batch in batches(test_ds, config.batch_size, None):
                eval_step(model, metrics, test_batch)
            model.train()  # Back to train mode

            # Log the test metrics.
            for metric, value in metrics.compute().items():
                metrics_history[f"test_{metric}"].append(float(value))
            metrics.reset()  # Reset the metrics for the next training epoch.

            record = {"impl": name, "step": step + 1}
            record.update({k: v[-1] for k, v in metrics_history.items()})
            history.append(record)
            print(
                f"{name:6s} step: {step + 1}, "
                f"train_loss: {record['train_loss']:.4f}, "
                f"train_accuracy: {record['train_accuracy'] * 100:.2f}, "
                f"test_loss: {record['test_loss']:.4f}, "
                f"test_accuracy: {record['test_accuracy'] * 100:.2f}"
            )
    return {"history": history, "metrics_history": metrics_history}


def train_and_evaluate(config, workdir: str) -> dict[str, Any]:
    """Execute model training and evaluation loop.

    Args:
      config: a `configs.default.Config`; ``config.impl`` picks Flax's steps,
        coarse's, or both (then the logged losses are compared).
      workdir: directory for ``metrics.jsonl`` (one line per log and impl).

    Returns:
      ``{impl: {"history": records, "metrics_history": Flax's lists}}``, plus
      ``max_rel_loss_diff`` (over the logged train and test losses) with impl "both".
    """
    train_ds, test_ds = get_datasets(config)
    impls = ("flax", "coarse") if config.impl == "both" else (config.impl,)
    runs = {}
    for impl in impls:
        if impl == "flax":
            runs[impl] = train((train_step, eval_step), config, train_ds, test_ds, impl)
        else:
            mesh = coarse.make_mesh(workers=config.workers, proxies=config.proxies)  # coarse
            runs[impl] = train(coarse_steps(mesh), config, train_ds, test_ds, impl, mesh)

    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
        for run in runs.values():
            for record in run["history"]:
                f.write(json.dumps(record) + "\n")
    if config.impl == "both":
        flax_h, coarse_h = runs["flax"]["metrics_history"], runs["coarse"]["metrics_history"]
        a = np.array(flax_h["train_loss"] + flax_h["test_loss"])
        b = np.array(coarse_h["train_loss"] + coarse_h["test_loss"])
        diff = np.abs(a - b)
        rel = float(np.max(diff / np.maximum(np.abs(a), 1e-6)))
        runs["max_rel_loss_diff"] = rel
        # The noise floor of a comparison at several workers: Flax's own run with
        # another dropout seed. One worker draws Flax's dropout masks and normalizes
        # the same batch; several draw their own masks and keep their own batch
        # statistics (nnx.BatchNorm without axis_name), so they match Flax only to it.
        other = train((train_step, eval_step), config, train_ds, test_ds, "flax'", dropout_seed=1)
        o = other["metrics_history"]
        floor = float(np.max(np.abs(a - np.array(o["train_loss"] + o["test_loss"]))))
        runs["noise_floor"] = floor
        print(
            f"final loss: flax train {flax_h['train_loss'][-1]:.6f} test "
            f"{flax_h['test_loss'][-1]:.6f}, coarse train {coarse_h['train_loss'][-1]:.6f} "
            f"test {coarse_h['test_loss'][-1]:.6f}"
        )
        print(
            f"max |loss_coarse - loss_flax| over {len(a)} logged losses: {diff.max():.3e} "
            f"(relative {rel:.3e}); noise floor (Flax, another dropout seed): {floor:.3e}"
        )
    return runs
