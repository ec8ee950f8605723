"""`coarse_jax.testing.stream_ops`: what the runtime asks of its streams, counted (issue 51).

The counts come from one layer every stream call passes (ffi/runtime/stream_ops.h),
the same on CUDA and on the stream-semantics CPU backend, which this machine runs
(``COARSE_JAX_BACKEND=streams``, in a subprocess, as a user selects it). A p = 1
``value_and_update`` step with its proxy on the worker's device, and one with a
proxy in host memory, are counted over 4 steady-state steps (after 3 that compile
and seed), twice, at two piece sizes. What holds today, and is asserted here:

* the counts are the same step after step (hand-offs between threads aside: whether
  a waiter was parked depends on timing);
* halving ``shard_bytes`` moves the same bytes between devices and to the host;
* the default CPU backend (an inline stream, one address space) copies nothing and
  never syncs the host.

Budgets that hold, asserted per steady step (issue 51):

* no host synchronization: the optimizer's scalars stay on the device (the
  kernels read them there), the step count's write is stream-ordered, and a loop
  that passes back the params it got runs no params check
  (coarse_jax/dispatch/params_check.py);
* with the proxy in host memory, what crosses to the host is the push, 4 bytes
  per f32 parameter, plus the loss and the three scalars (16 bytes; 64 allowed):
  the params check no longer crosses PCIe.

* with the proxy in host memory, the worker's launches, copies and events are per
  call: pushed pieces are packed side by side in staging by one launch and copied
  out where contiguous, on a copy stream beside the worker's (a mark and a wait
  per push, a join when the pushes' staging ring wraps), pulled pieces copied in side
  by side and unpacked by one launch, one stream wait per group of pieces (up to
  4 MiB); halving ``shard_bytes`` changes none of them.

* a span table is uploaded only where no resident slot holds it, at most one
  per launch; how many a step uploads depends on where XLA put the leaves'
  buffers, so only the data's copies up are held to equality.

The per-step counts are printed; the performance guide records them. What is
not a budget yet (the rest of issue 51): the shared device's proxy still
announces pieces as they are ready, so its launches and events vary a little
with timing and piece count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest
from helpers import gpu_or_skip

import coarse_jax as coarse
from coarse_jax.testing import active_backend, reset_stream_ops, stream_ops

_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, jax.numpy as jnp, numpy as np
    import coarse_jax as coarse
    from coarse_jax.testing import active_backend, reset_stream_ops, shared_device_mesh, stream_ops

    platform = sys.argv[1]  # "cpu": the stream-semantics backend; "gpu": CUDA
    assert platform == "gpu" or active_backend() == "streams", active_backend()
    device = jax.devices(platform)[0]

    def loss(p, b):
        h = jnp.tanh(b["x"] @ p["w1"])
        return jnp.mean((h @ p["w2"] - b["y"]) ** 2)

    rng = np.random.default_rng(0)
    params = {
        "w1": jnp.asarray(rng.standard_normal((64, 256)) * 0.05, jnp.float32),
        "w2": jnp.asarray(rng.standard_normal((256, 8)) * 0.05, jnp.float32),
    }
    batch = {
        "x": jnp.asarray(rng.standard_normal((16, 64)), jnp.float32),
        "y": jnp.zeros((16, 8), jnp.float32),
    }
    meshes = {
        "shared": shared_device_mesh(1, devices=[device]),
        "host": coarse.make_mesh(workers=1, proxies_on="host", devices=[device]),
    }
    out = {}
    for placement, mesh in meshes.items():
        for shard in (16 << 10, 8 << 10):
            # push_bytes=0: a push per tensor above shard_bytes (the plan
            # before push_bytes; the default batches them into fewer pushes),
            # so the calls are many and only the pieces change between sizes.
            cfg = coarse.Config(shard_bytes=shard, push_bytes=0, xla_below_bytes=0)
            step = coarse.sync(
                lambda p, b: coarse.value_and_update(loss, coarse.optim.adam(1e-3))(p, b),
                mesh=mesh, config=cfg,
            )
            p = params
            for _ in range(3):
                _, p = step(p, batch)
            windows = []
            for _ in range(2):
                jax.block_until_ready(p)
                step._wait_all()
                reset_stream_ops()
                for _ in range(4):
                    _, p = step(p, batch)
                jax.block_until_ready(p)
                step._wait_all()
                windows.append(stream_ops().per(4))
            pushes = sum(len(plan.buckets) for plan in step._traced_plans if not plan.xla)
            out[f"{placement}/{shard}"] = windows + [pushes]
    print(json.dumps(out))
    """
)


