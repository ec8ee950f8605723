"""coarse_jax.perf_model: hand-computed cases and properties of the analytic models.

Bandwidths of ``B`` GB/s are written as ``B * GB`` with ``GB = 1e-9`` so that
``1 * GB`` is 1 byte/s and the expected times are small exact numbers.
"""

import math
from itertools import pairwise

import numpy as np
import pytest

from coarse_jax.perf_model import (
    Layer,
    best_split,
    coarse_sync_s,
    dag_iteration_s,
    dag_iterations_s,
    dense_sync_s,
    leading_bytes_for,
    ring_allreduce_s,
    t_sync_gpu,
    t_sync_proxy,
    t_train,
)

GB = 1e-9  # 1 * GB == 1 byte/s
approx = pytest.approx


# --------------------------------------------------------------------------- #
# Paper model                                                                  #
# --------------------------------------------------------------------------- #


def test_ring_allreduce_hand_values():
    assert ring_allreduce_s(1e9, 4, 1.0) == approx(1.5)  # 2*3/4 * 1 s
    assert ring_allreduce_s(2e9, 2, 2.0) == approx(1.0)
    assert ring_allreduce_s(1e9, 4, 1.0, latency_us=10.0) == approx(1.5 + 6 * 10e-6)
    assert ring_allreduce_s(1e9, 1, 1.0, latency_us=10.0) == 0.0
    assert ring_allreduce_s(0, 4, 1.0) == 0.0
    assert ring_allreduce_s(1e9, 4, math.inf) == 0.0


def test_ring_allreduce_monotone_in_bandwidth_and_size():
    times = [ring_allreduce_s(1e8, 8, bw) for bw in (1, 2, 5, 10, 100)]
    assert all(a > b for a, b in pairwise(times))
    sizes = [ring_allreduce_s(n, 8, 10.0) for n in (1e3, 1e6, 1e9)]
    assert all(a < b for a, b in pairwise(sizes))


def test_sync_terms_match_paper():
    # p=2: 2(p-1)/p = 1.
    assert t_sync_proxy(6, 2, 1 * GB) == approx(6.0)
    assert t_sync_gpu(6, 2, 2 * GB) == approx(3.0)
    assert t_sync_proxy(8, 4, 1 * GB) == approx(12.0)  # 1.5 * 8
    assert leading_bytes_for(5, 12) == 7
    assert leading_bytes_for(0, 12) == 12
    with pytest.raises(ValueError):
        leading_bytes_for(13, 12)


# n=12 bytes, p=2, proxies 1 B/s, GPUs 2 B/s, T_FP=1, T_BP=2.
CASE = {"n": 12, "p": 2, "bw_proxy_gbps": 1 * GB, "bw_gpu_gbps": 2 * GB, "t_fp": 1.0, "t_bp": 2.0}


def _t(m, **over):
    kw = {**CASE, **over}
    return t_train(
        m, kw["n"], kw["p"], kw["bw_proxy_gbps"], kw["bw_gpu_gbps"], kw["t_fp"], kw["t_bp"]
    )


def test_t_train_hand_values():
    assert _t(0) == approx(9.0)  # max(1+2+12/2, 1+0)
    assert _t(3) == approx(7.5)  # max(3+9/2, 1+3)
    assert _t(5) == approx(6.5)  # max(3+7/2, 1+5)
    assert _t(6) == approx(7.0)  # max(3+3, 1+6)
    assert _t(12) == approx(13.0)  # max(3, 1+12)


def test_best_split_continuous_hand_value():
    # Crossing: m* = (2 + 12/2) / (1 + 1/2) = 16/3; floor 5 -> 6.5, ceil 6 -> 7.
    assert best_split(**CASE) == (5, approx(6.5))


def test_best_split_continuous_is_global_integer_optimum():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(1, 200))
        p = int(rng.integers(2, 9))
        kw = {
            "n": n,
            "p": p,
            "bw_proxy_gbps": float(rng.uniform(0.5, 4)) * GB,
            "bw_gpu_gbps": float(rng.uniform(0.5, 4)) * GB,
            "t_fp": float(rng.uniform(0, 50)),
            "t_bp": float(rng.uniform(0, 50)),
        }
        m, t = best_split(**kw)
        brute = min(_t(k, **kw) for k in range(n + 1))
        assert 0 <= m <= n
        assert t == approx(brute, rel=1e-12)
        assert t == approx(_t(m, **kw), rel=1e-15)


