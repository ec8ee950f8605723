"""A sync's fixed cost broken down: thread starts, parks, wake-ups, time parked.

Runs a 1 KiB ``coarse.all_reduce`` (one f32 leaf per worker, p = 4, the
latency-bound end of the sweep) ``STEPS`` times after a warm-up, with this
host's spin budget and with a 20 us one, and reads the runtime's wake-up
counters (``coarse_jax._ffi.wakeups``) around each call. Prints them per sync
next to the median step time and ``lax.psum``'s, measured in the same run,
interleaved (each round: one coarse call per budget, then one psum call), and
the machine's load average. Counts fall in the call during which they happen:
a service thread that parks after one call has returned wakes in the next, so
a call's wake-ups with work can exceed its parks.

Then a value_and_grad step with and without ``coarse_begin`` (the call that
queues the proxies' jobs ahead of the forward pass), interleaved: how many
jobs start after a push of their sync, and the step time.
"""

from __future__ import annotations

import contextlib
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from baselines import psum_over
from common.clock import interleaved, medians
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse
from coarse_jax._ffi import wakeups

WORKERS = 4
STEPS = 200
NBYTES = 1 << 10


def _counting(deltas, spins=None):
    """``around`` for `common.clock.interleaved`: the wake-up counts a call moves go to
    ``deltas[name]`` (a name not in ``deltas``, the baseline's, is not counted), after
    ``spins[name]`` is set as the waits' spin budget."""

    @contextlib.contextmanager
    def around(name, _round):
        if name not in deltas:
            yield
            return
        if spins is not None:
            wakeups.set_wait_spin_ns(spins[name])
        before = wakeups.wakeup_stats()
        yield
        deltas[name] = deltas[name] + (wakeups.wakeup_stats() - before)

    return around