# Counts that depend on timing, not only on the step: whether a waiter was parked
# (hand-offs); whether a device published again before another waited for it (a
# stream or host wait is skipped when nothing new was published since the last);
# and whether a push's pieces were still arriving when the proxy got to them (the
# pieces already there are updated in one launch and announced with one record).
# Those are held to budgets, the rest to equality. The span tables a step
# uploads depend on where XLA put the leaves' buffers (a merged launch whose
# table a resident slot holds uploads nothing: SpanTables), so of the copies
# up only the data's are held to equality (copies_h2d - table_uploads), the
# uploads to a budget.
_TIMED = ("hand_offs", "stream_waits", "host_waits", "launches", "records")
_WHERE_LEAVES_ARE = ("copies_h2d", "bytes_h2d", "table_uploads")


def _data_up(window: dict) -> float:
    """The copies up that are data, not span tables."""
    return window["copies_h2d"] - window["table_uploads"]


def _counts(platform: str = "cpu") -> dict:
    """The script's counts on the stream-semantics backend ("cpu") or on CUDA ("gpu")."""
    env = dict(os.environ)
    if platform == "cpu":
        env["COARSE_JAX_BACKEND"] = "streams"
    env.pop("COARSE_JAX_STREAM_CHAOS", None)
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, platform],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd="/",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _assert_steady_and_within_budgets(counts: dict) -> None:
    for name, (first, second, pushes) in counts.items():
        print(
            f"\n{name} ({pushes} pushes): " + ", ".join(f"{k} {v:g}" for k, v in first.items() if v)
        )
        assert first["launches"] > 0 and first["records"] > 0, name
        assert first["copies_h2d"] > 0, name
        for kind in first:
            if kind not in _TIMED + _WHERE_LEAVES_ARE:
                assert first[kind] == second[kind], (name, kind, first[kind], second[kind])
        assert _data_up(first) == _data_up(second), (name, first, second)
    for placement in ("shared", "host"):
        big, small = counts[f"{placement}/16384"][0], counts[f"{placement}/8192"][0]
        for kind in ("bytes_peer", "bytes_d2h", "bytes_d2d"):
            assert big[kind] == small[kind], (placement, kind, big[kind], small[kind])
    # With the proxy in host memory the worker's work is per call, not per piece:
    # halving the pieces changes no launch or copy, and the records and stream
    # waits by at most one each in a 4-step window. That one is timing's, found:
    # a session takes a spare storage set from the pool, and when the previous
    # step's last thread has not yet given its set back, the step runs on the
    # other spare set, whose push staging ring wraps at another step (each set
    # keeps its own cursor, CopyMarks): that window has one wrap join fewer or
    # more (a record and a wait; seen as 13 vs 12.75 records on jax 0.12, and
    # 9 vs 8.75 waits on jax 0.10, in about one window of 20, before and after
    # the CPU's inline stream). Per piece it would be 3 or more a window.
    kinds = ("launches", "copies_d2h", "copies_peer")
    for kind in kinds:
        assert big[kind] == small[kind], ("host", kind, big[kind], small[kind])
    for kind in ("records", "stream_waits"):
        assert abs(big[kind] - small[kind]) <= 0.25, ("host", kind, big, small)
    assert _data_up(big) == _data_up(small), ("host", big, small)
    # A proxy in host memory is reached over PCIe only: no peer copies, and host waits.
    host = counts["host/16384"][0]
    assert host["copies_peer"] == 0 and host["bytes_d2h"] > 0 and host["host_waits"] > 0
    # The budgets (see the top of this file).
    n = 64 * 256 + 256 * 8
    for name, (first, second, pushes) in counts.items():
        calls = pushes + 4  # coarse_begin, coarse_opt_count, the pushes, the ring, the pull
        for window in (first, second):
            assert window["host_syncs"] == 0, (name, window)
            # A span table is uploaded only for a pack or unpack launched on it,
            # and only when no resident slot held it.
            assert window["table_uploads"] <= window["launches"], (name, window)
            if name.startswith("host/"):
                assert window["bytes_d2h"] <= 4 * n + 64, (name, window["bytes_d2h"], 4 * n)
                # One stream, the worker's: a pack per push, the pull's one unpack,
                # and 3 more (coarse_begin's and the ring's token, the scalars' copy).
                assert window["launches"] <= pushes + 4, (name, window, pushes)
                # A transfer and a span table per call at most (the push's pack and
                # copy out, the pull's copy in and unpack).
                copies = sum(window[f"copies_{d}"] for d in ("d2d", "peer", "d2h", "h2d"))
                assert copies <= 2 * calls, (name, window, calls)
                # A record and a wait per call, 2 more for the storage's previous
                # user, and the copy stream's (StreamDevice's `copies`: the copies
                # down run beside the worker's stream, so the backward pass goes on
                # while they run): per push the worker's stream marks the pack, the
                # copy stream waits for the mark and records the worker's event
                # after its copy (+1 over the one record a push made before), and
                # once per wrap of the pushes' staging ring (two calls' worth: here
                # every other step) a record and a wait join the two (+2). The pull's copies up run
                # on a copy-up stream with the flag waits that gate them (one per
                # group of pieces, 4 MiB, here one): it waits for the worker's
                # stream before its first copy and the worker's stream waits for
                # it before the unpack, a record and a wait each (+4 a pull).
                events = window["records"] + window["stream_waits"]
                assert events <= 2 * calls + pushes + 8, (name, window, calls)
                continue
            # Two streams on one GPU: the worker's, at most one launch per push plus 4
            # (coarse_begin's and the ring's token, the scalars' copy, the pull's one
            # unpack), and the proxy's, at most one optimizer launch per push.
            assert window["launches"] <= 2 * pushes + 4, (name, window, pushes)
            # The span table of each push, of the scalars' copy and of the pull, and
            # the step count's upload: one copy per call at most.
            copies = sum(window[f"copies_{d}"] for d in ("d2d", "peer", "d2h", "h2d"))
            assert copies <= calls, (name, window, calls)
            # A record per call and device at most, a wait per record at most, and
            # 2 more: each device orders itself after the storage's previous user.
            events = window["records"] + window["stream_waits"]
            assert events <= 2 * calls + 2, (name, window, calls)