def test_best_split_large_sizes():
    # Realistic scale: 4 GB of gradients, continuous crossing at 8e9/3 bytes.
    m, t = best_split(4_000_000_000, 2, 1.0, 2.0, 1.0, 2.0)
    assert m in (2_666_666_666, 2_666_666_667)
    assert t == approx(11 / 3, rel=1e-9)


def test_best_split_extremes():
    # Free proxies: everything goes through them, T = T_FP + T_BP.
    assert best_split(**{**CASE, "bw_proxy_gbps": math.inf}) == (12, approx(3.0))
    # Nearly useless proxies and no backward to hide behind: everything on GPUs.
    slow = {**CASE, "bw_proxy_gbps": 1e-30, "t_bp": 0.0}
    assert best_split(**slow) == (0, approx(1.0 + 6.0))
    assert best_split(**slow, candidates=[4, 8]) == (0, approx(7.0))
    # One worker: nothing to sync, m independent; ties go to the proxies.
    assert best_split(**{**CASE, "p": 1}) == (12, approx(3.0))
    assert best_split(**{**CASE, "bw_proxy_gbps": math.inf, "bw_gpu_gbps": math.inf}) == (
        12,
        approx(3.0),
    )


def test_best_split_ties_prefer_more_proxy_bytes():
    # Free GPU ring: T = max(3, 1 + m) is flat at 3 for m <= 2; the largest is chosen.
    free_gpu = {**CASE, "bw_gpu_gbps": math.inf}
    assert best_split(**free_gpu) == (2, approx(3.0))
    assert best_split(**free_gpu, candidates=[1, 2, 3]) == (2, approx(3.0))


def test_best_split_candidates_restrict_choice():
    # Pool {0, 3, 9, 12}: times 9, 7.5, 10, 13 -> the continuous optimum 5 is not allowed.
    assert best_split(**CASE, candidates=[3, 9]) == (3, approx(7.5))
    # 0 and n are always considered.
    assert best_split(**CASE, candidates=[]) == (0, approx(9.0))
    assert best_split(**CASE, candidates=[5, 6]) == (5, approx(6.5))
    with pytest.raises(ValueError):
        best_split(**CASE, candidates=[13])


def test_best_split_monotone_in_bandwidth():
    ts = [best_split(**{**CASE, "bw_proxy_gbps": b * GB})[1] for b in (0.5, 1, 2, 4, 8)]
    assert all(a >= b for a, b in pairwise(ts))
    assert ts[0] > ts[-1]
    ts = [best_split(**{**CASE, "bw_gpu_gbps": b * GB})[1] for b in (0.5, 1, 2, 4, 8)]
    assert all(a >= b for a, b in pairwise(ts))
    assert ts[0] > ts[-1]
    # More proxy bandwidth -> more bytes offloaded.
    ms = [best_split(**{**CASE, "bw_proxy_gbps": b * GB})[0] for b in (0.5, 1, 2, 4, 8)]
    assert ms == sorted(ms)


def test_coarse_sync_hand_values():
    one = 1 * GB
    # n=4, shard=1: k=4 shards of 1 byte, every stage 1 s.
    assert coarse_sync_s(4, 2, one, one, one, 1) == approx(3 + 3 * 1)
    # Shared direction: the link stage is push+pull = 2 s.
    assert coarse_sync_s(4, 2, one, one, one, 1, bidirectional=False) == approx(3 + 3 * 2)
    # 1 s per-hop latency: push = pull = 2, ring = 1 + 2 = 3.
    assert coarse_sync_s(4, 2, one, one, one, 1, latency_us=1e6) == approx(7 + 3 * 3)
    assert coarse_sync_s(4, 2, one, one, one, 1, latency_us=1e6, bidirectional=False) == approx(
        7 + 3 * 4
    )
    # n=5, shard=2: k=3 equal shards of 5/3 bytes.
    assert coarse_sync_s(5, 2, one, one, one, 2) == approx(5 + 2 * 5 / 3)
    # One shard: no pipelining, plain sum of the stages (p=4 ring: 1.5 * 8).
    assert coarse_sync_s(8, 4, one, 2 * one, one, 100) == approx(8 + 12 + 4)
    assert coarse_sync_s(0, 4, one, one, one, 1) == 0.0
    assert coarse_sync_s(4, 1, one, one, one, 1) == 0.0


