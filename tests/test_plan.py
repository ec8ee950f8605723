"""The planner alone: shards, batches, routes, the dual-sync split."""

import sys

import jax
import numpy as np
import pytest

import coarse_jax as coarse


def _tree(shapes, dtype=np.float32):
    return {f"t{i:05d}": jax.ShapeDtypeStruct(s, dtype) for i, s in enumerate(shapes)}


def test_pieces_cover_every_element_once():
    tree = _tree([(10,), (3000,), (1,), (), (257, 3), (5,)])
    plan = coarse.diagnostics.plan(tree, 4, coarse.Config(shard_bytes=1024, leading_bytes=40))
    covered = {i: np.zeros(leaf.size, int) for i, leaf in enumerate(plan.leaves)}
    for pc in plan.pieces:
        assert sum(n for _, _, n, _ in pc.segments) == pc.nelems
        for sid, off, n, _ in pc.segments:
            covered[plan.sync_order[sid]][off : off + n] += 1
    for t in plan.leading_leaves:
        covered[t] += 1
    assert all((c == 1).all() for c in covered.values())


def _pushes(plan):
    return [(plan.bucket_leaves(b), b.num_pieces) for b in plan.buckets]


def test_pushes_follow_push_bytes_pieces_follow_shard_bytes():
    # Eight 256 KiB weights and two small leaves: the default push_bytes
    # (4 MiB) pushes them in one bucket at every piece size, cut into pieces
    # of shard_bytes; the pieces are what shard_bytes alone would give.
    tree = _tree([(64, 1024)] * 8 + [(10,), (7,)])
    for shard in (16 << 10, 64 << 10, 4 << 20):
        plan = coarse.diagnostics.plan(tree, 2, coarse.Config(shard_bytes=shard))
        assert len(plan.buckets) == 1, (shard, _pushes(plan))
        b = plan.buckets[0]
        assert (b.first_piece, b.num_pieces, b.num_leaves) == (0, len(plan.pieces), 10)
        assert all(pc.nbytes <= shard for pc in plan.pieces)
        # Every leaf above shard_bytes in equal shards, the two small ones
        # batched into one piece: pieces never span a shard and a batch.
        big = 8 * -(-(256 << 10) // shard) if shard < (256 << 10) else 0
        assert len(plan.pieces) == (big + 1 if big else 1), (shard, len(plan.pieces))
    # push_bytes at most shard_bytes: the plan before push_bytes, a push per
    # leaf above shard_bytes and per batch; the pieces unchanged.
    for push in (0, 16 << 10):
        old = coarse.diagnostics.plan(tree, 2, coarse.Config(shard_bytes=16 << 10, push_bytes=push))
        assert [n for _, n in _pushes(old)] == [1] + [16] * 8  # the batch comes first
        new = coarse.diagnostics.plan(tree, 2, coarse.Config(shard_bytes=16 << 10))
        assert old.pieces == new.pieces
    # In between: consecutive leaves up to push_bytes, a larger leaf alone.
    mid = coarse.diagnostics.plan(
        tree, 2, coarse.Config(shard_bytes=16 << 10, push_bytes=600 << 10)
    )
    # (backward order: the two small leaves, then w7 and w6 fill 512 KiB + 68 B)
    assert [len(ids) for ids, _ in _pushes(mid)] == [4, 2, 2, 2]


def test_backward_order_and_leading_prefix():
    tree = _tree([(4,), (4,), (4,), (4,)])  # 16 bytes each
    plan = coarse.diagnostics.plan(tree, 2, coarse.Config(leading_bytes=32))
    assert plan.leading_leaves == (1, 0)  # the first layers
    assert plan.proxy_leaves == (3, 2)  # last layer first: backward order


def test_routes_by_threshold():
    tree = _tree([(10,), (10_000,)])
    cfg = coarse.Config(shard_bytes=1000, latency_threshold_bytes=1000, routes=((0, 1), (1, 0)))
    plan = coarse.diagnostics.plan(tree, 2, cfg)
    assert len(plan.pieces) == 1 + 40
    for pc in plan.pieces:
        assert pc.dest == ((0, 1) if pc.nbytes < 1000 else (1, 0))


def _lines_run(fn):
    """Python lines executed by ``fn()``: a count of work that no host noise changes."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


def test_plan_is_linear_in_leaves():
    def build(n):
        plan = coarse.diagnostics.plan(_tree([(3,)] * n), 4, coarse.Config(shard_bytes=4096))
        plan.ffi_attrs()
        return plan

    small, large = _lines_run(lambda: build(1000)), _lines_run(lambda: build(4000))
    # Linear: 4x the leaves, 4x the work (plus a constant); quadratic would be 16x.
    assert large < 4.4 * small, (small, large)
    assert "20000 leaves" in build(20_000).summary()


def test_summary_is_readable():
    tree = _tree([(64, 64), (64,), (10, 10)])
    text = coarse.diagnostics.plan(
        tree, 4, coarse.Config(shard_bytes=4096, leading_bytes=400)
    ).summary()
    assert "worker ring" in text and "shards" in text and "routes" in text


@pytest.mark.parametrize("dtype", [np.int32, np.bool_, np.float64])
def test_rejects_unsupported_dtypes(dtype):
    with pytest.raises(TypeError, match=r"\['bad'\].*float32, bfloat16 and float16"):
        coarse.diagnostics.plan({"bad": jax.ShapeDtypeStruct((3,), dtype)}, 2)


def test_config_errors():
    with pytest.raises(ValueError, match=r"leading_bytes.*auto"):
        coarse.Config(leading_bytes="auto")
    with pytest.raises(ValueError, match="mode"):
        coarse.Config(mode="fast")
    with pytest.raises(ValueError, match=r"Config.push_bytes: expected a non-negative int"):
        coarse.Config(push_bytes=-1)
    with pytest.raises(ValueError, match=r"routes\[1\]"):
        coarse.Config(routes=((0, 0), (0, 5))).routes_for(2)
    with pytest.raises(ValueError, match="expected 4"):
        coarse.Config(routes=((0, 0),)).routes_for(4)
