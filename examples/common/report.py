"""What a comparison shows: the printed lines, ``metrics.jsonl`` and ``loss.png``.

Tests and the guides read these lines and records, so their wording is kept
stable: ``loss: first ...``, ``max |loss_coarse - loss_pmean| over N steps``,
``noise floor: ...``, ``step-0 gradients, <impl> vs pmean: ...`` and the
``impl  median step (ms)  [median sync (ms)]`` table. ``metrics.jsonl`` holds
one record per step and implementation, one summary record per
implementation, then (with two implementations) one record of the
differences.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from common.steps import REVERSED
from common.timing import RunResult

DIFF_KEYS = (
    "max_abs_loss_diff",
    "max_rel_loss_diff",
    "noise_abs_loss_diff",
    "noise_rel_loss_diff",
    "step0_grad_diff",
)


def print_header(name: str, params: Any, config: Any) -> None:
    """One line: the model's size and the run's shape."""
    n_params = sum(x.size for x in jax.tree.leaves(params))
    print(
        f"{name}: {n_params:,} parameters, {config.steps} steps, global batch "
        f"{config.batch_size} on {config.workers} workers, impl {config.impl}"
    )


def print_step0(grad_diff: dict[str, tuple[float, float]]) -> None:
    """The step-0 gradients' distance from pmean's, per implementation (`--noise-floor`)."""
    for impl, (worst, identical) in grad_diff.items():
        print(
            f"step-0 gradients, {impl} vs pmean: max over leaves of max|diff|/max|g| "
            f"{worst:.3e}, {identical:.1%} of elements bit-identical"
        )
    print()


def print_results(
    runs: dict[str, RunResult],
    diffs: dict[str, Any],
    metric: dict[str, float],
    eval_name: str,
    steps: int,
) -> None:
    """The first and last losses, the curves' distances (``diffs``) and the held-out metric."""
    first = next(iter(runs.values())).losses[0]
    print()
    print(
        f"loss: first {first:.4f}, "
        + ", ".join(f"last {impl} {run.losses[-1]:.6f}" for impl, run in runs.items())
    )
    if "max_abs_loss_diff" in diffs:
        print(
            f"max |loss_coarse - loss_pmean| over {steps} steps: "
            f"{diffs['max_abs_loss_diff']:.3e} (relative {diffs['max_rel_loss_diff']:.3e})"
        )
    if "noise_abs_loss_diff" in diffs:
        print(
            f"noise floor: max |loss_{REVERSED} - loss_pmean| over {steps} steps: "
            f"{diffs['noise_abs_loss_diff']:.3e} (relative {diffs['noise_rel_loss_diff']:.3e})"
        )
    if metric:
        print(f"{eval_name}: " + ", ".join(f"{impl} {v:.4f}" for impl, v in metric.items()))
    print()


def print_table(runs: dict[str, RunResult], sync_s: dict[str, float]) -> None:
    """Median step time per implementation, and the median sync time if it was timed."""
    width = max(8, *(len(impl) + 1 for impl in runs))
    sync_header = f" {'median sync (ms)':>17}" if sync_s else ""
    print(f"{'impl':<{width}} {'median step (ms)':>17}{sync_header}")
    for impl, run in runs.items():
        sync_ms = f" {sync_s[impl] * 1e3:>17.3f}" if sync_s else ""
        print(f"{impl:<{width}} {run.median_step_s * 1e3:>17.3f}{sync_ms}")


def records(
    name: str,
    runs: dict[str, RunResult],
    sync_s: dict[str, float],
    metric: dict[str, float],
    eval_name: str,
    diffs: dict[str, Any],
) -> Iterator[dict[str, Any]]:
    """``metrics.jsonl``'s records: per step, per implementation, then the differences."""
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
    if "max_rel_loss_diff" in diffs:
        yield {"example": name, **{k: diffs[k] for k in DIFF_KEYS if k in diffs}}


def write_metrics(workdir: str, lines: Iterator[dict[str, Any]]) -> str:
    """Writes ``lines`` to ``<workdir>/metrics.jsonl``, one JSON object a line; says where."""
    path = os.path.join(workdir, "metrics.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(record) + "\n" for record in lines)
    print(f"\nmetrics written to {path}")
    return path


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
    print(f"loss curves plotted to {path}")
