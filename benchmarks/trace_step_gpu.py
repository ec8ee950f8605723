"""Where a p = 1 ``coarse.value_and_update`` step leaves the GPU idle, from a CUPTI trace.

Usage (on a GPU host, coarse_jax built with CUDA; tools/gpu_check.sh runs it)::

    python benchmarks/trace_step_gpu.py [OUT_DIR]

Runs ``STEPS`` back-to-back adam steps of two MLPs (as benchmarks/test_step_gpu.py),
proxy on the same GPU (``shared_device_mesh``), and the same under jit + optax, each
under ``jax.profiler.trace``. From the GPU's activity (kernels and copies on every
stream, as CUPTI recorded them) it reports per step:

* **busy**: the time any stream of the GPU was working, and **idle**: the rest of the
  step (the span of the steps divided by their number, minus busy);
* **after host reads**: the idle time that starts at the end of a device-to-host copy
  of at most 64 bytes: the runtime's blocking reads (the optimizer's scalars on the
  worker's stream, the params check and the global norm on the proxy's). The GPU is
  idle there while the host that waited for the copy enqueues the next work.

That last figure is what the blocking reads cost a step (DEVELOPERS: remove them if
they cost more than 2% of a step). Writes ``trace_gpu.md`` to OUT_DIR when given.
"""

from __future__ import annotations

import glob
import os
import re
import sys
import tempfile

import jax
import jax.numpy as jnp
import optax

# Run as a script, not under pytest: the paths benchmarks/conftest.py adds,
# for the tests' helpers and the examples' clock (test_step_gpu imports both).
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
)
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
)
from helpers import make_batch, mlp_init, mlp_loss
from test_step_gpu import MODELS  # the same models as the step benchmark

import coarse_jax as coarse
from coarse_jax.testing import shared_device_mesh

STEPS = 10
SMALL_READ_BYTES = 64


SEEN: dict[str, str] = {}  # what the trace called things, for the report
STREAMS: list[str] = []  # idle after small reads, per stream


def _gpu_events(xspace_path: str):
    """[(start_ns, end_ns, name, bytes or None, stream)] of every GPU activity."""
    data = jax.profiler.ProfileData.from_file(xspace_path)
    events = []
    for plane in data.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            for ev in line.events:
                size = None
                for name, value in ev.stats:
                    text = f"{name}={value}"
                    m = re.search(r"(?:size|num_bytes|bytes)[:=]\s*(\d+)", text)
                    if m and ("memcpy" in name.lower() or "bytes" in name.lower()):
                        size = int(m.group(1))
                    if "memcpy" in ev.name.lower() and len(SEEN) < 8:
                        SEEN.setdefault(f"{ev.name} / {name}", str(value)[:80])
                start = ev.start_ns
                events.append((start, start + ev.duration_ns, ev.name, size, line.name))
    return sorted(events)


def _summary(events, steps: int) -> dict:
    if not events:
        return {}
    span = events[-1][1] - events[0][0]
    busy, cur_s, cur_e = 0.0, events[0][0], events[0][1]
    for s, e, *_ in events[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    # Idle after each small device-to-host read: until the next activity anywhere on
    # the GPU that starts after the read ends (no other stream busy in between).
    after_reads, reads, per_stream = 0.0, 0, {}
    for s, e, name, size, stream in events:
        lowered = name.lower()
        is_d2h = "d2h" in lowered or "dtoh" in lowered or "devicetohost" in lowered
        if not (is_d2h and size is not None and size <= SMALL_READ_BYTES):
            continue
        reads += 1
        running_past = any(s2 <= e < e2 for s2, e2, *_ in events if (s2, e2) != (s, e))
        if running_past:
            continue
        nxt = min((s2 for s2, *_ in events if s2 >= e), default=e)
        after_reads += nxt - e
        count, idle = per_stream.get(stream, (0, 0.0))
        per_stream[stream] = (count + 1, idle + nxt - e)
    return {
        "step_us": span / steps / 1e3,
        "busy_us": busy / steps / 1e3,
        "idle_us": (span - busy) / steps / 1e3,
        "reads": reads / steps,
        "after_reads_us": after_reads / steps / 1e3,
        "per_stream": {k: (c / steps, t / steps / 1e3) for k, (c, t) in per_stream.items()},
    }


def _trace(run, steps: int) -> dict:
    run()  # compile and warm outside the trace
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            run()
        paths = glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)
        if not paths:
            raise RuntimeError(f"jax.profiler.trace wrote no .xplane.pb under {d}")
        return _summary(_gpu_events(paths[0]), steps)


def main(out_dir: str | None) -> str:
    gpu = jax.devices("gpu")[0] if jax.default_backend() == "gpu" else jax.devices()[0]
    mesh = shared_device_mesh(workers=1, devices=[gpu])
    rows = []
    for model, (sizes, batch_size) in MODELS.items():
        params = jax.device_put(mlp_init(jax.random.key(0), sizes), gpu)
        batch = jax.device_put(make_batch(jax.random.key(1), batch_size, sizes[0], sizes[-1]), gpu)
        tx = optax.adam(1e-4)

        @jax.jit
        def ref_step(params, state, batch, tx=tx):
            loss, grads = jax.value_and_grad(mlp_loss)(params, batch)
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state, loss

        @coarse.sync(mesh, config=coarse.Config(timeout_s=120))
        def step(params, batch):
            loss, params = coarse.value_and_update(mlp_loss, coarse.optim.adam(1e-4))(params, batch)
            return params, loss

        ref, got = [params, tx.init(params)], [jax.tree.map(jnp.copy, params)]

        def run_ref(ref=ref, batch=batch, ref_step=ref_step):
            p, s = ref
            for _ in range(STEPS):
                p, s, _ = ref_step(p, s, batch)
            ref[:] = jax.block_until_ready((p, s))

        def run_coarse(got=got, batch=batch, step=step):
            p = got[0]
            for _ in range(STEPS):
                p, _ = step(p, batch)
            got[0] = jax.block_until_ready(p)

        for label, run in (("jit + optax", run_ref), ("coarse value_and_update", run_coarse)):
            s = _trace(run, STEPS)
            if not s:
                rows.append(f"| {model} | {label} | no GPU activity in the trace | | | | |")
                continue
            rows.append(
                f"| {model} | {label} | {s['step_us']:.0f} | {s['busy_us']:.0f} | "
                f"{s['idle_us']:.0f} | {s['reads']:.1f} | {s['after_reads_us']:.1f} "
                f"({100 * s['after_reads_us'] / s['step_us']:.2f}%) |"
            )
            for stream, (count, idle) in sorted(s["per_stream"].items()):
                STREAMS.append(f"{model}, {label}: {stream}: {count:.1f} reads, {idle:.1f} µs")
    text = "\n".join(
        [
            f"GPU: {gpu.device_kind}; jax {jax.__version__}; per step, over {STEPS} "
            "back-to-back steps, from jax.profiler's CUPTI trace",
            "",
            "| model | step | step µs | GPU busy µs | GPU idle µs | small D2H reads | "
            "idle after them µs (% of step) |",
            "|---|---|---:|---:|---:|---:|---:|",
            *rows,
            "",
            "Idle after small reads, per stream and step: " + "; ".join(STREAMS),
            "",
            "Copy events as the trace named them (event / stat: value): "
            + "; ".join(f"{k}: {v}" for k, v in SEEN.items()),
        ]
    )
    if out_dir:
        with open(os.path.join(out_dir, "trace_gpu.md"), "w") as f:
            f.write(text + "\n")
    return text


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else None))
