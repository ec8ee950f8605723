"""Trains one Flax MLP twice: with coarse_jax and with plain ``shard_map`` + ``lax.pmean``.

Both runs start from the same parameters, see the same synthetic batches and
use the same optax optimizer, so their loss curves must agree to float32
rounding. The demo also times a training step and the gradient
synchronization alone for both implementations.

``XLA_FLAGS=--xla_force_host_platform_device_count=8`` must be set before jax
is imported (``main.py`` does that) so that the CPU offers 2 * workers devices.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse

# examples/ on the path for the shared trainer (see examples/common/__init__.py).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import trainer

Batch = dict[str, Any]
StepFn = Callable[[train_state.TrainState, Batch], tuple[train_state.TrainState, jax.Array]]


class MLP(nn.Module):
    """A ReLU multilayer perceptron classifier."""

    hidden: Sequence[int]
    num_classes: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.num_classes)(x)


# ----------------------------------------------------------------------------- data


def make_data(config: Any) -> tuple[Batch, Batch]:
    """Synthetic classification data labelled by a fixed random linear teacher.

    Returns:
      ``(train, test)``: train holds one batch per step (leading axes
      ``(steps, batch_size)``), test holds ``eval_size`` examples.
    """
    rng = np.random.default_rng(config.seed)
    teacher = rng.normal(size=(config.input_dim, config.num_classes)) / np.sqrt(config.input_dim)

    def sample(n: int) -> Batch:
        x = rng.normal(size=(n, config.input_dim))
        logits = x @ teacher + config.label_noise * rng.normal(size=(n, config.num_classes))
        return {"x": x.astype(np.float32), "y": logits.argmax(-1).astype(np.int32)}

    train = sample(config.steps * config.batch_size)
    train = {k: v.reshape(config.steps, config.batch_size, *v.shape[1:]) for k, v in train.items()}
    return train, sample(config.eval_size)


# ----------------------------------------------------------------------------- steps


def coarse_sync_only(mesh: jax.sharding.Mesh, cfg: coarse.Config) -> Callable[[Any], Any]:
    """Only the gradient sync: ``coarse.all_reduce`` of a per-worker gradient tree.

    The tree is the batch argument with a leading axis of one slice per worker,
    so every worker reduces its own values, as after a backward pass.
    """

    @coarse.sync(mesh, config=cfg)
    def sync_grads(per_worker: Any) -> Any:
        return coarse.all_reduce(jax.tree.map(lambda x: x[0], per_worker))

    return sync_grads


def pmean_sync_only(mesh: jax.sharding.Mesh) -> Callable[[Any], Any]:
    """Only the gradient sync: ``lax.pmean`` of a per-worker gradient tree."""

    def sync_grads(per_worker: Any) -> Any:
        return lax.pmean(jax.tree.map(lambda x: x[0], per_worker), "data")

    return jax.jit(jax.shard_map(sync_grads, mesh=mesh, in_specs=P("data"), out_specs=P()))


# ----------------------------------------------------------------------------- running


def median_call_s(fn: Callable[[Any], Any], arg: Any, calls: int, warmup: int = 3) -> float:
    """Median wall time of ``fn(arg)`` over ``calls`` calls, after compiling and warming up."""
    for _ in range(warmup):
        jax.block_until_ready(fn(arg))
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(fn(arg))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def accuracy(state: train_state.TrainState, test: Batch) -> float:
    """Top-1 accuracy on the held-out set."""
    logits = jax.jit(state.apply_fn)(state.params, test["x"])
    return float((np.asarray(logits).argmax(-1) == test["y"]).mean())


def leading_bytes(params: Any, layers: int) -> int:
    """Bytes of the first ``layers`` Dense layers: the prefix coarse reduces on the workers."""
    first = list(params["params"].values())[:layers]
    return sum(leaf.nbytes for leaf in jax.tree.leaves(first))


def write_jsonl(path: str, records: Iterator[dict[str, Any]]) -> None:
    with open(path, "w") as f:
        f.writelines(json.dumps(record) + "\n" for record in records)


def train_and_evaluate(config: Any, workdir: str) -> dict[str, Any]:
    """Trains the MLP with coarse and with pmean, compares them and times both.

    Prints the coarse plan, a progress bar per run, the largest loss-curve
    difference and a timing table; writes ``metrics.jsonl`` into ``workdir``.

    Args:
      config: a `configs.default.DemoConfig`.
      workdir: directory for the metrics (created if missing).

    Returns:
      A summary dict (final losses, loss-curve differences, accuracies,
      median step and sync times in seconds, the metrics path).
    """
    os.makedirs(workdir, exist_ok=True)
    p = config.workers
    if config.batch_size % p:
        raise ValueError(f"batch_size {config.batch_size} must be a multiple of workers {p}.")

    coarse_mesh = coarse.make_mesh(workers=p)
    pmean_mesh = jax.make_mesh((p,), ("data",), devices=jax.devices()[:p])

    model = MLP(hidden=config.hidden, num_classes=config.num_classes)
    params = model.init(jax.random.key(config.seed), jnp.zeros((1, config.input_dim)))
    tx = optax.sgd(config.learning_rate, momentum=config.momentum)
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)

    cfg = coarse.Config(
        shard_bytes=config.shard_bytes,
        leading_bytes=leading_bytes(params, config.leading_layers),
    )
    print(coarse.plan(params, coarse_mesh, cfg).summary())
    print()

    train_data, test = make_data(config)
    coarse_data = trainer.place_batches(train_data, NamedSharding(coarse_mesh, P("data")))
    pmean_data = trainer.place_batches(train_data, NamedSharding(pmean_mesh, P("data")))

    # Place the initial state replicated on each mesh, as the steps return it,
    # so that only the first step compiles (an uncommitted input would
    # recompile on the second step).
    runs = {
        "coarse": trainer.train(
            trainer.coarse_train_step(coarse_mesh, cfg, trainer.classification_loss),
            jax.device_put(state, NamedSharding(coarse_mesh, P())),
            coarse_data,
            "coarse",
        ),
        "pmean": trainer.train(
            trainer.pmean_train_step(pmean_mesh, trainer.classification_loss),
            jax.device_put(state, NamedSharding(pmean_mesh, P())),
            pmean_data,
            "pmean ",
        ),
    }

    # Sync-only timing on a gradient-shaped tree with different values per worker.
    rng = np.random.default_rng(config.seed + 1)
    per_worker = jax.tree.map(lambda x: rng.normal(size=(p, *x.shape)).astype(np.float32), params)
    sync_s = {
        "coarse": median_call_s(
            coarse_sync_only(coarse_mesh, cfg),
            jax.device_put(per_worker, NamedSharding(coarse_mesh, P("data"))),
            config.timing_calls,
        ),
        "pmean": median_call_s(
            pmean_sync_only(pmean_mesh),
            jax.device_put(per_worker, NamedSharding(pmean_mesh, P("data"))),
            config.timing_calls,
        ),
    }

    a, b = np.array(runs["coarse"].losses), np.array(runs["pmean"].losses)
    max_abs, max_rel = trainer.compare(runs)
    step_s = {name: run.median_step_s for name, run in runs.items()}
    acc = {name: accuracy(run.state, test) for name, run in runs.items()}

    print()
    print(f"loss: first {b[0]:.4f}, last coarse {a[-1]:.6f}, last pmean {b[-1]:.6f}")
    print(
        f"max |loss_coarse - loss_pmean| over {len(a)} steps: {max_abs:.3e} "
        f"(relative {max_rel:.3e})"
    )
    print(f"test accuracy: coarse {acc['coarse']:.4f}, pmean {acc['pmean']:.4f}")
    print()
    print(f"{'impl':<8} {'median step (ms)':>17} {'median sync (ms)':>17}")
    for name in runs:
        print(f"{name:<8} {step_s[name] * 1e3:>17.3f} {sync_s[name] * 1e3:>17.3f}")

    metrics_path = os.path.join(workdir, "metrics.jsonl")

    def records() -> Iterator[dict[str, Any]]:
        for name, run in runs.items():
            times = [None, *run.step_times_s]  # step 0 compiled, not timed
            for i, (loss, t) in enumerate(zip(run.losses, times, strict=True)):
                yield {"impl": name, "step": i, "loss": loss, "step_time_s": t}
        for name in runs:
            yield {
                "impl": name,
                "summary": True,
                "median_step_s": step_s[name],
                "median_sync_s": sync_s[name],
                "test_accuracy": acc[name],
            }
        yield {"max_abs_loss_diff": max_abs, "max_rel_loss_diff": max_rel}

    write_jsonl(metrics_path, records())
    print(f"\nmetrics written to {metrics_path}")
    return {
        "final_loss": {"coarse": float(a[-1]), "pmean": float(b[-1])},
        "max_abs_loss_diff": max_abs,
        "max_rel_loss_diff": max_rel,
        "test_accuracy": acc,
        "median_step_s": step_s,
        "median_sync_s": sync_s,
        "metrics_path": metrics_path,
    }
