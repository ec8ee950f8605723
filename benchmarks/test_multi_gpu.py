"""COARSE on n devices against XLA's own collectives, nccl-tests style (issue 65).

Run on a multi-GPU host: ``pytest -q -s benchmarks/test_multi_gpu.py`` (every GPU
jax sees; ``COARSE_BENCH_DEVICES=4`` takes the first 4). Two layouts of the n
devices, each against its baseline on the same worker devices in the same run:

* ``devices``: n/2 workers, each with its own proxy on one of the other n/2
  devices (COARSE 1:1, peer copies); the baseline runs on the n/2 workers;
* ``host``: n workers, their proxies in host memory; the baseline on the n.

What is timed:

* **all-reduce sweep**: ``coarse.all_reduce`` of one f32 leaf per worker
  (``Config(xla_below_bytes=0)``: through the proxies at every size) against
  ``lax.psum`` under ``shard_map`` (NCCL on GPUs), 1 KiB to 256 MiB per worker
  (x4 steps). Per size: the median of calls interleaved one for one, the ratio,
  and the bus bandwidth nccl-tests reports, 2 (p - 1) / p * bytes / time.
* **steps**: a ResNet-50 and a BERT-base training step (multi_gpu_models.py),
  ``jax.jit`` + ``lax.pmean`` + ``optax.adamw`` against ``coarse.value_and_grad`` +
  the same optax update, and against ``coarse.value_and_update`` with
  ``coarse.optim.adamw`` (the optimizer on the proxies); ``STEPS`` steps a round,
  rounds interleaved, the median round's time per step.

Each table names the machine (devices, host CPU, load) and goes to the terminal
(``-s``) and to ``$COARSE_BENCH_OUT/multi_gpu.md`` when that is set.

On CPU devices (no GPU) the run is a smoke test: 8 CPU devices (benchmarks/conftest.py),
two sizes (1 and 64 KiB), reduced models, a few calls: seconds, as CI runs it (the
Makefile's test-streams target). ``COARSE_BENCH_FULL=1`` gives the full range and
models there too; ``COARSE_BENCH_FULL=0`` the smoke run on GPUs.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax
import pytest
from common.clock import interleaved, medians, warm_up
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from multi_gpu_cases import Layout, flat_mesh, pmean_optax_step, psum_over
from multi_gpu_models import bert_base, n_params, resnet50

import coarse_jax as coarse

FULL = os.environ.get("COARSE_BENCH_FULL", "1" if jax.default_backend() == "gpu" else "0") == "1"
SIZES = [1 << k for k in range(10, 29, 2)] if FULL else [1 << 10, 1 << 16]
STEPS, ROUNDS = (10, 5) if FULL else (2, 2)
ROWS_PER_WORKER = {"resnet50": 32, "bert_base": 8} if FULL else {"resnet50": 2, "bert_base": 2}
MODELS = {"resnet50": resnet50, "bert_base": bert_base}
# Every model on both layouts; the smoke run each layout once, so that CI pays
# for four compiled steps, not eight (a conv step compiles in tens of seconds there).
STEP_CASES = (
    [(name, on) for name in MODELS for on in ("devices", "host")]
    if FULL
    else [("resnet50", "devices"), ("bert_base", "host")]
)
TABLES: dict[str, list[str]] = {}


def _pool() -> list[jax.Device]:
    devices = jax.devices()  # the default backend's: the GPUs on a GPU host
    n = int(os.environ.get("COARSE_BENCH_DEVICES", min(len(devices), 8)))
    if n < 2 or len(devices) < n:
        pytest.skip(f"needs {max(n, 2)} devices, jax sees {len(devices)}")
    return devices[:n]


def _layout(on: str, n: int) -> Layout:
    if on == "host":
        return Layout(f"{n}w-host-proxies", n, n, n, "host")
    return Layout(f"{n // 2}w-{n // 2}p", n // 2 * 2, n // 2, n // 2, "devices")


def machine() -> str:
    """The devices, the host's CPU and its load, for the tables."""
    d = jax.devices()[0]
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    return (
        f"{len(jax.devices())} x {d.device_kind} ({d.platform}); host {cpu}, "
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; jax {jax.__version__}"
    )


def _table(title: str, header: str, rows: list[str]) -> None:
    lines = [f"### {title}", "", f"Machine: {machine()}.", "", header]
    lines += ["|" + "---|" * (header.count("|") - 1), *rows, ""]
    TABLES[title] = lines
    print("\n" + "\n".join(lines))
    out = os.environ.get("COARSE_BENCH_OUT")
    if out:  # every table so far, rewritten after each: a run cut short keeps its tables
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "multi_gpu.md"), "w") as f:
            f.write("\n".join(line for table in TABLES.values() for line in table) + "\n")


def _busbw(p: int, nbytes: int, seconds: float) -> float:
    return 2 * (p - 1) / p * nbytes / seconds / 1e9