def test_stream_ops_count_a_steady_step_on_the_streams_backend():
    _assert_steady_and_within_budgets(_counts("cpu"))


def test_a_gpu_is_asked_what_the_streams_backend_counts():
    """On a GPU (COARSE_TEST_GPU=1, tools/gpu_check.sh): the same step holds the same
    budgets, and its copies and their bytes, which do not depend on timing, equal the
    streams backend's: the CPU count describes the GPU. The span tables uploaded depend
    on where each platform's XLA put the leaves: only the data's copies up compare, and
    the GPU's uploads are printed (a GPU run is where a step should upload none)."""
    if os.environ.get("COARSE_TEST_GPU") != "1":
        pytest.skip("a GPU test: COARSE_TEST_GPU=1 on a GPU host")
    gpu_or_skip()
    on_gpu, on_cpu = _counts("gpu"), _counts("cpu")
    _assert_steady_and_within_budgets(on_gpu)
    for name, (gpu, _, _) in on_gpu.items():
        cpu = on_cpu[name][0]
        print(
            f"{name}: table uploads per step, GPU {gpu['table_uploads']:g}, CPU "
            f"{cpu['table_uploads']:g}"
        )
        for kind in gpu:
            if kind in _WHERE_LEAVES_ARE:
                continue
            if kind.startswith(("copies_", "bytes_")) or kind == "host_syncs":
                assert gpu[kind] == cpu[kind], (name, kind, gpu[kind], cpu[kind])
        assert _data_up(gpu) == _data_up(cpu), (name, gpu, cpu)