@pytest.mark.benchmark(group="wakeups")
def test_wakeups_per_sync(benchmark):
    mesh = coarse.make_mesh(workers=WORKERS)
    psum, flat = psum_over(WORKERS)
    # xla_below_bytes=0: the proxies' wake-ups (1 KiB would take the latency route).
    cfg = coarse.Config(xla_below_bytes=0)
    step = coarse.sync(lambda x: coarse.all_reduce(x, op="sum"), mesh, config=cfg)
    x = np.arange(WORKERS * NBYTES // 4, dtype=np.float32) % 7
    # On the workers' devices, as psum's: an input on the whole two-tier mesh
    # would add its placement to every call (benchmarks/test_goals.py).
    xc = jax.device_put(x, NamedSharding(mesh, P("data")))
    xs = jax.device_put(x, NamedSharding(flat, P("data")))
    for _ in range(20):  # compile, warm the pools
        jax.block_until_ready(step(xc))
        jax.block_until_ready(psum(xs))
    # The waits' spin budget: this host's default (none on <= 2 hardware
    # threads), and a 20 us spin for comparison, interleaved with psum.
    budgets = {"default spin": -1, "spin 20 us": 20_000}
    deltas = {name: wakeups.WakeupStats() for name in budgets}
    runs = {**{name: lambda: step(xc) for name in budgets}, "psum": lambda: psum(xs)}

    def measure():
        times = interleaved(runs, STEPS, around=_counting(deltas, spins=budgets))
        wakeups.set_wait_spin_ns(-1)
        return times

    med = medians(benchmark.pedantic(measure, rounds=1, iterations=1))
    load = os.getloadavg()
    lines = [
        "",
        f"wake-ups per sync, 1 KiB all_reduce, p = {WORKERS}, {STEPS} syncs each, interleaved "
        f"(load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} cpus; default spin "
        f"{wakeups.set_wait_spin_ns(-1)} ns):",
        f"  psum {med['psum'] * 1e6:.0f} us median",
    ]
    for name in budgets:
        per = deltas[name].per(STEPS)
        benchmark.extra_info[name] = {"median_s": med[name], **per}
        lines += [
            f"  {name}: step {med[name] * 1e6:.0f} us median ({med[name] / med['psum']:.2f}x "
            f"psum); threads started {per['thread_starts']:.2f}, parks {per['parks']:.2f}, "
            f"woke with work {per['woke_with_work']:.2f}, spin found {per['spin_found']:.2f}, "
            f"notifies to a sleeper {per['notify_sleeper']:.2f} / to none "
            f"{per['notify_no_sleeper']:.2f}, parked {per['parked_ns'] / 1e3:.0f} us; proxies' "
            f"jobs {per['jobs_started']:.2f}, started after a push {per['jobs_late']:.2f}, "
            f"queued to started {per['job_start_ns'] / max(per['jobs_started'], 1e-9) / 1e3:.0f} "
            "us each",
        ]
    benchmark.extra_info["psum_median_s"] = med["psum"]
    print("\n".join(lines))
    for name in budgets:
        assert deltas[name].thread_starts == 0, (name, deltas[name])


def _mlp_loss(params, x):
    h = jnp.tanh(x @ params["w1"])
    h = jnp.tanh(h @ params["w2"])
    return jnp.mean((h @ params["w3"]) ** 2)


@pytest.mark.benchmark(group="wakeups")
@pytest.mark.parametrize("hidden,batch,steps", [(512, 64, 300), (1024, 256, 120)])
def test_jobs_ready_before_the_first_push(benchmark, monkeypatch, hidden, batch, steps):
    """A value_and_grad step's proxies' jobs, queued by coarse_begin before the
    forward pass, against the same step without it (the jobs then queued by
    the loss's push, as before coarse_begin), interleaved in one process: the
    jobs that started after a push of their sync (late), and the step time.
    A 3-layer MLP, p = 4, per-worker batch ``batch``.
    """
    import coarse_jax._ffi as ffi

    mesh = coarse.make_mesh(workers=WORKERS)
    cfg = coarse.Config(xla_below_bytes=0)
    keys = jax.random.split(jax.random.key(0), 4)
    params = {
        "w1": jax.random.normal(keys[0], (256, hidden)) * 0.05,
        "w2": jax.random.normal(keys[1], (hidden, hidden)) * 0.05,
        "w3": jax.random.normal(keys[2], (hidden, 10)) * 0.05,
    }
    x = jax.random.normal(keys[3], (WORKERS * batch, 256))

    def make():
        @coarse.sync(mesh, config=cfg)
        def step(p, x):
            loss, g = coarse.value_and_grad(_mlp_loss)(p, x)
            return loss, jax.tree.map(lambda a, b: a - 0.01 * b, p, g)

        jax.block_until_ready(step(params, x))  # compiled with the begin of the moment
        return step

    with monkeypatch.context() as m:
        m.setattr(ffi, "begin", lambda call, me: None)  # the step as it was
        runs = {"without coarse_begin": make()}
    runs["with coarse_begin"] = make()
    for step in runs.values():
        for _ in range(10):
            jax.block_until_ready(step(params, x))
    deltas = {name: wakeups.WakeupStats() for name in runs}
    calls = {name: functools.partial(step, params, x) for name, step in runs.items()}

    def measure():
        return interleaved(calls, steps, around=_counting(deltas))

    med = medians(benchmark.pedantic(measure, rounds=1, iterations=1))
    load = os.getloadavg()
    lines = [
        "",
        f"proxies' jobs of a value_and_grad step, MLP hidden {hidden}, batch {batch} per worker, "
        f"p = {WORKERS}, {steps} steps each, interleaved (load {load[0]:.2f} {load[1]:.2f} "
        f"{load[2]:.2f}, {os.cpu_count()} cpus):",
    ]
    base = med["without coarse_begin"]
    for name in runs:
        per = deltas[name].per(steps)
        benchmark.extra_info[name] = {"median_s": med[name], **per}
        lines.append(
            f"  {name}: step {med[name] * 1e3:.2f} ms median ({med[name] / base:.3f}x without); "
            f"jobs {per['jobs_started']:.2f}, started after a push {per['jobs_late']:.2f}, "
            f"queued by a push {per['jobs_queued_at_push']:.2f}, queued to started "
            f"{per['job_start_ns'] / max(per['jobs_started'], 1e-9) / 1e3:.0f} us each"
        )
    print("\n".join(lines))
    assert deltas["with coarse_begin"].jobs_queued_at_push == 0
