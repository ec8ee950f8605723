"""Trains one model with coarse_jax and with ``shard_map`` + ``lax.pmean``, and compares them.

What an example provides: a Flax model's ``apply``, its initial parameters, a
loss (``make_loss(apply_fn) -> loss(params, batch)``), one batch per step
(numpy, leading axes ``(steps, global_batch)``) and optionally an
evaluation. `run_comparison` does the rest, the same way for every example:
the same initial state and batches on each implementation's mesh, a timed
run of each (`common.timing`), the curves' distance, and the printed lines,
``metrics.jsonl`` and ``loss.png`` (`common.report`). The config is a
`common.config.BaseConfig`.

``XLA_FLAGS=--xla_force_host_platform_device_count=8`` must be set before jax
is imported (every ``main.py`` does that) so the CPU offers ``workers +
proxies`` devices.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax
from flax.training import train_state
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse
from common import data, report, steps, timing

Batch = dict[str, Any]


def run_comparison(
    config: Any,
    workdir: str,
    *,
    name: str,
    apply_fn: Callable[..., Any],
    params: Any,
    make_loss: steps.MakeLoss,
    train_data: Batch,
    evaluate: Callable[[train_state.TrainState], float] | None = None,
    eval_name: str = "test accuracy",
) -> dict[str, Any]:
    """Trains with the implementations in ``config.impl`` and compares them.

    Args:
      config: an example's config; reads ``workers``, ``proxies``, ``steps``,
        ``batch_size``, ``learning_rate``, ``momentum``, ``shard_bytes``,
        ``leading_modules``, ``impl`` ("coarse", "pmean" or "both"),
        ``noise_floor``, ``optimizer``, ``plot``, ``sync_timing_calls`` and
        ``seed`` (see `common.config.BaseConfig`). ``noise_floor`` (with
        "both") adds a third run, `steps.REVERSED`: pmean's step with the
        gradients summed in the reverse worker order, whose distance from
        pmean is the noise floor that coarse's distance from pmean is judged
        against; and it compares the three implementations' step-0 gradients.
      workdir: directory for ``metrics.jsonl`` and ``loss.png`` (created if missing).
      name: the example's name, for titles.
      apply_fn: the model's ``apply``.
      params: initial parameters (the same for every run).
      make_loss: ``make_loss(apply_fn)`` returns the per-worker mean loss ``loss(params, batch)``.
      train_data: numpy arrays with leading axes ``(steps, batch_size)``.
      evaluate: optional held-out metric of a trained state.
      eval_name: how to print ``evaluate``'s value.

    Returns:
      A summary dict: final losses, median step times (s), with
      ``sync_timing_calls`` median sync times (s) ``median_sync_s``, the
      held-out metric ``eval``, and with both impls ``max_abs_loss_diff`` /
      ``max_rel_loss_diff`` (coarse vs pmean); with ``noise_floor`` also
      ``noise_abs_loss_diff`` / ``noise_rel_loss_diff`` (`steps.REVERSED` vs
      pmean) and ``step0_grad_diff`` (``{"coarse": worst, REVERSED: worst}``,
      see `gradient_diff`); ``metrics_path`` and ``plot_path`` (or None).
    """
    os.makedirs(workdir, exist_ok=True)
    impls = implementations(config)
    coarse_mesh = coarse.make_mesh(workers=config.workers, proxies=config.proxies)
    cfg = coarse.Config(
        shard_bytes=config.shard_bytes,
        leading_bytes=steps.leading_bytes(params, config.leading_modules),
        # The examples show the proxies: on CPU a small model's tree (the
        # demo's 0.32 MiB) would take the latency route, XLA's psum, by default.
        xla_below_bytes=0,
    )
    report.print_header(name, params, config)
    if "coarse" in impls:
        # value_and_update sends every parameter through the proxies (no worker ring).
        shown = cfg if config.optimizer != "proxy" else dataclasses.replace(cfg, leading_bytes=0)
        print(coarse.diagnostics.plan(params, coarse_mesh, shown).summary())
    print()

    grad_diff = {}
    if config.noise_floor:
        batch0 = data.first_batch(train_data)
        grad_diff = step0_diffs(impls, coarse_mesh, cfg, make_loss(apply_fn), params, batch0)
        report.print_step0(grad_diff)

    tx = optax.sgd(config.learning_rate, momentum=config.momentum)
    state = train_state.TrainState.create(apply_fn=apply_fn, params=params, tx=tx)
    runs = {
        impl: train_one(impl, config, coarse_mesh, cfg, make_loss, state, train_data)
        for impl in impls
    }
    sync_s = {}
    if config.sync_timing_calls:
        sync_s = timing.time_syncs(
            impls, params, coarse_mesh, cfg, config.sync_timing_calls, config.seed + 1
        )
    metric = {impl: evaluate(run.state) for impl, run in runs.items()} if evaluate else {}
    diffs = curve_diffs(runs, grad_diff)

    report.print_results(runs, diffs, metric, eval_name, config.steps)
    report.print_table(runs, sync_s)
    summary: dict[str, Any] = {
        "final_loss": {impl: run.losses[-1] for impl, run in runs.items()},
        "median_step_s": {impl: run.median_step_s for impl, run in runs.items()},
        "eval": metric,
        **({"median_sync_s": sync_s} if sync_s else {}),
        **diffs,
    }
    summary["metrics_path"] = report.write_metrics(
        workdir, report.records(name, runs, sync_s, metric, eval_name, diffs)
    )
    summary["plot_path"] = None
    if config.plot:
        summary["plot_path"] = os.path.join(workdir, "loss.png")
        report.plot_losses(runs, summary["plot_path"], f"{name}: training loss")
    return summary


def implementations(config: Any) -> tuple[str, ...]:
    """The runs ``config`` asks for, after checking the batch, the devices and the flags."""
    p = config.workers
    if config.batch_size % p:
        raise ValueError(f"batch_size {config.batch_size} must be a multiple of workers {p}.")
    n = p + (config.proxies or p)
    if len(jax.devices()) < n:
        raise RuntimeError(
            f"{n} devices needed (workers + proxies), jax sees {len(jax.devices())}. Fix: set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={n} before jax is imported."
        )
    if not config.noise_floor:
        return steps.IMPLS if config.impl == "both" else (config.impl,)
    if config.impl != "both":
        raise ValueError(
            "noise_floor needs impl 'both': it compares coarse and pmean "
            "with pmean in another summation order."
        )
    return (*steps.IMPLS, steps.REVERSED)


def train_one(
    impl: str,
    config: Any,
    coarse_mesh: Mesh,
    cfg: coarse.Config,
    make_loss: steps.MakeLoss,
    state: train_state.TrainState,
    train_data: Batch,
) -> timing.RunResult:
    """Trains ``state`` with ``impl``'s step over every batch, timing each step."""
    mesh = steps.mesh_for(impl, coarse_mesh)
    if impl == "coarse" and config.optimizer == "proxy":
        opt = coarse.optim.sgd(config.learning_rate, momentum=config.momentum)
        step = steps.coarse_proxy_train_step(coarse_mesh, cfg, make_loss, opt)
        # The proxies hold the optimizer state; the workers' state holds none.
        state = train_state.TrainState.create(
            apply_fn=state.apply_fn, params=state.params, tx=optax.identity()
        )
    elif impl == "coarse":
        step = steps.coarse_train_step(coarse_mesh, cfg, make_loss)
    else:
        step = steps.pmean_train_step(mesh, make_loss, impl)
    # The initial state goes replicated onto the mesh, as the steps return it,
    # so only the first step compiles (an uncommitted input would recompile on
    # the second step).
    on = mesh
    return timing.train(
        step,
        jax.device_put(state, NamedSharding(on, P())),
        data.place_batches(train_data, NamedSharding(on, P("data"))),
        f"{impl:<14}" if config.noise_floor else f"{impl:<6}",
    )


