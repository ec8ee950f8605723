"""Voluntary context switches per step, at small pieces against the default ones.

Issue 64's goal for the hand-offs: a thread is woken when what it waits for may be
complete (a pull's group, a push's bucket), not once per piece, so a step's voluntary
context switches (the process's, every thread's: ``getrusage``'s ``ru_nvcsw``) should
not grow with the number of pieces. The goal: at 16 KiB pieces at most 1.3x what the
same step takes at the default 4 MiB.

The step: the stream budget test's ``value_and_update`` Adam step of an 8-layer MLP,
256 wide (2.1 MB of f32), at p = 1 with its proxy on the worker's device
(``coarse_jax.testing.shared_device_mesh(1)``). At the default ``push_bytes`` (4 MiB)
every size pushes the same 2 buckets (the loss, and the 8 weights together), in 129,
33 and 2 pieces at 16 KiB, 64 KiB and 4 MiB: only the pieces differ. A fourth step,
16 KiB with ``push_bytes=0`` (each 256 KiB weight a push of its own, 9 pushes: the plan
before ``push_bytes``), shows what a push costs. The steps are compiled in one process
and run interleaved, ``ROUNDS`` rounds of ``STEPS`` steps each, each step waited for,
so the host thread's own waits are the same in all; the ratios of their medians are
printed with the machine's load, once per CPU backend (the default one, and
``COARSE_JAX_BACKEND=streams``: a GPU's orchestration), each in a fresh process.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap

import pytest

ROUNDS, STEPS = 12, 10
# (name, shard_bytes, push_bytes): the default push_bytes at three piece sizes,
# and a push per weight at 16 KiB.
SIZES = [
    ("16 KiB", 16 << 10, 4 << 20),
    ("64 KiB", 64 << 10, 4 << 20),
    ("4 MiB", 4 << 20, 4 << 20),
    ("16 KiB, push_bytes=0", 16 << 10, 0),
]

_SCRIPT = textwrap.dedent(
    """
    import json, os, resource, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, jax.numpy as jnp, numpy as np
    import coarse_jax as coarse
    from coarse_jax.testing import active_backend, shared_device_mesh

    rounds, steps = int(sys.argv[1]), int(sys.argv[2])
    SIZES = json.loads(sys.argv[3])

    def loss(p, b):
        h = b["x"]
        for i in range(8):
            h = jnp.tanh(h @ p[f"w{i}"])
        return jnp.mean((h - b["y"]) ** 2)

    rng = np.random.default_rng(0)
    params = {
        f"w{i}": jnp.asarray(rng.standard_normal((256, 256)) * 0.06, jnp.float32) for i in range(8)
    }
    batch = {
        "x": jnp.asarray(rng.standard_normal((8, 256)), jnp.float32),
        "y": jnp.asarray(rng.standard_normal((8, 256)) * 0.1, jnp.float32),
    }
    mesh = shared_device_mesh(1)
    runs = {}
    for name, shard, push in SIZES:
        cfg = coarse.Config(shard_bytes=shard, push_bytes=push, xla_below_bytes=0)
        step = coarse.sync(
            lambda p, b: coarse.value_and_update(loss, coarse.optim.adam(1e-3))(p, b),
            mesh=mesh, config=cfg,
        )
        p = params
        for _ in range(5):
            _, p = step(p, batch)
        jax.block_until_ready(p)
        runs[name] = [step, p]
    per_step = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            step, p = run
            before = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
            for _ in range(steps):
                _, p = step(p, batch)
                jax.block_until_ready(p)
            per_step[name].append(
                (resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - before) / steps)
            run[1] = p
    print(json.dumps({
        "backend": active_backend(),
        "plans": {
            s: [
                sum(len(getattr(pl, kind)) for pl in r[0]._traced_plans if not pl.xla)
                for kind in ("buckets", "pieces")
            ]
            for s, r in runs.items()
        },
        "per_step": per_step,
    }))
    """
)


def _run(backend: str | None) -> dict:
    env = dict(os.environ)
    env.pop("COARSE_JAX_STREAM_CHAOS", None)
    env.pop("COARSE_JAX_BACKEND", None)
    if backend:
        env["COARSE_JAX_BACKEND"] = backend
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(ROUNDS), str(STEPS), json.dumps(SIZES)],
        env=env, capture_output=True, text=True, timeout=900, cwd="/",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.benchmark(group="context-switches")
@pytest.mark.parametrize("backend", [None, "streams"], ids=["default-cpu", "streams"])
def test_context_switches_do_not_grow_with_the_pieces(benchmark, backend):
    got = benchmark.pedantic(_run, args=(backend,), rounds=1, iterations=1)
    per, plans = got["per_step"], got["plans"]

    def size(name: str) -> str:
        pushes, pieces = plans[name]
        return f"{name} ({pushes} pushes, {pieces} pieces) {statistics.median(per[name]):.1f}"

    def ratio(a: str, b: str) -> str:
        rounds = [x / y for x, y in zip(per[a], per[b], strict=True) if y > 0]
        whole = statistics.median(per[a]) / max(statistics.median(per[b]), 1e-9)
        return f"{whole:.2f} (per round {min(rounds):.2f}-{max(rounds):.2f})"

    print(
        f"\n{got['backend']} backend, load {os.getloadavg()[0]:.1f}: voluntary context switches "
        f"per step, median of {ROUNDS} rounds of {STEPS}: "
        + ", ".join(size(name) for name, _, _ in SIZES)
        + f"; 16 KiB / 4 MiB {ratio('16 KiB', '4 MiB')} (goal: at most 1.3), "
        f"16 KiB / 64 KiB {ratio('16 KiB', '64 KiB')}, a push per weight / 16 KiB "
        f"{ratio('16 KiB, push_bytes=0', '16 KiB')}"
    )