def test_the_default_cpu_backend_copies_nothing_and_never_syncs():
    """The default CPU backend (the suite's) runs the stream API inline, in one address
    space: a step launches its packs, sums and unpacks but copies nothing between devices
    or to the host, uploads no span table and never waits on the host; the reset zeroes
    the counts."""
    if active_backend() != "cpu":  # the suite run whole under COARSE_JAX_BACKEND=streams
        pytest.skip("the default CPU backend's property; this process runs on streams")
    mesh = coarse.make_mesh(workers=2)
    step = coarse.sync(
        lambda w, b: coarse.value_and_grad(lambda w, b: jnp.mean((b @ w) ** 2))(w, b),
        mesh=mesh,
        config=coarse.Config(xla_below_bytes=0),
    )
    reset_stream_ops()
    jax.block_until_ready(step(jnp.ones((3,)), jnp.ones((4, 3))))
    step._wait_all()  # the proxies' jobs too: nothing of the step counts after the reset
    ops = stream_ops()
    assert ops.launches > 0, ops
    copies = ops.copies_d2d + ops.copies_peer + ops.copies_d2h + ops.copies_h2d
    assert copies == ops.table_uploads == ops.host_waits == ops.host_syncs == 0, ops
    reset_stream_ops()
    assert stream_ops().hand_offs == 0


