"""A sync's fixed cost broken down: thread starts, parks, wake-ups, time parked.

Runs a 1 KiB ``coarse.all_reduce`` (one f32 leaf per worker, p = 4, the
latency-bound end of the sweep) ``STEPS`` times after a warm-up and reads the
runtime's wake-up counters (``coarse_jax._ffi.wakeups``) around the timed
steps. Prints them per sync next to the median step time and ``lax.psum``'s,
measured in the same run, interleaved (one psum call after each coarse call),
and the machine's load average.
"""

from __future__ import annotations

import os
import time

import jax
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse
from coarse_jax._ffi import wakeups

WORKERS = 4
STEPS = 200
NBYTES = 1 << 10


@pytest.mark.benchmark(group="wakeups")
def test_wakeups_per_sync(benchmark):
    mesh = coarse.make_mesh(workers=WORKERS)
    flat = jax.sharding.Mesh(np.array(jax.devices()[:WORKERS]), ("data",))
    psum = jax.jit(
        jax.shard_map(lambda x: lax.psum(x, "data"), mesh=flat, in_specs=P("data"), out_specs=P())
    )
    step = coarse.sync(lambda x: coarse.all_reduce(x, op="sum"), mesh)
    x = np.arange(WORKERS * NBYTES // 4, dtype=np.float32) % 7
    xc = jax.device_put(x, NamedSharding(mesh, P("data")))
    xs = jax.device_put(x, NamedSharding(flat, P("data")))
    for _ in range(20):  # compile, warm the pools
        jax.block_until_ready(step(xc))
        jax.block_until_ready(psum(xs))
    out: dict[str, object] = {}

    def measure():
        t_coarse, t_psum = [], []
        before = wakeups.wakeup_stats()
        for _ in range(STEPS):
            t0 = time.perf_counter()
            jax.block_until_ready(step(xc))
            t_coarse.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            jax.block_until_ready(psum(xs))
            t_psum.append(time.perf_counter() - t0)
        out["delta"] = wakeups.wakeup_stats() - before
        out["coarse"] = float(np.median(t_coarse))
        out["psum"] = float(np.median(t_psum))

    benchmark.pedantic(measure, rounds=1, iterations=1)
    delta = out["delta"]
    assert isinstance(delta, wakeups.WakeupStats)
    per = delta.per(STEPS)
    tc, tp = float(out["coarse"]), float(out["psum"])  # type: ignore[arg-type]
    benchmark.extra_info.update({"coarse_median_s": tc, "psum_median_s": tp, **per})
    load = os.getloadavg()
    print(
        "\n".join(
            [
                "",
                f"wake-ups per sync, 1 KiB all_reduce, p = {WORKERS}, {STEPS} syncs "
                f"(load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} cpus):",
                f"  step {tc * 1e6:.0f} us median, psum {tp * 1e6:.0f} us ({tc / tp:.2f}x)",
                f"  threads started {per['thread_starts']:.2f}, parks {per['parks']:.2f}, "
                f"woke with work {per['woke_with_work']:.2f}, spin found {per['spin_found']:.2f}",
                f"  notifies: to a sleeper {per['notify_sleeper']:.2f}, to none "
                f"{per['notify_no_sleeper']:.2f}; parked {per['parked_ns'] / 1e3:.0f} us "
                "(summed over threads)",
            ]
        )
    )
    assert delta.parks >= 0 and delta.thread_starts >= 0
