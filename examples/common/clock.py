"""Wall-clock timing of jax calls, one helper per job.

The examples' timed loop and sync (`common.timing`) and the benchmarks
(``benchmarks/conftest.py`` puts ``examples/`` on ``sys.path``) time with these.
A time is ``time.perf_counter`` around a call and ``jax.block_until_ready`` of
what it returns. Warm-up calls (compilation, first touches) are waited for and
not timed. A median is ``statistics.median``'s: the middle time, or the mean of
the two middle ones.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import jax

T = TypeVar("T")

# around(name, round): entered before a call of `interleaved`, left after it, untimed.
Around = Callable[[str, int], contextlib.AbstractContextManager[Any]]


def timed(fn: Callable[..., T], *args: Any) -> tuple[T, float]:
    """``fn(*args)`` waited for: its output and the seconds it took."""
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - start


def warm_up(run: Callable[[], Any], calls: int) -> None:
    """``calls`` calls of ``run()``, each waited for, not timed."""
    for _ in range(calls):
        jax.block_until_ready(run())


def call_times(run: Callable[[], Any], calls: int, warmup: int = 0) -> list[float]:
    """The seconds of ``calls`` calls of ``run()``, after ``warmup`` untimed ones."""
    warm_up(run, warmup)
    return [timed(run)[1] for _ in range(calls)]


def median_s(run: Callable[[], Any], calls: int, warmup: int = 0) -> float:
    """The median seconds of ``calls`` calls of ``run()``, after ``warmup`` untimed ones."""
    return statistics.median(call_times(run, calls, warmup))


def interleaved(
    runs: Mapping[str, Callable[[], Any]], rounds: int, around: Around | None = None
) -> dict[str, list[float]]:
    """The seconds of each run, one call each per round in ``runs``' order, so that the
    machine's load falls on all of them alike; ``around(name, round)`` is entered before
    each call and left after it, outside the timing (counters read, processes aligned)."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(rounds):
        for name, run in runs.items():
            with around(name, r) if around else contextlib.nullcontext():
                times[name].append(timed(run)[1])
    return times


def medians(times: Mapping[str, list[float]]) -> dict[str, float]:
    """``{name: median seconds}`` of ``{name: seconds}`` (`interleaved`'s)."""
    return {name: statistics.median(t) for name, t in times.items()}
