"""Config(trace=True): the timeline of one step nests and covers every phase once per piece."""

from __future__ import annotations

import json
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
from helpers import make_batch, mlp_init, mlp_loss

import coarse_jax as coarse

SIZES = (8, 16, 16, 4)


def _one_traced_step(workers, update=False):
    mesh = coarse.make_mesh(workers=workers)
    params = mlp_init(jax.random.key(0), SIZES)
    cfg = coarse.Config(  # xla_below_bytes=0: the proxies' timeline, however small the tree
        shard_bytes=512,
        leading_bytes=0 if update else 8 * 16 * 4 + 64,
        trace=True,
        xla_below_bytes=0,
    )

    @coarse.sync(mesh, config=cfg)
    def step(params, batch):
        if update:
            loss, new = coarse.value_and_update(mlp_loss, coarse.optim.adam(1e-3))(params, batch)
            return new, loss
        loss, grads = coarse.value_and_grad(mlp_loss)(params, batch)
        return grads, loss

    batch = make_batch(jax.random.key(1), 4 * workers, 8, 4)
    step.timeline()  # forget what earlier tests recorded
    jax.block_until_ready(step(params, batch))
    plan = coarse.diagnostics.plan(
        (params, jnp.float32(0)),
        mesh,
        coarse.Config(shard_bytes=512, leading_bytes=cfg.leading_bytes, xla_below_bytes=0),
    )
    return step.timeline(), plan


def _assert_nested(spans):
    by_device = {}
    for s in spans:
        by_device.setdefault(s.device, []).append(s)
    for device, own in by_device.items():
        stack = []
        for s in sorted(own, key=lambda s: (s.begin_us, -s.end_us)):
            while stack and stack[-1].end_us <= s.begin_us:
                stack.pop()
            if stack:
                assert s.end_us <= stack[-1].end_us, (device, stack[-1], s)
            stack.append(s)


def test_spans_nest_and_cover_each_phase_once_per_piece(tmp_path):
    p = 2
    timeline, plan = _one_traced_step(p)
    assert len(timeline.steps()) == 1
    spans = timeline.spans
    _assert_nested(spans)
    pieces = len(plan.pieces)
    assert pieces > 2
    count = Counter((s.device, s.name, s.piece) for s in spans)
    for w in range(p):
        assert count[(w, "push", -1)] >= 1
        assert count[(w, "worker ring", -1)] == 1
        assert count[(w, "pull", -1)] == 1
    for k in range(p):
        assert count[(p + k, "proxy ring", -1)] == 1
    for s in range(pieces):
        for w in range(p):
            assert count[(w, "push piece", s)] == 1
        for d in range(p):  # the workers pull; the proxies run no program
            assert count[(d, "pull piece", s)] == 1
            assert count[(d, "wait for the reduced piece", s)] == 1
        for k in range(p):
            assert count[(p + k, "wait for pushes", s)] == 1
            assert count[(p + k, "reduce-scatter", s)] == 1
            # On CPU the pulls read each proxy's reduced chunks in place: no
            # all-gather (GatherPull, ffi/runtime/phases.h).
            assert count[(p + k, "all-gather", s)] == 0
    pushed = sum(s.bytes for s in spans if s.name == "push piece")
    assert pushed == p * sum(pc.nbytes for pc in plan.pieces)
    trace = timeline.to_chrome(str(tmp_path / "trace.json"))
    loaded = json.loads((tmp_path / "trace.json").read_text())
    assert loaded == json.loads(json.dumps(trace))
    assert sum(e["ph"] == "X" for e in loaded["traceEvents"]) == len(spans)
    timeline.plot(str(tmp_path / "timeline.png"))
    assert (tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"


def test_update_steps_trace_the_optimizer():
    p = 2
    timeline, _ = _one_traced_step(p, update=True)
    _assert_nested(timeline.spans)
    names = Counter(s.name for s in timeline.spans)
    assert names["optimizer"] >= p and names["optimizer setup"] == p


def test_untraced_steps_record_nothing():
    mesh = coarse.make_mesh(workers=2)

    @coarse.sync(mesh)
    def step(x):
        return coarse.all_reduce(x)

    step.timeline()
    jax.block_until_ready(step(np.ones((4, 3), np.float32)))
    assert step.timeline().spans == ()
