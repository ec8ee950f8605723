"""Equinox's CNN-on-MNIST with coarse_jax: the Equinox step beside the coarse one.

Run: ``python examples/equinox_mnist/main.py [--steps N] [--workdir DIR]``.

Flags: --steps (default 20), --workers (default 4; 4 proxies beside them, so at
most 4 on the 8 CPU devices), --workdir (metrics.jsonl: one line per step and
implementation, with "impl" and "loss"), --optimizer {workers,proxy} (workers:
``coarse.value_and_grad`` and optax's Adam on the workers; proxy:
``coarse.value_and_update`` with ``coarse.optim.adam``, the update run on the
proxies). The data are synthetic, MNIST-shaped (28x28x1, 10 classes); nothing
is downloaded.

The model is the CNN of docs/guides/equinox.md (a list of layers mixing
Modules and plain functions, a Dropout with a per-worker key, an MLP head).
Both implementations train it from the same initial model on the same batches:
``equinox`` is the step written data-parallel by hand (``eqx.filter_jit`` around
``jax.shard_map`` with ``lax.pmean`` of the gradients), ``coarse`` is Equinox's
plain train step with the lines marked ``# coarse:`` changed. Each worker folds
its index into the dropout key in both, so the masks, and the curves, agree to
float32 rounding. The exit status is 1 if the loss curves differ by a relative
1e-4 or more at any step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

# coarse: the CPU must offer 8 devices (4 workers + 4 proxies); XLA reads this
# only when jax initializes its backend, so it is set before anything imports jax.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")  # coarse

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse  # coarse

PER_WORKER_BATCH = 16
LEARNING_RATE = 1e-3


class CNN(eqx.Module):
    layers: list
    dropout: eqx.nn.Dropout
    head: eqx.nn.MLP

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.layers = [
            eqx.nn.Conv2d(1, 4, kernel_size=3, key=k1),  # 28x28 -> 26x26
            eqx.nn.MaxPool2d(kernel_size=2),  # stride 1: 26x26 -> 25x25
            jax.nn.relu,
            jnp.ravel,
        ]
        self.dropout = eqx.nn.Dropout(0.1)
        self.head = eqx.nn.MLP(4 * 25 * 25, 10, width_size=32, depth=1, key=k2)

    def __call__(self, x, key):
        for layer in self.layers:
            x = layer(x)
        return jax.nn.log_softmax(self.head(self.dropout(x, key=key)))


def loss_fn(model, x, y, key):
    keys = jax.random.split(key, x.shape[0])  # one dropout key per example
    logp = jax.vmap(model)(x, keys)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def synthetic_batches(steps, batch, seed=0):
    """MNIST-shaped batches: a fixed pattern per class, shifted at random, plus noise."""
    rng = np.random.default_rng(seed)
    templates = rng.standard_normal((10, 1, 28, 28)).astype(np.float32)
    for _ in range(steps):
        y = rng.integers(0, 10, batch).astype(np.int32)
        shifts = rng.integers(-2, 3, (batch, 2))
        x = np.stack(
            [np.roll(templates[c], tuple(s), axis=(1, 2)) for c, s in zip(y, shifts, strict=True)]
        )
        yield x + 0.5 * rng.standard_normal(x.shape).astype(np.float32), y


def equinox_step(workers, optim):
    """Equinox's step, data-parallel by hand: shard_map over ("data",) and lax.pmean."""
    flat = Mesh(np.array(jax.devices()[:workers]), ("data",))

    @eqx.filter_jit
    def train_step(model, opt_state, x, y, key):
        params, static = eqx.partition(model, eqx.is_array)  # shard_map takes arrays only

        @jax.shard_map(mesh=flat, in_specs=(P(), P(), P("data"), P("data"), P()), out_specs=P())
        def step(params, opt_state, x, y, key):
            key = jax.random.fold_in(key, lax.axis_index("data"))  # each worker's own masks
            # Varying params: otherwise their gradients come back already summed.
            local = eqx.combine(lax.pcast(params, "data", to="varying"), static)
            loss, grads = eqx.filter_value_and_grad(loss_fn)(local, x, y, key)
            loss, grads = lax.pmean((loss, grads), "data")
            updates, opt_state = optim.update(grads, opt_state, params)
            return eqx.apply_updates(params, updates), opt_state, loss

        params, opt_state, loss = step(params, opt_state, x, y, key)
        return eqx.combine(params, static), opt_state, loss

    return train_step


def coarse_step(mesh, optim):  # coarse: the step is built on a mesh
    @coarse.sync(mesh, batch_argnums=(2, 3))  # coarse: was @eqx.filter_jit
    def train_step(model, opt_state, x, y, key):
        key = jax.random.fold_in(key, lax.axis_index("data"))  # each worker's own masks
        grad_fn = coarse.value_and_grad(loss_fn)  # coarse: was eqx.filter_value_and_grad
        loss, grads = grad_fn(model, x, y, key)
        updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, loss

    return train_step


def coarse_update_step(mesh, opt):  # coarse: the optimizer on the proxies
    @coarse.sync(mesh, batch_argnums=(2, 3))  # coarse: was @eqx.filter_jit
    def train_step(model, opt_state, x, y, key):  # opt_state: None, the proxies hold it
        key = jax.random.fold_in(key, lax.axis_index("data"))
        loss, model = coarse.value_and_update(loss_fn, opt)(model, x, y, key)  # coarse: new
        return model, opt_state, loss

    return train_step


def train(name, step, model, opt_state, batches, out):
    losses = []
    for i, (x, y) in enumerate(batches):
        model, opt_state, loss = step(model, opt_state, x, y, jax.random.key(i))
        losses.append(float(loss))
        print(json.dumps({"impl": name, "step": i, "loss": losses[-1]}), file=out, flush=True)
    return losses


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--workdir", default=".")
    parser.add_argument("--optimizer", choices=("workers", "proxy"), default="workers")
    flags = parser.parse_args(argv)
    os.makedirs(flags.workdir, exist_ok=True)

    batches = list(synthetic_batches(flags.steps, PER_WORKER_BATCH * flags.workers))
    model = CNN(jax.random.key(0))
    optim = optax.adam(LEARNING_RATE)
    opt_state = optim.init(eqx.filter(model, eqx.is_array))
    mesh = coarse.make_mesh(workers=flags.workers)  # coarse: the workers' mesh, proxies beside
    if flags.optimizer == "proxy":
        step, coarse_state = coarse_update_step(mesh, coarse.optim.adam(LEARNING_RATE)), None
    else:
        step, coarse_state = coarse_step(mesh, optim), opt_state

    with open(os.path.join(flags.workdir, "metrics.jsonl"), "w") as out:
        eqx_step = equinox_step(flags.workers, optim)
        eqx_losses = train("equinox", eqx_step, model, opt_state, batches, out)
        coarse_losses = train("coarse", step, model, coarse_state, batches, out)

    rel = max(abs(c - e) / abs(e) for c, e in zip(coarse_losses, eqx_losses, strict=True))
    match = rel < 1e-4
    print(f"final loss: equinox {eqx_losses[-1]:.6f}, coarse {coarse_losses[-1]:.6f}")
    print(f"max relative loss difference over {flags.steps} steps: {rel:.2e}")
    print(f"loss curves match (relative diff < 1e-4): {match}")
    return 0 if match else 1


if __name__ == "__main__":
    sys.exit(main())