def step0_diffs(
    impls: tuple[str, ...],
    coarse_mesh: Mesh,
    cfg: coarse.Config,
    loss: steps.LossFn,
    params: Any,
    batch: Batch,
) -> dict[str, tuple[float, float]]:
    """coarse's and `steps.REVERSED`'s step-0 gradients against pmean's (`gradient_diff`)."""
    grads = {impl: step0_gradients(impl, coarse_mesh, cfg, loss, params, batch) for impl in impls}
    return {impl: gradient_diff(grads[impl], grads["pmean"]) for impl in ("coarse", steps.REVERSED)}


def step0_gradients(
    impl: str, coarse_mesh: Mesh, cfg: coarse.Config, loss: steps.LossFn, params: Any, batch: Batch
) -> Any:
    """The synchronized (mean) gradients of ``batch``, as numpy, from ``impl``'s step."""
    mesh = steps.mesh_for(impl, coarse_mesh)
    if impl == "coarse":
        grads = steps.coarse_gradients(mesh, cfg, loss)
    else:
        grads = steps.pmean_gradients(mesh, loss, impl)
    on = mesh
    placed = jax.device_put(batch, NamedSharding(on, P("data")))
    return jax.device_get(grads(jax.device_put(params, NamedSharding(on, P())), placed))


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


def loss_diff(runs: dict[str, timing.RunResult], other: str) -> tuple[float, float]:
    """Largest absolute and relative (to pmean) difference of ``other``'s and pmean's losses."""
    a, b = np.array(runs[other].losses), np.array(runs["pmean"].losses)
    diff = np.abs(a - b)
    return float(diff.max()), float((diff / np.abs(b)).max())


def curve_diffs(
    runs: dict[str, timing.RunResult], grad_diff: dict[str, tuple[float, float]]
) -> dict[str, Any]:
    """The summary's distances: coarse's and `steps.REVERSED`'s curves from pmean's, and
    (with the noise floor) each one's worst step-0 gradient difference."""
    diffs: dict[str, Any] = {}
    if "coarse" in runs and "pmean" in runs:
        diffs["max_abs_loss_diff"], diffs["max_rel_loss_diff"] = loss_diff(runs, "coarse")
    if steps.REVERSED in runs:
        diffs["noise_abs_loss_diff"], diffs["noise_rel_loss_diff"] = loss_diff(runs, steps.REVERSED)
        diffs["step0_grad_diff"] = {impl: d[0] for impl, d in grad_diff.items()}
    return diffs