# --- The proxies' ring among q > 1 device proxies (issue 64, item 1) -------------------
#
# p = 2 and p = 4 workers with q = p proxies on devices, and 4:2 (k:1), each with
# value_and_update and value_and_grad, at two piece sizes that differ only in the number
# of pieces (w1 and w2 cut into 4 or 8 pieces; the loss one piece either way). The ring
# steps a push's pieces as one group (ffi/runtime/ring_groups.h: a leaf's shards, up to
# 4 MiB of f32), so what a step asks of its streams is per call, not per piece.
_RING_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, warnings
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, jax.numpy as jnp, numpy as np
    import coarse_jax as coarse
    from coarse_jax._ffi.stream_ops import set_ring_group_floats
    from coarse_jax.testing import active_backend, reset_stream_ops, stream_ops

    assert active_backend() == "streams", active_backend()
    if sys.argv[1] != "default":  # the deliberate bug: the ring per piece again
        set_ring_group_floats(int(sys.argv[1]))
    warnings.simplefilter("ignore")  # ProxiesReplaced: each step is decorated after its mesh

    def loss(p, b):
        h = jnp.tanh(b["x"] @ p["w1"])
        return jnp.mean((h @ p["w2"] - b["y"]) ** 2)

    rng = np.random.default_rng(0)
    params = {
        "w1": jnp.asarray(rng.standard_normal((64, 256)) * 0.05, jnp.float32),
        "w2": jnp.asarray(rng.standard_normal((256, 64)) * 0.05, jnp.float32),
    }
    out = {}
    for p, q in ((2, 2), (4, 4), (4, 2)):
        batch = {
            "x": jnp.asarray(rng.standard_normal((4 * p, 64)), jnp.float32),
            "y": jnp.zeros((4 * p, 64), jnp.float32),
        }
        for kind in ("update", "grad"):
            for shard in (16 << 10, 8 << 10):
                mesh = coarse.make_mesh(workers=p, proxies=q)
                cfg = coarse.Config(shard_bytes=shard, push_bytes=0, xla_below_bytes=0)
                if kind == "update":
                    fn = lambda w, b: coarse.value_and_update(loss, coarse.optim.adam(1e-3))(w, b)
                else:
                    def fn(w, b):
                        l, g = coarse.value_and_grad(loss)(w, b)
                        return l, jax.tree.map(lambda a, c: a - 1e-3 * c, w, g)
                step = coarse.sync(fn, mesh=mesh, config=cfg)
                w = params
                for _ in range(3):
                    _, w = step(w, batch)
                windows = []
                for _ in range(2):
                    jax.block_until_ready(w)
                    step._wait_all()
                    reset_stream_ops()
                    for _ in range(3):
                        _, w = step(w, batch)
                    jax.block_until_ready(w)
                    step._wait_all()
                    windows.append(stream_ops().per(3))
                pushes = sum(len(plan.buckets) for plan in step._traced_plans if not plan.xla)
                out[f"{p}:{q}/{kind}/{shard}"] = windows + [pushes]
    print(json.dumps(out))
    """
)

# Of the counts held below, those timing moves (see _TIMED above), as a share of the
# larger: a record is skipped when nothing was enqueued since the device's last one
# (seen: at most 1.5%, 136.3 vs 137.7 a step at 4:4), a stream wait when the device
# waited for has not published since, which depends on which proxy got where first
# (seen: up to 15%, 130 vs 150 a step at 4:4, in one window of the same step). A ring
# stepped per piece (the deliberate bug) moves launches by 41-47%, peer copies by
# 42-48%, records by 45-48% and stream waits by 19-47% here: the waits' window does
# not catch it at 4:2 (19-22%), the other three do everywhere. Records' window was 5%
# until a run at load 4 (this suite beside a build on the 2 cores) moved them by 5.6%
# (28.33 vs 30.0 a step at 2:2): 10% holds that and still catches the ring per piece.
_RING_TIMED_SLACK = {"records": 0.10, "stream_waits": 0.25}


def _ring_counts(group_floats: str = "default") -> dict:
    env = dict(os.environ, COARSE_JAX_BACKEND="streams")
    env.pop("COARSE_JAX_STREAM_CHAOS", None)
    proc = subprocess.run(
        [sys.executable, "-c", _RING_SCRIPT, group_floats],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd="/",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ring_budget(p: int, q: int, calls: int, pushes: int) -> int:
    """The most launches, peer copies, records or stream waits a steady step may ask of
    its streams with q proxies on devices ring-reducing: a small multiple of C + B.

    Each push is one ring group. Every one of the q proxies runs its 2(q - 1) ring steps
    per group, each step for both rings: a peer copy, a launch and a record each, so
    per group 4 q (q - 1) of each; a group's sum of its k clients' slots, its optimizer
    (one launch per half) and its announcement, a few more per proxy. Every call of a
    worker asks at most 4 of each (a pack or unpack, a copy, a record, a wait). The
    multiple is therefore 4 q (q - 1) + 4 q: 16 at q = 2, 64 at q = 4; it does not
    depend on the number of pieces, which the equalities below hold exactly.
    """
    return (4 * q * (q - 1) + 4 * q) * (calls + pushes)


def _assert_ring_per_call(counts: dict) -> None:
    for name, (first, _, pushes) in counts.items():
        print(
            f"\n{name} ({pushes} pushes): "
            + ", ".join(
                f"{k} {first[k]:g}"
                for k in ("launches", "copies_peer", "records", "stream_waits", "hand_offs")
            )
        )
    for layout in ("2:2", "4:4", "4:2"):
        p, q = (int(x) for x in layout.split(":"))
        for kind in ("update", "grad"):
            big_name, small_name = f"{layout}/{kind}/16384", f"{layout}/{kind}/8192"
            (big, big2, pushes), (small, small2, _) = counts[big_name], counts[small_name]
            calls = p * (pushes + 4)  # per worker: begin, opt_count, the pushes, ring, pull
            budget = _ring_budget(p, q, calls, pushes)
            for window in (big, big2, small, small2):
                assert window["host_syncs"] == 0, (big_name, window)
                for k in ("launches", "copies_peer", "records", "stream_waits"):
                    assert window[k] <= budget, (big_name, k, window[k], budget)
            # Per call: halving the pieces changes no launch or peer copy, nor their
            # bytes, and the timed counts by at most the slack.
            for k in ("launches", "copies_peer", "bytes_peer"):
                for a, b in ((big, small), (big2, small2), (big, big2)):
                    assert a[k] == b[k], (big_name, k, a[k], b[k])
            for k in ("records", "stream_waits"):
                for a, b in ((big, small), (big2, small2)):
                    assert abs(a[k] - b[k]) <= _RING_TIMED_SLACK[k] * max(a[k], b[k]), (
                        big_name,
                        k,
                        a[k],
                        b[k],
                    )


def test_the_proxies_ring_asks_per_call_not_per_piece():
    _assert_ring_per_call(_ring_counts())


def test_a_ring_stepped_per_piece_fails_the_ring_budgets():
    """The deliberate bug: a ring group bound of 0 steps the ring piece by piece again
    (coarse_jax._ffi.stream_ops.set_ring_group_floats), as before issue 64; the budgets
    above must catch it."""
    with pytest.raises(AssertionError, match=r"launches|copies_peer|records|stream_waits"):
        _assert_ring_per_call(_ring_counts("0"))


# --- Issue 64, items 2-4: work per call on every layout: p = 1 shared, p = 1 host,
# q = 2 host proxies, p = 2 and p = 4 with q = p device proxies, 4:2 (k:1), with
# clipping, and value_and_grad beside value_and_update. (The ring script above holds
# the device rings' launches and copies on a smaller model, with value_and_grad too.)
#
# An 8-layer MLP, 256 wide (2 MiB of f32 weights, each 256 KiB weight its own
# push, and the loss's: B = 9), at 16 KiB and at 64 KiB pieces (129 and 33
# pieces): the calls are the same, only the number of pieces changes, 4x. C = B + 4 calls a step
# (coarse_begin, coarse_opt_count, the pushes, the ring, the pull; a
# value_and_grad step has no opt_count, so C is an upper bound there).
#
# Budgets, per steady step (a 4-step window's mean), each with its reason (C
# and B are summed over the p workers: the counts are the process's):
# * launches, copies, records and stream waits, each at most 2 (C + B): a
#   call launches, copies, records and waits at most once on each of the two
#   streams it reaches (the worker's and the proxy's, or a copy stream beside
#   the worker's), and a push once more for its copy down to a proxy in host
#   memory. Per piece they pass it at 16 KiB (clipping: 269 launches, 129
#   copies, 140 records a step before).
# * the same at both piece sizes: copies exactly; launches, records and
#   stream waits within _SAME_WITHIN = 2B a step. A wait is skipped, a record
#   saved or a piece merged into the launch before when a peer got there
#   first, so these depend on timing: at most a record and a wait per push
#   (its pieces announced in two parts when the proxy reached the push while
#   they were arriving). Measured, 4 runs at load 7-8: within 8.25 a step
#   (value_and_grad on the shared device), 0-3.25 elsewhere. A count per
#   piece differs by 96 a step.
# * no host synchronization.
# * hand-offs (a parked runtime thread woken) at most C + B + R + _HAND_OFF_SLACK:
#   a push wakes each proxy it reached once (B), a proxy its pulls once per
#   pull group (4 MiB: one here) and each wait of a call on a peer's progress
#   ends once (C: the step's begin, the optimizer's inputs, the storage's
#   previous user, the proxies' leaving); the slack, 8, is the session's jobs
#   starting and the pool's threads. With q > 1 proxies, R = 4 q (q - 1)
#   per push: each of the q proxies waits on its predecessor once per ring
#   step of a push's group, 2 (q - 1) steps in each of the two rings (the
#   ring per group, ffi/runtime/ring_groups.h). Measured, 4 runs at load
#   7-8: 1-13 a step at q = 1 (C + B = 22); 2026-12-03, one run each at load
#   2-3: 24-60 at 2:2 (C + B + R = 116), 75-98 at 4:4 (520), 22-39 at 4:2
#   (160), 28-70 with 2 host proxies (116). Equal at both piece sizes within
#   _SAME_HAND_OFFS = 16 + R a step: at q = 1 the measured spread was 0-9.5
#   (whether a waiter had parked yet is timing), and which of the ring's
#   waits park is timing too (spread 0-40 a step at q > 1). A notify per
#   piece added 50-70 at 16 KiB at q = 1, and 60-400 at q > 1 (2:2: 162-278
#   a step, 4:2: 225-422, 2 host proxies: 338-398).
_MLP_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, warnings
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, jax.numpy as jnp, numpy as np
    import coarse_jax as coarse
    from coarse_jax import _ffi
    from coarse_jax.testing import reset_stream_ops, shared_device_mesh, stream_ops

    faults, names, push = int(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3])
    warnings.simplefilter("ignore")  # ProxiesReplaced: each step is decorated after its mesh
    if faults:
        _ffi.set_faults(faults)

    def loss(p, b):
        h = b["x"]
        for i in range(8):
            h = jnp.tanh(h @ p[f"w{i}"])
        return jnp.mean((h - b["y"]) ** 2)

    rng = np.random.default_rng(0)
    params = {
        f"w{i}": jnp.asarray(rng.standard_normal((256, 256)) * 0.06, jnp.float32) for i in range(8)
    }

    def sgd_step(p, b):
        value, grads = coarse.value_and_grad(loss)(p, b)
        return value, jax.tree.map(lambda w, g: w - 0.01 * g, p, grads)

    adam = coarse.optim.adam(1e-3)
    layouts = {  # name: (the mesh, the proxy optimizer or None (value_and_grad), q)
        "shared": (lambda: shared_device_mesh(1), adam, 1),
        "host": (lambda: coarse.make_mesh(workers=1, proxies_on="host"), adam, 1),
        "host2": (lambda: coarse.make_mesh(workers=2, proxies=2, proxies_on="host"), adam, 2),
        "dev2": (lambda: coarse.make_mesh(workers=2), adam, 2),
        "dev4": (lambda: coarse.make_mesh(workers=4), adam, 4),
        "k2": (lambda: coarse.make_mesh(workers=4, proxies=2), adam, 2),
        "clip": (lambda: shared_device_mesh(1), coarse.optim.adamw(1e-3, clip_norm=1.0), 1),
        "grad_shared": (lambda: shared_device_mesh(1), None, 1),
        "grad_host": (lambda: coarse.make_mesh(workers=1, proxies_on="host"), None, 1),
        "grad_dev2": (lambda: coarse.make_mesh(workers=2), None, 2),
    }
    out = {}
    for name in names:
        make_mesh, opt, proxies = layouts[name]
        mesh = make_mesh()
        rows = 8 * mesh.shape["data"]
        batch = {
            "x": jnp.asarray(rng.standard_normal((rows, 256)), jnp.float32),
            "y": jnp.asarray(rng.standard_normal((rows, 256)) * 0.1, jnp.float32),
        }
        for shard in (16 << 10, 64 << 10):
            # push_bytes 0: the issue's model, each 256 KiB weight its own push
            # (the plan before push_bytes), B = 9; the default (4 MiB): the
            # weights in one push, B = 2. At both sizes either way.
            cfg = coarse.Config(shard_bytes=shard, push_bytes=push, xla_below_bytes=0)
            fn = sgd_step if opt is None else (
                lambda p, b, opt=opt: coarse.value_and_update(loss, opt)(p, b))
            step = coarse.sync(fn, mesh=mesh, config=cfg)
            p = params
            for _ in range(3):
                _, p = step(p, batch)
            windows = []
            for _ in range(2):
                jax.block_until_ready(p)
                step._wait_all()
                reset_stream_ops()
                for _ in range(4):
                    _, p = step(p, batch)
                jax.block_until_ready(p)
                step._wait_all()
                windows.append(stream_ops().per(4))
            pushes = sum(len(plan.buckets) for plan in step._traced_plans if not plan.xla)
            pieces = sum(len(plan.pieces) for plan in step._traced_plans if not plan.xla)
            out[f"{name}/{shard}"] = {
                "windows": windows, "pushes": pushes, "pieces": pieces,
                "workers": mesh.shape["data"], "proxies": proxies,
            }
    print(json.dumps(out))
    """
)

