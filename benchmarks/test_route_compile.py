"""A step's first call through the latency route against a plain per-leaf psum (issue 50).

The first call of a step that reduces a tree of many small float16 leaves (trace,
compile, run) at 4 workers, each in a fresh process with jax's persistent
compilation cache off, alternating between:

* ``route``: ``coarse.sync(lambda t: coarse.all_reduce(t))`` with the default
  Config, which on CPU workers gives a tree this small to the latency route (one
  psum of the whole tree as one f32 vector);
* ``psum``: ``jax.jit(shard_map(...))`` over the same workers with one
  ``lax.pmean`` per leaf.

The tree's leaves have the shapes of a ResNet's (conv kernels, biases, batch-norm
scales) cycling through 25 distinct shapes (1.2 MiB at 250 leaves: under the
route's 2 MiB); the arrays are placed on the workers
before the timing, so neither side pays for moving them. Reported per leaf count as
the ratio of the medians (goal: at most 1.5).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap

import pytest

ROUNDS = 3
_SCRIPT = textwrap.dedent(
    """
    import os, sys, time, json
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, jax.numpy as jnp, numpy as np
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P
    import coarse_jax as coarse

    impl, n = sys.argv[1], int(sys.argv[2])
    mesh = coarse.make_mesh(workers=4)
    workers = mesh  # the workers: what make_mesh returns
    widths = [4, 8, 16, 32, 64]
    shapes = []
    for i in range(n):
        c = widths[i % 5]
        shapes.append([(3, 3, c, c), (c,), (c,), (1, 1, c, 2 * c), (2 * c,)][(i // 5) % 5])
    rep = NamedSharding(workers, P())
    tree = [jax.device_put(jnp.full(s, 0.5, jnp.float16), rep) for s in shapes]
    jax.block_until_ready(tree)
    if impl == "route":
        step = coarse.sync(lambda t: coarse.all_reduce(t), mesh=mesh, batch_argnums=())
    else:
        def body(t):
            return [lax.pmean(lax.pcast(x, "data", to="varying"), "data") for x in t]
        step = jax.jit(jax.shard_map(body, mesh=workers, in_specs=(P(),), out_specs=P()))
    t0 = time.perf_counter()
    jax.block_until_ready(step(tree))
    s = time.perf_counter() - t0
    print(json.dumps({"s": s, "route": bool(coarse.diagnostics.plan(tree, mesh).xla)}))
    """
)


def _first_call_s(impl: str, leaves: int) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env.pop("COARSE_JAX_XLA_BELOW_BYTES", None)  # the user's default: the route on CPU
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, impl, str(leaves)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=True,
        cwd="/",
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["route"], "the tree must be small enough for the latency route"
    return float(result["s"])


@pytest.mark.parametrize("leaves", [50, 250])
def test_route_first_call_against_per_leaf_psum(benchmark, leaves):
    times: dict[str, list[float]] = {"route": [], "psum": []}

    def run() -> None:
        for _ in range(ROUNDS):  # alternating, so both meet the same machine load
            for impl in ("psum", "route"):
                times[impl].append(_first_call_s(impl, leaves))

    benchmark.pedantic(run, rounds=1, iterations=1)
    route, psum = statistics.median(times["route"]), statistics.median(times["psum"])
    benchmark.extra_info.update(
        {"route_s": times["route"], "psum_s": times["psum"], "ratio": route / psum}
    )
    print(
        f"\n{leaves} float16 leaves, first call at 4 workers (median of {ROUNDS}): route "
        f"{route:.2f} s, per-leaf psum {psum:.2f} s, ratio {route / psum:.2f} (goal <= 1.5)"
    )
