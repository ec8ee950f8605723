"""A host-proxy step against its floor and the alternatives, on CPU workers (issue 51, item 4).

One worker, its proxy in host memory (``make_mesh(workers=1, proxies_on="host")``), a
``coarse.value_and_update`` Adam step of an MLP (``COARSE_BENCH_FLOOR_SIZES``, default
512-2048-2048-512, 6.3M params), with and without the delayed update, against, in the
same run and interleaved round by round:

* ``jax.jit`` + optax on the worker's device (everything on the device);
* JAX's own host offloading of the optimizer state (``pinned_host``, baselines.py);
* the floor, from figures measured in the same run: the step's compute with no
  optimizer (``jax.value_and_grad`` alone), one copy of the f32 gradient each way
  (a host memcpy of 4N bytes, what a push and a pull move here), and one pass of the
  host Adam over N elements on the host pool (``HostOptimizerBench``). The floor is
  max(compute, copy down, copy up, host Adam) plus one piece's head and tail (its copy
  down, its update and its copy up, at ``Config.shard_bytes``).

On a GPU the copies cross PCIe and the host Adam runs beside the GPU's compute; on this
machine everything shares the same cores, so the floor's max() is optimistic here: the
parts cannot overlap when the workers' compute already uses every core. The ratios are
printed (``pytest -s``) and kept in ``extra_info``; nothing is asserted about speed.
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from baselines import jit_optax_step, pinned_host_offload_step
from common.clock import interleaved, median_s, medians

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
)
from helpers import make_batch, mlp_init, mlp_loss

import coarse_jax as coarse
from coarse_jax._lab import lab_cpu

SIZES = tuple(
    int(x) for x in os.environ.get("COARSE_BENCH_FLOOR_SIZES", "512,2048,2048,512").split(",")
)
BATCH = 64
STEPS = 10
REPEATS = 5


def _loops(cpu):
    """name -> a function that runs STEPS steps (and waits), each with its own state."""
    params = mlp_init(jax.random.key(0), SIZES)
    batch = jax.device_put(make_batch(jax.random.key(1), BATCH, SIZES[0], SIZES[-1]), cpu)
    tx = optax.adam(1e-4)
    copy = lambda: jax.device_put(jax.tree.map(jnp.copy, params), cpu)  # noqa: E731
    loops = {}

    for delayed in (False, True):
        mesh = coarse.make_mesh(workers=1, proxies_on="host", devices=[cpu])

        @coarse.sync(mesh)
        def step(p, b, delayed=delayed):
            loss, p = coarse.value_and_update(mlp_loss, coarse.optim.adam(1e-4), delayed=delayed)(
                p, b
            )
            return p, loss

        held = [copy()]

        def run(step=step, held=held):
            p = held[0]
            for _ in range(STEPS):
                p, _ = step(p, batch)
            held[0] = jax.block_until_ready(p)

        loops["coarse, host proxy" + (", delayed" if delayed else "")] = run

    offload, on_host = pinned_host_offload_step(mlp_loss, tx, cpu)
    for name, fn, place in (
        ("jax.jit + optax", jit_optax_step(mlp_loss, tx), lambda s: s),
        ("pinned_host offload", offload, lambda s: jax.device_put(s, on_host)),
    ):
        held = [copy(), None]
        held[1] = place(tx.init(held[0]))

        def run(fn=fn, held=held):
            p, s = held
            for _ in range(STEPS):
                p, s, _ = fn(p, s, batch)
            held[:] = jax.block_until_ready((p, s))

        loops[name] = run

    grad = jax.jit(jax.value_and_grad(mlp_loss))
    held_p = copy()

    def compute():
        out = None
        for _ in range(STEPS):
            out = grad(held_p, batch)
        jax.block_until_ready(out)

    loops["compute alone (value_and_grad)"] = compute
    n = sum(x.size for x in jax.tree.leaves(params))
    return loops, n


def test_host_proxy_step_against_its_floor(benchmark):
    cpu = jax.devices("cpu")[0]
    loops, n = _loops(cpu)
    for run in loops.values():
        run()  # compile, warm
    rounds = benchmark.pedantic(interleaved, args=(loops, REPEATS), rounds=1, iterations=1)
    t = {name: s / STEPS for name, s in medians(rounds).items()}
    # The floor's other parts: a copy of the f32 gradient each way, the host Adam.
    src = np.ones(n, np.float32)
    dst = np.empty_like(src)
    t_copy = median_s(lambda: np.copyto(dst, src), REPEATS * 3)
    bench = lab_cpu().HostOptimizerBench(n)
    t_adam = median_s(lambda: bench.adam(False, True, True), REPEATS * 3, warmup=1)
    piece = min(1.0, coarse.Config().shard_bytes / (4 * n))
    t_compute = t["compute alone (value_and_grad)"]
    floor = max(t_compute, t_copy, t_adam) + piece * (2 * t_copy + t_adam)
    lines = [
        f"host-proxy step, {n / 1e6:.1f}M params, batch {BATCH}, 1 worker "
        f"({jax.devices('cpu')[0].device_kind}), median of {REPEATS} rounds x {STEPS} steps:",
        f"  floor {1e3 * floor:.2f} ms = max(compute {1e3 * t_compute:.2f}, copy "
        f"{1e3 * t_copy:.2f} each way, host adam {1e3 * t_adam:.2f}) + one piece "
        f"({piece:.2f} of the params)",
    ]
    for name, secs in t.items():
        lines.append(
            f"  {name:<34} {1e3 * secs:8.2f} ms  {secs / floor:5.2f}x floor  "
            f"{secs / t['jax.jit + optax']:5.2f}x jit+optax  "
            f"{secs / t['pinned_host offload']:5.2f}x pinned_host"
        )
        benchmark.extra_info[name] = 1e3 * secs
    benchmark.extra_info.update(
        {"floor_ms": 1e3 * floor, "copy_ms": 1e3 * t_copy, "host_adam_ms": 1e3 * t_adam}
    )
    print("\n" + "\n".join(lines))