_PER_CALL = (
    "shared", "host", "host2", "dev2", "dev4", "k2", "clip", "grad_shared", "grad_host",
    "grad_dev2",
)  # fmt: skip
_DEVICE_RINGS = ("dev2", "dev4", "k2", "grad_dev2")  # launches etc.: _ring_budget (above)
_PER_CALL_KINDS = ("launches", "copies", "records", "stream_waits")
_SAME_WITHIN = 2  # x B, per step: launches, records, stream waits at the two sizes (above)
_HAND_OFF_SLACK = 8  # per step, over C + B + R (above)
_SAME_HAND_OFFS = 16.0  # per step, between the two piece sizes, + R (measured spread: above)


def _mlp_counts(layouts: tuple[str, ...], faults: int = 0, push_bytes: int = 0) -> dict:
    env = dict(os.environ, COARSE_JAX_BACKEND="streams")
    env.pop("COARSE_JAX_STREAM_CHAOS", None)
    proc = subprocess.run(
        [sys.executable, "-c", _MLP_SCRIPT, str(faults), ",".join(layouts), str(push_bytes)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd="/",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _per_step(window: dict, kind: str) -> float:
    if kind == "copies":  # the data's: span tables depend on where XLA put the leaves
        return (
            sum(window[f"copies_{d}"] for d in ("d2d", "peer", "d2h", "h2d"))
            - window["table_uploads"]
        )
    return window[kind]


def _assert_per_call(counts: dict, layout: str) -> None:
    """The budgets above, for `layout` at both piece sizes."""
    small, big = counts[f"{layout}/16384"], counts[f"{layout}/65536"]
    assert small["pushes"] == big["pushes"] and small["pieces"] > 3 * big["pieces"], (small, big)
    # The counts are the process's: p workers' calls and pushes (and their proxies').
    b = small["pushes"] * small["workers"]
    c = b + 4 * small["workers"]
    q = small["proxies"]
    ring = 4 * q * (q - 1) * small["pushes"]  # R: the ring's waits, each may park once
    most = (
        _ring_budget(small["workers"], q, c, small["pushes"])
        if layout in _DEVICE_RINGS
        else 2 * (c + b)
    )
    for size in (small, big):
        for window in size["windows"]:
            assert window["host_syncs"] == 0, (layout, window)
            for kind in _PER_CALL_KINDS:
                assert _per_step(window, kind) <= most, (layout, kind, window, c, b)
            hand_offs = c + b + ring + _HAND_OFF_SLACK
            assert window["hand_offs"] <= hand_offs, (layout, "hand_offs", window, hand_offs)
    for kind in (*_PER_CALL_KINDS, "hand_offs"):
        # b: all the pushes
        within = {"copies": 0, "hand_offs": _SAME_HAND_OFFS + ring}.get(kind, _SAME_WITHIN * b)
        for w_small, w_big in zip(small["windows"], big["windows"], strict=True):
            a, z = _per_step(w_small, kind), _per_step(w_big, kind)
            assert abs(a - z) <= within, (layout, kind, a, z)


def _print_per_call(counts: dict) -> None:
    for name, got in counts.items():
        w = got["windows"]
        print(
            f"\n{name} ({got['pushes']} pushes, {got['pieces']} pieces): "
            + ", ".join(
                f"{k} {_per_step(w[0], k):g}/{_per_step(w[1], k):g}"
                for k in (*_PER_CALL_KINDS, "host_syncs", "hand_offs")
            )
        )


@pytest.mark.parametrize("push_bytes", [0, 4 << 20], ids=["push-per-weight", "push-bytes-4MiB"])
def test_every_layouts_step_is_work_per_call_at_two_piece_sizes(push_bytes):
    """Issue 64's budgets on the streams backend: nothing grows with the number of pieces,
    with a push per weight (9 a worker) and with the default push_bytes (2: the ring's
    groups then span the weights of one push, ffi/runtime/ring_groups.h)."""
    counts = _mlp_counts(_PER_CALL, push_bytes=push_bytes)
    _print_per_call(counts)
    for layout in _PER_CALL:
        _assert_per_call(counts, layout)


@pytest.mark.parametrize(
    ("fault", "layouts"),
    [(1, ("host", "host2")), (2, ("clip",))],
    ids=["notify-per-piece", "clip-host-sync-per-piece"],
)
def test_the_budgets_catch_the_old_per_piece_costs(fault, layouts):
    """A deliberate fault brings an old cost back (testing.deliberate_faults): a notify
    per piece (hand-offs grow with the pieces), a host synchronization per owned range
    of the global norm. The budgets above must fail. The notify per piece is shown on a
    proxy in host memory, whose pull parks while the host optimizer makes its pieces
    final, and on two host proxies. On device proxies the pull mostly finds its pieces
    final already, so what the notifies cost is timing: 1-122 hand-offs a step on the
    shared device; at 4:2 162-422 a step at 16 KiB pieces in a run at load 2-3, but
    37-92 in a CI run at load 4 (a build beside it), inside the budget of 168, so
    neither is caught every run."""
    counts = _mlp_counts(layouts, faults=fault)
    _print_per_call(counts)
    for layout in layouts:
        with pytest.raises(AssertionError):
            _assert_per_call(counts, layout)
