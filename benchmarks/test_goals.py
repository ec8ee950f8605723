"""Issue 39's goals, each against its baseline in the same run: a ratio per goal, with the load.

| goal | coarse | baseline | at most |
|---|---|---|---|
| latency | 1 KiB `coarse.all_reduce` (default Config: the latency route, XLA) | `lax.psum` | 1.2x |
| the same through the proxies | with `Config(xla_below_bytes=0)` | `lax.psum` | 1.2x |
| bandwidth | the worst of 64 KiB, 1, 16, 256 MiB `all_reduce` (default) | `lax.psum` | 1.5x |
| demo | the demo's step (`examples/demo`) | its `jit` + `lax.pmean` step | 1.2x |
| bert, proxies' optimizer | `examples/bert --optimizer proxy` | `jit` + `pmean` + optax | 1.1x |
| ResNet-50 tree, 1:1 | `all_reduce` of the 161 leaves | `lax.pmean` | 1.0x |

Every goal is RUNS runs, coarse and baseline interleaved in each (coarse's
median over a run's calls, then the baseline's), and the ratio reported is
the median of the runs' ratios, with the lowest and highest; the examples'
runs are separate processes (``--impl both``: coarse then pmean, the same
data and steps), so each of their ratios is from one process. The load
average before and after is printed: on a shared 2-core machine it moves
every figure, which is why no goal is asserted (a benchmark measures; the
note that resolves issue 39 reads the table).

Run: ``make bench`` (it writes ``out/bench/goals.md``), or
``pytest -q -s benchmarks/test_goals.py -p no:cacheprovider``.
"""

from __future__ import annotations

import collections
import functools
import os
import pathlib
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pytest
from baselines import psum_over
from common.clock import median_s, warm_up
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from report import goal_rows
from test_examples import median_steps
from test_sync_resnet50 import RESNET50_SHAPES, coarse_sync, pmean_sync

import coarse_jax as coarse

WORKERS = 4
RUNS = 5
EXAMPLE_RUNS = 3
BANDWIDTH_SIZES = (1 << 16, 1 << 20, 1 << 24, 1 << 28)
_ROWS: list[dict[str, Any]] = []


def _interleaved(pairs: list[tuple[Callable[[Any], Any], Any]], calls: int) -> list[float]:
    """RUNS ratios coarse / baseline, each run timing coarse then the baseline."""
    coarse_run, baseline = (functools.partial(fn, x) for fn, x in pairs)
    for run in (coarse_run, baseline):  # compile and warm up
        warm_up(run, 2)
    return [median_s(coarse_run, calls) / median_s(baseline, calls) for _ in range(RUNS)]


def _record(goal: str, limit: float, ratios: list[float], detail: str) -> None:
    row = {
        "goal": goal,
        "limit": limit,
        "ratio": float(np.median(ratios)),
        "lo": float(min(ratios)),
        "hi": float(max(ratios)),
        "runs": len(ratios),
        "detail": detail,
        "load": os.getloadavg()[0],
    }
    _ROWS.append(row)
    print(
        f"\n{goal}: {row['ratio']:.2f}x (runs {row['lo']:.2f}-{row['hi']:.2f}, at most "
        f"{limit}x: {'met' if row['ratio'] <= limit else 'missed'}); {detail}; "
        f"load {row['load']:.1f}"
    )


