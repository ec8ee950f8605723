"""Message-size sweep, nccl-tests style: coarse ffi all_reduce against lax.psum, one run.

One f32 leaf per call, 1 KiB to 256 MiB per worker (x4 steps), p = 4 workers
(8 CPU devices: 4 workers + 4 proxies for coarse, the same 4 devices for psum).
Per size: the median wall time of a jitted call (blocked), and the bus
bandwidth nccl-tests reports for an all-reduce, 2 (p - 1) / p * bytes / time.
Prints the table with coarse / psum per size and writes a PNG
(``out/bench/sweep.png`` under ``make bench``, else the working directory).
"""

from __future__ import annotations

import functools
import os

import jax
import numpy as np
import pytest
from baselines import psum_over
from common.clock import median_s
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse

WORKERS = 4
SIZES = [1 << k for k in range(10, 29, 2)]  # 1 KiB .. 256 MiB per worker


def _calls(nbytes: int) -> int:
    return max(5, min(50, (64 << 20) // max(nbytes, 1)))


@pytest.mark.benchmark(group="sweep")
def test_message_size_sweep(benchmark):
    mesh = coarse.make_mesh(workers=WORKERS)
    psum, flat = psum_over(WORKERS)
    rows = []

    def measure():
        rows.clear()
        for nbytes in SIZES:
            n = nbytes // 4
            # Each worker's shard is its own message (the batch axis is split over "data").
            # xla_below_bytes=0: the proxies' curve at every size (the default's
            # latency route is XLA's psum up to 2 MiB: test_goals.py times that).
            cfg = coarse.Config(xla_below_bytes=0)
            step = coarse.sync(lambda x: coarse.all_reduce(x, op="sum"), mesh, config=cfg)
            x = np.arange(WORKERS * n, dtype=np.float32) % 7
            # Placed once, as for psum: a numpy argument would be copied in every call.
            xc = jax.device_put(x, NamedSharding(mesh, P("data")))
            t_coarse = median_s(functools.partial(step, xc), _calls(nbytes), warmup=2)
            xs = jax.device_put(x, NamedSharding(flat, P("data")))
            t_psum = median_s(functools.partial(psum, xs), _calls(nbytes), warmup=2)
            rows.append((nbytes, t_coarse, t_psum))
            del step, xs, xc

    benchmark.pedantic(measure, rounds=1, iterations=1)

    def busbw(nbytes: int, t: float) -> float:
        return 2 * (WORKERS - 1) / WORKERS * nbytes / t / 1e9

    lines = [
        "",
        f"all-reduce sweep, one f32 leaf, p = {WORKERS} (8 CPU devices), median per call:",
        f"{'bytes/worker':>13} {'coarse us':>11} {'psum us':>10} {'x psum':>7} "
        f"{'coarse GB/s':>12} {'psum GB/s':>10}",
    ]
    for nbytes, tc, tp in rows:
        lines.append(
            f"{nbytes:>13,} {tc * 1e6:>11.1f} {tp * 1e6:>10.1f} {tc / tp:>7.2f} "
            f"{busbw(nbytes, tc):>12.2f} {busbw(nbytes, tp):>10.2f}"
        )
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = os.environ.get("COARSE_BENCH_OUT", os.getcwd())
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    sizes = [r[0] for r in rows]
    for i, name in ((1, "coarse ffi"), (2, "lax.psum")):
        a.loglog(sizes, [r[i] * 1e6 for r in rows], "o-", label=name)
        b.semilogx(sizes, [busbw(r[0], r[i]) for r in rows], "o-", label=name)
    a.set(xlabel="bytes per worker", ylabel="time per call (us)", title="latency")
    b.set(xlabel="bytes per worker", ylabel="bus bandwidth (GB/s)", title="bandwidth")
    for ax in (a, b):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(f"all-reduce, p = {WORKERS}, 8 CPU devices (one run)")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "sweep.png"), dpi=100)
    assert len(rows) == len(SIZES)