def test_coarse_sync_properties():
    base = {
        "n": 1e8,
        "p": 4,
        "push_gbps": 10.0,
        "pull_gbps": 10.0,
        "bw_proxy_gbps": 10.0,
        "shard_bytes": 1e6,
    }
    t0 = coarse_sync_s(**base)
    assert coarse_sync_s(**base, bidirectional=False) > t0
    for key in ("push_gbps", "pull_gbps", "bw_proxy_gbps"):
        assert coarse_sync_s(**{**base, key: 20.0}) <= t0
    assert coarse_sync_s(**{**base, "push_gbps": 20.0, "pull_gbps": 20.0}) < t0
    # Pipelining beats one big shard.
    assert t0 < coarse_sync_s(**{**base, "shard_bytes": 1e8})
    with pytest.raises(ValueError):
        coarse_sync_s(**{**base, "shard_bytes": 0})


def test_dense_sync_hand_values():
    one = 1 * GB
    assert dense_sync_s(4, 2, one, duplex=False) == approx(16.0)  # 2 * p * n
    assert dense_sync_s(4, 2, one) == approx(16.0)  # no shards, no overlap
    assert dense_sync_s(4, 2, one, shard_bytes=1) == approx(8 + 2)  # p*n + p*s
    assert dense_sync_s(4, 2, one, latency_us=1e6, shard_bytes=1) == approx(12.0)
    assert dense_sync_s(4, 2, one, duplex=False, shard_bytes=1) == approx(16.0)
    assert dense_sync_s(4, 1, one) == 0.0
    assert dense_sync_s(0, 2, one) == 0.0


def test_dense_sync_monotone_and_worse_than_coarse():
    ts = [dense_sync_s(1e8, 8, bw, shard_bytes=1e6) for bw in (1, 2, 4, 8)]
    assert all(a > b for a, b in pairwise(ts))
    # The central port carries p*n; p proxies in a ring carry ~2n each.
    assert coarse_sync_s(1e8, 8, 10.0, 10.0, 10.0, 1e6) < dense_sync_s(
        1e8, 8, 10.0, shard_bytes=1e6
    )


@pytest.mark.parametrize(
    "fn,args",
    [
        (ring_allreduce_s, (1.0, 0, 1.0)),
        (ring_allreduce_s, (-1.0, 2, 1.0)),
        (ring_allreduce_s, (1.0, 2, 0.0)),
        (ring_allreduce_s, (1.0, 2, 1.0, -1.0)),
        (t_train, (1, 2, 2, 1.0, 1.0, -1.0, 0.0)),
        (best_split, (10, 2, 0.0, 1.0, 1.0, 1.0)),
        (dense_sync_s, (1.0, 2, float("nan"))),
    ],
)
def test_invalid_arguments(fn, args):
    with pytest.raises(ValueError):
        fn(*args)


# --------------------------------------------------------------------------- #
# DAG model                                                                    #
# --------------------------------------------------------------------------- #

LAYERS = [
    Layer("l0", fwd_s=1.0, bwd_s=2.0, grad_bytes=10),
    Layer("l1", fwd_s=1.0, bwd_s=1.0, grad_bytes=20),
    Layer("l2", fwd_s=2.0, bwd_s=1.0, grad_bytes=30),
]


def comm(nbytes: int) -> float:
    return 0.1 * nbytes


def test_dag_single_iteration_hand_values():
    # Forward ends at 4; backward ready times l2=5, l1=6, l0=8.
    # Channel: l2 5->8, l1 8->10, l0 10->11.
    assert dag_iteration_s(LAYERS, comm) == approx(11.0)
    # No overlap: 8->11->13->14.
    assert dag_iteration_s(LAYERS, comm, overlap=False) == approx(14.0)
    # Dual sync, l0 on its own channel: proxy l2 5->8, l1 8->10; worker l0 8->9.
    assert dag_iteration_s(LAYERS, comm, worker_layers=1, worker_comm_s=comm) == approx(10.0)


def test_dag_zero_comm_is_compute_only():
    total = sum(layer.fwd_s + layer.bwd_s for layer in LAYERS)
    assert dag_iteration_s(LAYERS, lambda b: 0.0) == approx(total)
    assert dag_iteration_s(LAYERS, lambda b: 0.0, overlap=False) == approx(total)
    assert dag_iterations_s(LAYERS, lambda b: 0.0, 5) == approx(5 * total)
    assert dag_iteration_s([], comm) == 0.0