def _all_reduce_pair(
    nbytes: int, config: coarse.Config | None = None
) -> list[tuple[Callable[[Any], Any], Any]]:
    mesh = coarse.make_mesh(workers=WORKERS)
    psum, flat = psum_over(WORKERS)
    step = coarse.sync(lambda v: coarse.all_reduce(v, op="sum"), mesh, config=config)
    x = np.arange(WORKERS * (nbytes // 4), dtype=np.float32) % 7
    # On the workers' devices, where psum's input is: an array on the whole
    # two-tier mesh would be moved onto the workers and the result placed back
    # on every device of the mesh at each call (coarse_jax/dispatch/placement.py),
    # about 0.6 ms more a call on this 2-core host.
    return [
        (step, jax.device_put(x, NamedSharding(mesh, P("data")))),
        (psum, jax.device_put(x, NamedSharding(flat, P("data")))),
    ]


def _calls(nbytes: int) -> int:
    return max(5, min(40, (32 << 20) // nbytes))


@pytest.mark.benchmark(group="goals")
def test_latency_goal(benchmark: Any) -> None:
    ratios = benchmark.pedantic(
        lambda: _interleaved(_all_reduce_pair(1 << 10), 40), rounds=1, iterations=1
    )
    _record("1 KiB all_reduce / psum", 1.2, ratios, "40 calls a run")
    benchmark.extra_info["goal"] = _ROWS[-1]


@pytest.mark.benchmark(group="goals")
def test_latency_goal_through_the_proxies(benchmark: Any) -> None:
    """The same with ``Config(xla_below_bytes=0)``: the proxies reduce even a 1 KiB tree."""
    cfg = coarse.Config(xla_below_bytes=0)
    ratios = benchmark.pedantic(
        lambda: _interleaved(_all_reduce_pair(1 << 10, cfg), 40), rounds=1, iterations=1
    )
    _record(
        "1 KiB all_reduce through the proxies, Config(xla_below_bytes=0) / psum",
        1.2,
        ratios,
        "40 calls a run",
    )
    benchmark.extra_info["goal"] = _ROWS[-1]


@pytest.mark.benchmark(group="goals")
def test_bandwidth_goal(benchmark: Any) -> None:
    def measure() -> dict[int, list[float]]:
        return {n: _interleaved(_all_reduce_pair(n), _calls(n)) for n in BANDWIDTH_SIZES}

    by_size = benchmark.pedantic(measure, rounds=1, iterations=1)
    worst = max(by_size, key=lambda n: float(np.median(by_size[n])))
    mesh = coarse.make_mesh(workers=WORKERS)

    def route(n: int) -> str:  # the default Config's latency route for one n-byte leaf
        return (
            "XLA" if coarse.diagnostics.plan(np.zeros(n // 4, np.float32), mesh).xla else "proxies"
        )

    sizes = ", ".join(
        f"{n >> 10} KiB {float(np.median(r)):.2f}x ({route(n)})" for n, r in sorted(by_size.items())
    )
    _record("64 KiB-256 MiB all_reduce / psum, worst size", 1.5, by_size[worst], sizes)
    benchmark.extra_info["goal"] = _ROWS[-1]


@pytest.mark.benchmark(group="goals")
@pytest.mark.timeout(1200)
def test_resnet50_goal(benchmark: Any) -> None:
    rng = np.random.default_rng(0)
    grads = collections.OrderedDict(
        (name, rng.standard_normal((WORKERS, *shape), dtype=np.float32))
        for name, shape in RESNET50_SHAPES
    )

    def measure() -> list[float]:
        pairs = []
        for fn, sharding in (coarse_sync("ffi"), pmean_sync()):
            pairs.append((fn, jax.block_until_ready(jax.device_put(grads, sharding))))
        return _interleaved(pairs, 10)

    ratios = benchmark.pedantic(measure, rounds=1, iterations=1)
    _record("ResNet-50 tree all_reduce / pmean, 1:1", 1.0, ratios, "10 calls a run")
    benchmark.extra_info["goal"] = _ROWS[-1]


def _example_ratio(name: str, steps: int, extra: list[str], workdir: pathlib.Path) -> float:
    medians = median_steps(name, workdir, steps, tuple(extra))
    return medians["coarse"] / medians["pmean"]


@pytest.mark.benchmark(group="goals")
@pytest.mark.timeout(2400)
@pytest.mark.parametrize(
    ("goal", "name", "steps", "extra", "limit"),
    [
        ("demo step / pmean step", "demo", 150, [], 1.2),
        ("bert --optimizer proxy step / pmean + optax step", "bert", 60, ["--optimizer", "proxy"],
         1.1),
    ],
)  # fmt: skip
def test_example_goal(
    benchmark: Any, goal: str, name: str, steps: int, extra: list[str], limit: float,
    tmp_path: pathlib.Path,
) -> None:  # fmt: skip
    def measure() -> list[float]:
        return [
            _example_ratio(name, steps, extra, tmp_path / f"run{i}") for i in range(EXAMPLE_RUNS)
        ]

    for i in range(EXAMPLE_RUNS):
        (tmp_path / f"run{i}").mkdir()
    ratios = benchmark.pedantic(measure, rounds=1, iterations=1)
    _record(goal, limit, ratios, f"{steps} steps a process, median step")
    benchmark.extra_info["goal"] = _ROWS[-1]


@pytest.mark.benchmark(group="goals")
@pytest.mark.timeout(1200)
def test_bytes_against_memory_bandwidth(benchmark: Any) -> None:
    """The ResNet-50 tree's sync against this machine's memory bandwidth, in one run.

    The bytes one coarse sync moves, counted by the runtime
    (`coarse_jax._ffi.byte_counts`), over its median time, beside a STREAM triad
    over page-aligned memory (12 bytes an element) timed in the same run, and
    the time the least traffic a shared-memory reduction needs (each worker's
    bytes read once, the result written once per worker: 2 p B) would take
    at the triad's bandwidth; ``lax.pmean``'s time beside it.
    """
    from coarse_jax._ffi.byte_counts import counted
    from coarse_jax._lab import lab_cpu

    rng = np.random.default_rng(0)
    grads = collections.OrderedDict(
        (name, rng.standard_normal((WORKERS, *shape), dtype=np.float32))
        for name, shape in RESNET50_SHAPES
    )
    fns = {}
    for name, (fn, sharding) in (("coarse", coarse_sync("ffi")), ("pmean", pmean_sync())):
        x = jax.block_until_ready(jax.device_put(grads, sharding))
        jax.block_until_ready(fn(x))
        fns[name] = (fn, x)
    triad = lab_cpu().HostOptimizerBench(1 << 22)

    def measure() -> dict[str, float]:
        fn, x = fns["coarse"]
        with counted() as t:
            jax.block_until_ready(fn(x))
        return {
            "coarse_s": median_s(functools.partial(fn, x), 10),
            "pmean_s": median_s(functools.partial(*fns["pmean"]), 10),
            "triad_gbps": 12 * triad.n / median_s(triad.triad, 10) / 1e9,
            "bytes": float(t.read + t.written),
        }

    r = benchmark.pedantic(measure, rounds=1, iterations=1)
    tree_bytes = sum(x.nbytes // WORKERS for x in grads.values())
    floor_s = 2 * WORKERS * tree_bytes / (r["triad_gbps"] * 1e9)
    coarse_gbps = r["bytes"] / r["coarse_s"] / 1e9
    print(
        f"\nResNet-50 tree ({tree_bytes / 2**20:.1f} MiB a worker), {WORKERS} workers: coarse "
        f"moves {r['bytes'] / 2**20:.0f} MiB ({r['bytes'] / (2 * WORKERS * tree_bytes):.2f}x the "
        f"least, 2 p B) in {r['coarse_s'] * 1e3:.1f} ms = {coarse_gbps:.2f} GB/s; STREAM triad "
        f"{r['triad_gbps']:.2f} GB/s in the same run, at which the least traffic takes "
        f"{floor_s * 1e3:.1f} ms; pmean {r['pmean_s'] * 1e3:.1f} ms; load "
        f"{os.getloadavg()[0]:.1f}"
    )
    benchmark.extra_info.update(r)


def test_goals_table() -> None:
    """The table of every goal measured above (run last in this module)."""
    load = os.getloadavg()
    lines = [
        "",
        f"issue 39's goals, {WORKERS} workers, {os.cpu_count()} cores, load average now "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1 / 5 / 15 min):",
        *goal_rows(_ROWS),
    ]
    text = "\n".join(lines)
    print(text)
    out = os.environ.get("COARSE_BENCH_OUT")
    if out:
        pathlib.Path(out, "goals.md").write_text(text + "\n")
