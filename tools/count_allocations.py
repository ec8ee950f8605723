"""Heap allocations per steady step: coarse_jax against `jax.jit` + optax.

Builds a malloc counter (a shared object preloaded into each run, with gcc),
then runs the budget test's MLP step (tests/test_stream_ops.py) on the
stream-semantics backend: `jax.jit` + optax, and `coarse.value_and_update`
with its proxy on the worker's device and in host memory, each at two piece
sizes, 200 steady steps each. Allocations per piece show as a difference
between the two sizes. The performance guide ("Per-call objects kept")
records the figures.

    .venv/bin/python tools/count_allocations.py
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile

COUNTER = r"""
#include <stddef.h>
#include <stdatomic.h>
extern void* __libc_malloc(size_t);
static atomic_long count;
void* malloc(size_t n) {
  atomic_fetch_add_explicit(&count, 1, memory_order_relaxed);
  return __libc_malloc(n);
}
long coarse_malloc_count(void) { return atomic_load(&count); }
"""

STEP = r"""
import ctypes, os, sys
import jax, jax.numpy as jnp, numpy as np, optax
import coarse_jax as coarse
from coarse_jax.testing import set_default_xla_below_bytes, shared_device_mesh

set_default_xla_below_bytes(0)
count = ctypes.CDLL(None).coarse_malloc_count
count.restype = ctypes.c_long

def loss(p, b):
    return jnp.mean((jnp.tanh(b["x"] @ p["w1"]) @ p["w2"] - b["y"]) ** 2)

rng = np.random.default_rng(0)
params = {"w1": jnp.asarray(rng.standard_normal((64, 256)) * 0.05, jnp.float32),
          "w2": jnp.asarray(rng.standard_normal((256, 8)) * 0.05, jnp.float32)}
batch = {"x": jnp.asarray(rng.standard_normal((16, 64)), jnp.float32),
         "y": jnp.zeros((16, 8), jnp.float32)}
kind, piece = sys.argv[1], int(sys.argv[2])
if kind == "jit":
    tx = optax.adam(1e-3)

    @jax.jit
    def jit_step(p, s):
        u, s = tx.update(jax.grad(loss)(p, batch), s, p)
        return optax.apply_updates(p, u), s

    state = (params, tx.init(params))
    run = lambda st: jit_step(*st)
else:
    dev = jax.devices("cpu")[0]
    mesh = (shared_device_mesh(1, devices=[dev]) if kind == "shared"
            else coarse.make_mesh(workers=1, proxies_on="host", devices=[dev]))
    step = coarse.sync(
        lambda p, b: coarse.value_and_update(loss, coarse.optim.adam(1e-3))(p, b),
        mesh=mesh, config=coarse.Config(shard_bytes=piece, xla_below_bytes=0))
    state = params
    run = lambda p: step(p, batch)[1]
for _ in range(5):
    state = run(state)
jax.block_until_ready(state)
steps, before = 200, count()
for _ in range(steps):
    state = run(state)
jax.block_until_ready(state)
print((count() - before) / steps)
"""


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src, lib = pathlib.Path(tmp, "count.c"), pathlib.Path(tmp, "count.so")
        src.write_text(COUNTER)
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", lib, src], check=True)
        env = dict(os.environ, LD_PRELOAD=str(lib), COARSE_JAX_BACKEND="streams")
        env["XLA_FLAGS"] = env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
        env.pop("COARSE_JAX_STREAM_CHAOS", None)
        print("allocations per steady step (streams backend)")
        for kind, pieces in (
            ("jit", (0,)),
            ("shared", (16 << 10, 8 << 10)),
            ("host", (16 << 10, 8 << 10)),
        ):
            for piece in pieces:
                out = subprocess.run(
                    [sys.executable, "-c", STEP, kind, str(piece)],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                    cwd=tmp,
                )
                label = "jax.jit + optax" if kind == "jit" else f"{kind}, {piece >> 10} KiB pieces"
                print(f"  {label:28s} {float(out.stdout.split()[-1]):7.1f}")


if __name__ == "__main__":
    main()