def test_dag_parameter_free_layers_need_no_communication():
    layers = [Layer("pool", 1.0, 1.0, 0), Layer("fc", 1.0, 1.0, 4)]
    # Only fc communicates: ready at 3, 3->8; pool's backward ends at 4.
    assert dag_iteration_s(layers, lambda b: 5.0) == approx(8.0)


def test_dag_multi_step_hand_values():
    # Iteration 2 forward: l0 waits for its sync (11): 12, l1 13, l2 15;
    # backward l2 16, l1 17, l0 19; channel l2 16->19, l1 19->21, l0 21->22.
    assert dag_iterations_s(LAYERS, comm, 2) == approx(22.0)
    # No overlap: each iteration ends with all syncs; 2 * 14.
    assert dag_iterations_s(LAYERS, comm, 2, overlap=False) == approx(28.0)
    assert dag_iterations_s(LAYERS, comm, 1) == dag_iteration_s(LAYERS, comm)


def test_leading_layer_prioritization_reduces_multi_step_time():
    # l0 on the worker channel: iteration 1 syncs l0 by 9 (not 11), so iteration 2
    # forwards 10, 11, 13; backward 14, 15, 17; proxy l2 14->17, l1 17->19; worker l0 17->18.
    dual = dag_iterations_s(LAYERS, comm, 2, worker_layers=1, worker_comm_s=comm)
    assert dual == approx(19.0)
    assert dual < dag_iterations_s(LAYERS, comm, 2)
    # The saving compounds: the gap grows with the number of steps.
    gaps = [
        dag_iterations_s(LAYERS, comm, s)
        - dag_iterations_s(LAYERS, comm, s, worker_layers=1, worker_comm_s=comm)
        for s in (1, 2, 4, 8)
    ]
    assert all(a < b for a, b in pairwise(gaps))


def test_leading_layer_sync_should_not_queue_behind_big_gradients():
    # The head's big gradient (5.5 s of sync) starts at 4 and runs past the end
    # of the backward pass (9), so layer 0's tiny sync queues behind it (9.6->9.7)
    # and the next forward waits. A worker channel five times *slower* per byte
    # still syncs layer 0 by 9.5, because it does not queue.
    layers = [
        Layer("emb", fwd_s=1.0, bwd_s=1.0, grad_bytes=1),
        Layer("mid", fwd_s=1.0, bwd_s=4.0, grad_bytes=1),
        Layer("head", fwd_s=1.0, bwd_s=1.0, grad_bytes=55),
    ]

    def proxy(b):
        return 0.1 * b

    def worker(b):
        return 0.5 * b

    assert dag_iteration_s(layers, proxy) == approx(9.7)
    assert dag_iteration_s(layers, proxy, worker_layers=1, worker_comm_s=worker) == approx(9.6)
    for steps in (2, 3, 5):
        single = dag_iterations_s(layers, proxy, steps)
        dual = dag_iterations_s(layers, proxy, steps, worker_layers=1, worker_comm_s=worker)
        assert dual < single


def test_dag_overlap_never_slower_and_monotone_in_comm():
    rng = np.random.default_rng(1)
    for _ in range(30):
        layers = [
            Layer(
                f"l{i}",
                float(rng.uniform(0, 2)),
                float(rng.uniform(0, 2)),
                int(rng.integers(0, 100)),
            )
            for i in range(int(rng.integers(1, 12)))
        ]
        rate = float(rng.uniform(0.001, 0.1))

        def fast(b, r=rate):
            return r * b

        def slow(b, r=rate):
            return 2 * r * b

        for steps in (1, 3):
            assert (
                dag_iterations_s(layers, fast, steps)
                <= dag_iterations_s(layers, fast, steps, overlap=False) + 1e-12
            )
            assert (
                dag_iterations_s(layers, fast, steps)
                <= dag_iterations_s(layers, slow, steps) + 1e-12
            )
        compute = sum(layer.fwd_s + layer.bwd_s for layer in layers)
        assert dag_iteration_s(layers, fast) >= compute - 1e-12


def test_dag_invalid_arguments():
    with pytest.raises(ValueError):
        dag_iterations_s(LAYERS, comm, 0)
    with pytest.raises(ValueError):
        dag_iteration_s(LAYERS, comm, worker_layers=4, worker_comm_s=comm)
    with pytest.raises(ValueError):
        dag_iteration_s(LAYERS, comm, worker_layers=1)
    with pytest.raises(ValueError):
        Layer("bad", -1.0, 0.0, 0)
    with pytest.raises(ValueError):
        dag_iteration_s(LAYERS, lambda b: -1.0)
