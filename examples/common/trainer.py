"""Trains one model twice, with coarse_jax and with ``shard_map`` + ``lax.pmean``, and compares.

What an example provides: a Flax model, its initial parameters, a loss
(``make_loss(apply_fn) -> loss(params, batch)``), one batch per step (numpy,
leading axes ``(steps, global_batch)``) and optionally an evaluation. What
this module does, the same way for every example: builds both train steps,
places the same initial state and the same batches on each mesh, runs both
with a progress bar, times every step (and, if asked, the gradient sync
alone), prints the loss-curve difference and a timing table, writes
``metrics.jsonl`` and, if asked, ``loss.png``. The config is a
`common.config.BaseConfig`.

``XLA_FLAGS=--xla_force_host_platform_device_count=8`` must be set before jax
is imported (every ``main.py`` does that) so the CPU offers ``workers +
proxies`` devices.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from tqdm import tqdm

import coarse_jax as coarse
from coarse_jax.mesh import workers_mesh

Batch = dict[str, Any]
LossFn = Callable[[Any, Batch], jax.Array]
MakeLoss = Callable[[Callable[..., Any]], LossFn]
StepFn = Callable[[train_state.TrainState, Batch], tuple[train_state.TrainState, jax.Array]]

IMPLS = ("coarse", "pmean")
# The noise-floor run: pmean's step with the worker gradients summed in another,
# equally valid float32 order (see `reversed_mean`).
REVERSED = "pmean-reversed"
MATCH_RTOL = 1e-4  # the demo's rule: curves must agree to a relative 1e-4 at every step


# ----------------------------------------------------------------------------- steps


def coarse_train_step(mesh: Mesh, cfg: coarse.Config, make_loss: MakeLoss) -> StepFn:
    """A step whose gradients are synchronized by coarse (proxies + worker ring).

    ``make_loss`` gets ``state.apply_fn`` and is closed over rather than
    passed: `coarse.value_and_grad` traces every positional argument as an array.
    """

    @coarse.sync(mesh, config=cfg)
    def train_step(state: train_state.TrainState, batch: Batch) -> Any:
        loss, grads = coarse.value_and_grad(make_loss(state.apply_fn))(state.params, batch)
        # grads are identical on every device of both tiers, so every device
        # applies the same update and the replicated state stays replicated.
        return state.apply_gradients(grads=grads), loss

    return train_step


def coarse_proxy_train_step(
    mesh: Mesh, cfg: coarse.Config, make_loss: MakeLoss, optimizer: coarse.ProxyOptimizer
) -> StepFn:
    """A step whose optimizer runs on the proxies (`coarse.value_and_update`).

    The state's ``tx`` is ``optax.identity()``: the workers hold no optimizer
    state; the proxies keep the momentum and an f32 master of the params.
    """

    @coarse.sync(mesh, config=cfg)
    def train_step(state: train_state.TrainState, batch: Batch) -> Any:
        loss, params = coarse.value_and_update(make_loss(state.apply_fn), optimizer)(
            state.params, batch
        )
        return state.replace(step=state.step + 1, params=params), loss

    return train_step


def reversed_mean(x: jax.Array, axis: str = "data") -> jax.Array:
    """The mean over ``axis``, summed from the last worker to the first: ``((x3 + x2) + x1) + x0``.

    The same p terms as ``lax.pmean`` adds, in another order, so it is an
    equally valid float32 mean; the difference between training with it and
    with ``lax.pmean`` is the noise floor of any two all-reduce orders. The
    workers' values are gathered by a ``psum`` in which each slot holds one
    worker's value and p - 1 exact zeros (so the gather is exact and its
    result replicated), then added one at a time: XLA does not reassociate
    float additions.
    """
    p = lax.axis_size(axis)
    slots = jnp.zeros((p, *x.shape), x.dtype).at[lax.axis_index(axis)].set(x)
    xs = lax.psum(slots, axis)
    total = xs[p - 1]
    for i in range(p - 2, -1, -1):
        total = total + xs[i]
    return total / p


def _pmean(tree: Any, reduce: str) -> Any:
    if reduce == "pmean":
        return lax.pmean(tree, "data")
    if reduce == "reversed":
        return jax.tree.map(reversed_mean, tree)
    raise ValueError(f"reduce must be 'pmean' or 'reversed', got {reduce!r}")


def pmean_train_step(mesh: Mesh, make_loss: MakeLoss, reduce: str = "pmean") -> StepFn:
    """The same step with ``jax.value_and_grad`` + ``lax.pmean`` over a 1-D ("data",) mesh.

    ``reduce="reversed"`` sums the workers' gradients (and losses) in the
    reverse order instead (`reversed_mean`): the noise-floor run.
    """

    def train_step(state: train_state.TrainState, batch: Batch) -> Any:
        # Mark the replicated params as varying over "data": otherwise the
        # vjp of their implicit broadcast already psums the gradients and the
        # pmean below would see sums, not per-worker gradients.
        params = lax.pcast(state.params, "data", to="varying")
        loss, grads = jax.value_and_grad(make_loss(state.apply_fn))(params, batch)
        loss, grads = _pmean((loss, grads), reduce)
        return state.apply_gradients(grads=grads), loss

    return jax.jit(jax.shard_map(train_step, mesh=mesh, in_specs=(P(), P("data")), out_specs=P()))


def sync_only(mesh: Mesh, impl: str, cfg: coarse.Config | None = None) -> Callable[[Any], Any]:
    """Only ``impl``'s gradient sync of a per-worker tree, as a jitted function.

    The argument is a gradient-shaped tree with a leading axis of one slice per
    worker, placed split over "data", so every worker reduces its own values,
    as after a backward pass. ``impl``: "coarse" (``coarse.all_reduce`` under
    ``coarse.sync`` on the coarse ``mesh`` with ``cfg``), "pmean" or
    `REVERSED` (on a 1-D mesh).
    """
    if impl == "coarse":

        @coarse.sync(mesh, config=cfg)
        def coarse_sync(per_worker: Any) -> Any:
            return coarse.all_reduce(jax.tree.map(lambda x: x[0], per_worker))

        return coarse_sync
    reduce = "reversed" if impl == REVERSED else "pmean"

    def pmean_sync(per_worker: Any) -> Any:
        return _pmean(jax.tree.map(lambda x: x[0], per_worker), reduce)

    return jax.jit(jax.shard_map(pmean_sync, mesh=mesh, in_specs=P("data"), out_specs=P()))


def step0_gradients(
    mesh: Mesh,
    make_loss: MakeLoss,
    apply_fn: Callable[..., Any],
    params: Any,
    batch: Batch,
    impl: str,
    cfg: coarse.Config | None = None,
) -> Any:
    """The synchronized (mean) gradients of the first step, as numpy, from ``impl``'s step.

    ``impl``: "coarse" (``coarse.value_and_grad`` under ``coarse.sync`` on the
    coarse ``mesh`` with ``cfg``), "pmean" or `REVERSED` (on a 1-D mesh).
    """
    loss = make_loss(apply_fn)
    if impl == "coarse":

        @coarse.sync(mesh, config=cfg)
        def grads_fn(params: Any, batch: Batch) -> Any:
            return coarse.value_and_grad(loss)(params, batch)[1]
    else:
        reduce = "reversed" if impl == REVERSED else "pmean"

        def per_worker(params: Any, batch: Batch) -> Any:
            grads = jax.grad(loss)(lax.pcast(params, "data", to="varying"), batch)
            return _pmean(grads, reduce)

        grads_fn = jax.jit(
            jax.shard_map(per_worker, mesh=mesh, in_specs=(P(), P("data")), out_specs=P())
        )
    on = input_mesh(mesh)
    placed = jax.device_put(batch, NamedSharding(on, P("data")))
    return jax.device_get(grads_fn(jax.device_put(params, NamedSharding(on, P())), placed))


def gradient_diff(a: Any, b: Any) -> tuple[float, float]:
    """How far gradient tree ``a`` is from ``b``.

    Returns ``(worst, identical)``: the largest, over leaves, of
    ``max|a - b| / max|b|`` (float32 rounding of a sum of p terms is a few
    1e-8 to 1e-7 of the leaf's scale), and the fraction of elements that are
    bit-identical.
    """
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    worst = max(
        float(np.abs(x - y).max() / max(np.abs(y).max(), np.finfo(np.float32).tiny))
        for x, y in zip(la, lb, strict=True)
    )
    identical = sum(int((x == y).sum()) for x, y in zip(la, lb, strict=True))
    return worst, identical / sum(x.size for x in lb)


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


def classification_loss(apply_fn: Callable[..., jax.Array]) -> Callable[[Any, Batch], jax.Array]:
    """Mean softmax cross-entropy of one worker's batch, as a function of (params, batch)."""

    def loss(params: Any, batch: Batch) -> jax.Array:
        logits = apply_fn(params, batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

    return loss


def teacher_images(config: Any, n_train: int) -> tuple[Batch, Batch]:
    """``n_train`` training and ``eval_size`` test images labelled by a fixed random teacher.

    Gaussian images of ``config.image_shape``; the label is the argmax of a
    random linear map of the 4x4-pooled image plus ``config.label_noise``, so
    the loss can go down. Deterministic in ``config.seed``.
    """
    rng = np.random.default_rng(config.seed)
    h, w, c = config.image_shape
    pooled = (h // 4) * (w // 4) * c
    teacher = rng.normal(size=(pooled, config.num_classes)) / np.sqrt(pooled)

    def sample(n: int) -> Batch:
        x = rng.normal(size=(n, h, w, c)).astype(np.float32)
        feats = x.reshape(n, h // 4, 4, w // 4, 4, c).mean((2, 4)).reshape(n, -1) * 4.0
        logits = feats @ teacher + config.label_noise * rng.normal(size=(n, config.num_classes))
        return {"x": x, "y": logits.argmax(-1).astype(np.int32)}

    return sample(n_train), sample(config.eval_size)


def load_or_synthesize(
    config: Any,
    load: Callable[[str, int, int, int], tuple[Batch, Batch]] | None,
    synthesize: Callable[[Any, int], tuple[Batch, Batch]],
) -> tuple[Batch, Batch]:
    """Train batches with leading axes ``(steps, batch_size)`` and a flat test set.

    ``load(data_dir, n, eval_size, seed)`` reads a local dataset when
    ``config.data_dir`` is set (nothing is ever downloaded; None: the example
    has synthetic data only); otherwise ``synthesize(config, n)`` makes the data.
    """
    n = config.steps * config.batch_size
    if config.data_dir:
        if load is None:
            raise ValueError(
                f"data_dir {config.data_dir!r} given, but this example has synthetic data only."
            )
        train, test = load(config.data_dir, n, config.eval_size, config.seed)
    else:
        train, test = synthesize(config, n)
    train = {k: v.reshape(config.steps, config.batch_size, *v.shape[1:]) for k, v in train.items()}
    return train, test


def input_mesh(mesh: Mesh) -> Mesh:
    """Where inputs go: a coarse mesh's workers (``workers_mesh``), or the pmean mesh itself.

    A coarse step moves inputs onto its workers anyway; putting them there
    directly is also the only way on a COARSE k:1 mesh, which lists each
    shared proxy k times (jax cannot split an array over such a mesh).
    """
    return workers_mesh(mesh) if "tier" in mesh.axis_names else mesh


def pmean_mesh(workers: int) -> Mesh:
    """The baseline's 1-D mesh: the first ``workers`` devices (coarse's worker tier)."""
    return Mesh(np.array(jax.devices()[:workers]), ("data",))


def leading_bytes(params: Any, modules: int) -> int:
    """Bytes of the first ``modules`` top-level Flax modules, in flatten (sorted-key) order.

    That is the prefix of the flatten order that `coarse.Config.leading_bytes`
    takes, so these modules are reduced among the workers (dual sync).
    """
    tree = params["params"]
    first = [tree[k] for k in sorted(tree)[:modules]]
    return sum(leaf.nbytes for leaf in jax.tree.leaves(first))


# ----------------------------------------------------------------------------- running


@dataclasses.dataclass
class RunResult:
    """One implementation's training run."""

    state: train_state.TrainState
    losses: list[float]
    step_times_s: list[float]  # the first (compiling) step excluded

    @property
    def median_step_s(self) -> float:
        return statistics.median(self.step_times_s) if self.step_times_s else math.nan


def place_batches(train: Batch, sharding: NamedSharding) -> list[Batch]:
    """Places every step's batch on the devices up front, so steps time compute, not copies."""
    steps = len(next(iter(train.values())))
    return [jax.device_put({k: v[i] for k, v in train.items()}, sharding) for i in range(steps)]


def train(step: StepFn, state: train_state.TrainState, data: list[Batch], desc: str) -> RunResult:
    """Runs ``step`` over ``data`` with a progress bar, timing every step."""
    losses, times = [], []
    for batch in tqdm(data, desc=desc, unit="step", leave=True):
        start = time.perf_counter()
        state, loss = jax.block_until_ready(step(state, batch))
        times.append(time.perf_counter() - start)
        losses.append(float(loss))
    return RunResult(state, losses, times[1:])


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


def time_syncs(
    impls: tuple[str, ...],
    params: Any,
    coarse_mesh: Mesh,
    cfg: coarse.Config,
    calls: int,
    seed: int,
) -> dict[str, float]:
    """Median seconds of each implementation's gradient sync alone (`sync_only`).

    The tree has ``params``' shapes and different Gaussian values on every
    worker (numpy, seeded with ``seed``).
    """
    p = coarse_mesh.shape["data"]
    rng = np.random.default_rng(seed)
    per_worker = jax.tree.map(lambda x: rng.normal(size=(p, *x.shape)).astype(np.float32), params)
    times = {}
    for impl in impls:
        mesh = coarse_mesh if impl == "coarse" else pmean_mesh(p)
        placed = jax.device_put(per_worker, NamedSharding(input_mesh(mesh), P("data")))
        times[impl] = median_call_s(sync_only(mesh, impl, cfg), placed, calls)
    return times


def compare(runs: dict[str, RunResult], other: str = "coarse") -> tuple[float, float]:
    """Largest absolute and relative (to pmean) difference of ``other``'s and pmean's losses."""
    a, b = np.array(runs[other].losses), np.array(runs["pmean"].losses)
    diff = np.abs(a - b)
    return float(diff.max()), float((diff / np.abs(b)).max())


def write_jsonl(path: str, records: Iterator[dict[str, Any]]) -> None:
    with open(path, "w") as f:
        f.writelines(json.dumps(record) + "\n" for record in records)


def plot_losses(runs: dict[str, RunResult], path: str, title: str) -> None:
    """Writes a PNG of the loss curves (and, next to pmean, each other run's absolute difference).

    Uses the object-oriented API on an Agg canvas: no pyplot, no global figure
    state, no display needed.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    others = [name for name in runs if name != "pmean"] if "pmean" in runs else []
    fig = Figure(figsize=(10 if others else 5, 4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2 if others else 1, squeeze=False)[0]
    for name, run in runs.items():
        axes[0].plot(run.losses, label=name, linestyle="-" if name == "coarse" else "--")
    axes[0].set(xlabel="step", ylabel="training loss", title=title)
    axes[0].legend()
    for name in others:
        diff = np.abs(np.array(runs[name].losses) - np.array(runs["pmean"].losses))
        axes[1].plot(np.maximum(diff, 1e-12), label=f"{name} - pmean")
    if others:
        axes[1].set(
            xlabel="step",
            ylabel="|loss - loss_pmean|",
            yscale="log",
            title="difference (floored at 1e-12)",
        )
        axes[1].legend()
    fig.savefig(path, dpi=100)


def run_comparison(
    config: Any,
    workdir: str,
    *,
    name: str,
    apply_fn: Callable[..., Any],
    params: Any,
    make_loss: MakeLoss,
    train_data: Batch,
    evaluate: Callable[[train_state.TrainState], float] | None = None,
    eval_name: str = "test accuracy",
) -> dict[str, Any]:
    """Trains with the implementations in ``config.impl`` and compares them.

    Args:
      config: an example's config; reads ``workers``, ``steps``,
        ``batch_size``, ``learning_rate``, ``momentum``, ``shard_bytes``,
        ``leading_modules``, ``worker_compute``, ``impl`` ("coarse", "pmean"
        or "both"), ``noise_floor``, ``plot`` and ``sync_timing_calls`` (see
        `common.config.BaseConfig`). ``noise_floor`` (with
        "both") adds a third run, `REVERSED`: pmean's step with the gradients
        summed in the reverse worker order, whose distance from pmean is the
        noise floor that coarse's distance from pmean is judged against; and
        it compares the three implementations' step-0 gradients.
      workdir: directory for ``metrics.jsonl`` and ``loss.png`` (created if missing).
      name: the example's name, for titles.
      apply_fn: the model's ``apply``.
      params: initial parameters (the same for both runs).
      make_loss: ``make_loss(apply_fn)`` returns the per-worker mean loss ``loss(params, batch)``.
      train_data: numpy arrays with leading axes ``(steps, batch_size)``.
      evaluate: optional held-out metric of a trained state.
      eval_name: how to print ``evaluate``'s value.

    Returns:
      A summary dict: final losses, median step times (s), with
      ``sync_timing_calls`` median sync times (s) ``median_sync_s``, the
      held-out metric ``eval``, and with both impls ``max_abs_loss_diff`` / ``max_rel_loss_diff``
      (coarse vs pmean); with ``noise_floor`` also ``noise_abs_loss_diff`` /
      ``noise_rel_loss_diff`` (`REVERSED` vs pmean) and ``step0_grad_diff``
      (``{"coarse": worst, REVERSED: worst}``, see `gradient_diff`);
      ``metrics_path`` and ``plot_path`` (or None).
    """
    os.makedirs(workdir, exist_ok=True)
    p = config.workers
    if config.batch_size % p:
        raise ValueError(f"batch_size {config.batch_size} must be a multiple of workers {p}.")
    n = p + (config.proxies or p)
    if len(jax.devices()) < n:
        raise RuntimeError(
            f"{n} devices needed (workers + proxies), jax sees {len(jax.devices())}. Fix: set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={n} before jax is imported."
        )
    impls = IMPLS if config.impl == "both" else (config.impl,)
    noise_floor = config.noise_floor
    if noise_floor:
        if config.impl != "both":
            raise ValueError(
                "noise_floor needs impl 'both': it compares coarse and pmean "
                "with pmean in another summation order."
            )
        impls = (*IMPLS, REVERSED)

    tx = optax.sgd(config.learning_rate, momentum=config.momentum)
    state = train_state.TrainState.create(apply_fn=apply_fn, params=params, tx=tx)
    coarse_mesh = coarse.make_mesh(workers=p, proxies=config.proxies)
    cfg = coarse.Config(
        shard_bytes=config.shard_bytes,
        leading_bytes=leading_bytes(params, config.leading_modules),
        worker_compute=config.worker_compute,
    )
    n_params = sum(x.size for x in jax.tree.leaves(params))
    print(
        f"{name}: {n_params:,} parameters, {config.steps} steps, global batch "
        f"{config.batch_size} on {p} workers, impl {config.impl}"
    )
    if "coarse" in impls:
        # value_and_update sends every parameter through the proxies (no worker ring).
        shown = cfg if config.optimizer != "proxy" else dataclasses.replace(cfg, leading_bytes=0)
        print(coarse.plan(params, coarse_mesh, shown).summary())
    print()

    grad_diff: dict[str, tuple[float, float]] = {}
    if noise_floor:
        batch0 = {k: v[0] for k, v in train_data.items()}
        grads = {
            impl: step0_gradients(
                coarse_mesh if impl == "coarse" else pmean_mesh(p),
                make_loss,
                apply_fn,
                params,
                batch0,
                impl,
                cfg,
            )
            for impl in impls
        }
        grad_diff = {
            impl: gradient_diff(grads[impl], grads["pmean"]) for impl in ("coarse", REVERSED)
        }
        for impl, (worst, identical) in grad_diff.items():
            print(
                f"step-0 gradients, {impl} vs pmean: max over leaves of max|diff|/max|g| "
                f"{worst:.3e}, {identical:.1%} of elements bit-identical"
            )
        print()

    runs: dict[str, RunResult] = {}
    for impl in impls:
        start = state
        if impl == "coarse" and config.optimizer == "proxy":
            opt = coarse.optim.sgd(config.learning_rate, momentum=config.momentum)
            mesh, step = coarse_mesh, coarse_proxy_train_step(coarse_mesh, cfg, make_loss, opt)
            start = train_state.TrainState.create(
                apply_fn=apply_fn, params=params, tx=optax.identity()
            )
        elif impl == "coarse":
            mesh, step = coarse_mesh, coarse_train_step(coarse_mesh, cfg, make_loss)
        else:
            mesh = pmean_mesh(p)
            step = pmean_train_step(
                mesh, make_loss, reduce="reversed" if impl == REVERSED else "pmean"
            )
        # The initial state goes replicated onto the mesh, as the steps return
        # it, so only the first step compiles (an uncommitted input would
        # recompile on the second step).
        runs[impl] = train(
            step,
            jax.device_put(start, NamedSharding(input_mesh(mesh), P())),
            place_batches(train_data, NamedSharding(input_mesh(mesh), P("data"))),
            f"{impl:<14}" if noise_floor else f"{impl:<6}",
        )

    sync_s = (
        time_syncs(impls, params, coarse_mesh, cfg, config.sync_timing_calls, config.seed + 1)
        if config.sync_timing_calls
        else {}
    )
    metric = {impl: evaluate(run.state) for impl, run in runs.items()} if evaluate else {}
    summary: dict[str, Any] = {
        "final_loss": {impl: run.losses[-1] for impl, run in runs.items()},
        "median_step_s": {impl: run.median_step_s for impl, run in runs.items()},
        "eval": metric,
    }
    if sync_s:
        summary["median_sync_s"] = sync_s
    first = next(iter(runs.values())).losses[0]
    print()
    print(
        f"loss: first {first:.4f}, "
        + ", ".join(f"last {impl} {run.losses[-1]:.6f}" for impl, run in runs.items())
    )
    if "coarse" in runs and "pmean" in runs:
        max_abs, max_rel = compare(runs)
        summary.update(max_abs_loss_diff=max_abs, max_rel_loss_diff=max_rel)
        print(
            f"max |loss_coarse - loss_pmean| over {config.steps} steps: {max_abs:.3e} "
            f"(relative {max_rel:.3e})"
        )
    if noise_floor:
        noise_abs, noise_rel = compare(runs, REVERSED)
        summary.update(
            noise_abs_loss_diff=noise_abs,
            noise_rel_loss_diff=noise_rel,
            step0_grad_diff={impl: d[0] for impl, d in grad_diff.items()},
        )
        print(
            f"noise floor: max |loss_{REVERSED} - loss_pmean| over {config.steps} steps: "
            f"{noise_abs:.3e} (relative {noise_rel:.3e})"
        )
    if metric:
        print(f"{eval_name}: " + ", ".join(f"{impl} {v:.4f}" for impl, v in metric.items()))
    print()
    width = max(8, *(len(impl) + 1 for impl in runs))
    sync_header = f" {'median sync (ms)':>17}" if sync_s else ""
    print(f"{'impl':<{width}} {'median step (ms)':>17}{sync_header}")
    for impl, run in runs.items():
        sync_ms = f" {sync_s[impl] * 1e3:>17.3f}" if sync_s else ""
        print(f"{impl:<{width}} {run.median_step_s * 1e3:>17.3f}{sync_ms}")

    metrics_path = os.path.join(workdir, "metrics.jsonl")

    def records() -> Iterator[dict[str, Any]]:
        for impl, run in runs.items():
            times = [None, *run.step_times_s]  # step 0 compiled, not timed
            for i, (loss, t) in enumerate(zip(run.losses, times, strict=True)):
                yield {"example": name, "impl": impl, "step": i, "loss": loss, "step_time_s": t}
        for impl, run in runs.items():
            record = {
                "example": name,
                "impl": impl,
                "summary": True,
                "median_step_s": run.median_step_s,
            }
            if sync_s:
                record["median_sync_s"] = sync_s[impl]
            if metric:
                record[eval_name.replace(" ", "_")] = metric[impl]
            yield record
        if "max_rel_loss_diff" in summary:
            yield {
                "example": name,
                **{
                    k: summary[k]
                    for k in (
                        "max_abs_loss_diff",
                        "max_rel_loss_diff",
                        "noise_abs_loss_diff",
                        "noise_rel_loss_diff",
                        "step0_grad_diff",
                    )
                    if k in summary
                },
            }

    write_jsonl(metrics_path, records())
    print(f"\nmetrics written to {metrics_path}")
    summary["metrics_path"] = metrics_path
    summary["plot_path"] = None
    if config.plot:
        summary["plot_path"] = os.path.join(workdir, "loss.png")
        plot_losses(runs, summary["plot_path"], f"{name}: training loss")
        print(f"loss curves plotted to {summary['plot_path']}")
    return summary