def _calls(nbytes: int) -> int:
    return max(5, min(50, (64 << 20) // nbytes)) if FULL else 5


@pytest.mark.benchmark(group="multi-gpu all-reduce")
@pytest.mark.parametrize("on", ["devices", "host"])
def test_all_reduce_against_psum(benchmark: Any, on: str) -> None:
    layout = _layout(on, len(_pool()))
    mesh = layout.mesh(_pool())
    workers = list(mesh.devices.flat)
    p, flat = layout.workers, flat_mesh(workers)
    psum = psum_over(workers)
    cfg = coarse.Config(xla_below_bytes=0, timeout_s=120)
    rows: list[tuple[int, float, float]] = []

    def measure() -> None:
        rows.clear()
        for nbytes in SIZES:
            x = (np.arange(p * (nbytes // 4)) % 7).astype(np.float32)
            step = coarse.sync(lambda v: coarse.all_reduce(v, op="sum"), mesh, config=cfg)
            xc = jax.device_put(x, NamedSharding(mesh, P("data")))
            xs = jax.device_put(x, NamedSharding(flat, P("data")))
            # Small integers: every order of the sum is exact, so the results are equal.
            np.testing.assert_array_equal(np.asarray(step(xc)), np.asarray(psum(xs)))
            runs = {"coarse": functools.partial(step, xc), "psum": functools.partial(psum, xs)}
            for run in runs.values():
                warm_up(run, 2)
            t = medians(interleaved(runs, _calls(nbytes)))
            rows.append((nbytes, t["coarse"], t["psum"]))
            del step, xc, xs, runs  # the proxies' storage for this size goes with the step

    benchmark.pedantic(measure, rounds=1, iterations=1)
    benchmark.extra_info.update({"machine": machine(), "layout": layout.id, "rows": rows})
    _table(
        f"all_reduce against lax.psum, {layout.id} (p = {p})",
        "| bytes/worker | coarse us | psum us | x psum | coarse busbw GB/s | psum busbw GB/s |",
        [
            f"| {n:,} | {tc * 1e6:.1f} | {tp * 1e6:.1f} | {tc / tp:.2f} | "
            f"{_busbw(p, n, tc):.2f} | {_busbw(p, n, tp):.2f} |"
            for n, tc, tp in rows
        ],
    )
    assert len(rows) == len(SIZES)


def _loop(step: Callable[..., Any], state: list[Any], batch: Any) -> Callable[[], Any]:
    """A round: STEPS steps of ``step(*state, batch) -> (*state, loss)`` from ``state``."""

    def run() -> Any:
        args = state[0]
        for _ in range(STEPS):
            *args, loss = step(*args, batch)
        state[0] = tuple(args)
        return args, loss

    return run


@pytest.mark.benchmark(group="multi-gpu steps")
@pytest.mark.parametrize("name, on", STEP_CASES)
def test_step_against_jit_pmean_optax(benchmark: Any, name: str, on: str) -> None:
    model = MODELS[name](FULL)
    layout = _layout(on, len(_pool()))
    mesh = layout.mesh(_pool())
    workers = list(mesh.devices.flat)
    flat = flat_mesh(workers)
    params = jax.device_get(model.init())
    batch = model.batch(ROWS_PER_WORKER[name] * layout.workers)
    tx = optax.adamw(1e-4, weight_decay=0.01)
    cfg = coarse.Config(timeout_s=300)

    @coarse.sync(mesh, config=cfg)
    def grad_step(params, state, batch):
        loss, grads = coarse.value_and_grad(model.loss)(params, batch)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    opt = coarse.optim.adamw(1e-4, weight_decay=0.01)

    @coarse.sync(mesh, config=cfg)
    def update_step(params, batch):
        loss, params = coarse.value_and_update(model.loss, opt)(params, batch)
        return params, loss

    pmean = jax.jit(pmean_optax_step(workers, tx, model.loss))
    rep, rep_flat = NamedSharding(mesh, P()), NamedSharding(flat, P())
    on_mesh = jax.device_put(batch, NamedSharding(mesh, P("data")))
    on_flat = jax.device_put(batch, NamedSharding(flat, P("data")))
    states = {
        "pmean": [jax.device_put((params, tx.init(params)), rep_flat)],
        "grad": [jax.device_put((params, tx.init(params)), rep)],
        "update": [(jax.device_put(params, rep),)],
    }
    runs = {
        "jit + pmean + optax": _loop(pmean, states["pmean"], on_flat),
        "value_and_grad + optax": _loop(grad_step, states["grad"], on_mesh),
        "value_and_update": _loop(update_step, states["update"], on_mesh),
    }
    # A first step of each from the same parameters: the same loss, to 1% (each
    # program rounds its own way; a GPU's default matmuls are TF32), a check that
    # the three run the same model on the same rows; then a round of each, untimed.
    first = []
    for (step, state), b in zip(
        ((pmean, states["pmean"]), (grad_step, states["grad"]), (update_step, states["update"])),
        (on_flat, on_mesh, on_mesh),
        strict=True,
    ):
        *args, loss = step(*state[0], b)
        state[0] = tuple(args)
        first.append(float(loss))
    np.testing.assert_allclose(first, first[0], rtol=1e-2)
    for run in runs.values():
        warm_up(run, 1)

    t = benchmark.pedantic(lambda: medians(interleaved(runs, ROUNDS)), rounds=1, iterations=1)
    base = t["jit + pmean + optax"]
    benchmark.extra_info.update({"machine": machine(), "layout": layout.id, "seconds": t})
    _table(
        f"{model.name} step ({n_params(params) / 1e6:.1f}M params, "
        f"{ROWS_PER_WORKER[name]} per worker), {layout.id}",
        "| step | ms/step | x jit + pmean + optax |",
        [f"| {impl} | {s / STEPS * 1e3:.2f} | {s / base:.2f} |" for impl, s in t.items()],
    )
