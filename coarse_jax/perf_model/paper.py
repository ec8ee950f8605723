"""The COARSE paper's dual-synchronization model (Section III-F) and its baselines.

``n`` gradient bytes per iteration, ``m`` of them reduced by a ring among the
proxies, the remaining ``n - m`` (the leading layers, needed first by the next
forward pass) by a ring among the worker GPUs. `best_split` picks the ``m``
that minimizes the estimated iteration time. `coarse_sync_s` and
`dense_sync_s` compare the pipelined push -> proxy ring -> pull path with a
centralized parameter server (the DENSE baseline of Section V).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from coarse_jax.perf_model._checks import (
    TIE_RTOL,
    check_bw,
    check_nonneg,
    check_p,
    ring_factor,
    xfer_s,
)


def ring_allreduce_s(nbytes: float, p: int, gbps: float, latency_us: float = 0.0) -> float:
    """Time of a bandwidth-optimal ring all-reduce.

    Reduce-scatter then all-gather, ``2(p-1)`` steps; in each step every member
    sends ``nbytes / p`` to its neighbour, all links busy at once:

        T = 2(p-1)/p * nbytes / (gbps * 1e9) + 2(p-1) * latency_us * 1e-6

    Args:
      nbytes: Size of the buffer being reduced, in bytes.
      p: Ring members.
      gbps: Per-link, per-direction bandwidth in GB/s.
      latency_us: Per-step (per-hop) latency in microseconds.

    Returns:
      Seconds; 0 for ``p == 1`` (nothing to exchange).

    Raises:
      ValueError: On ``p < 1``, negative sizes or latency, non-positive bandwidth.

    Example:
      >>> round(coarse.perf_model.ring_allreduce_s(100e6, 4, 10.0) * 1e3, 3)  # 100 MB, 10 GB/s, ms
      15.0
    """
    check_p(p)
    check_nonneg(nbytes, "nbytes")
    check_bw(gbps, "gbps")
    check_nonneg(latency_us, "latency_us")
    if p == 1:
        return 0.0
    return ring_factor(p) * xfer_s(nbytes, gbps) + 2 * (p - 1) * latency_us * 1e-6


def t_sync_proxy(m: float, p: int, bw_proxy_gbps: float) -> float:
    """Paper's ``T_sync(proxy) = 2(p-1)/p * m / BW_proxy``: ring of ``p`` proxies over ``m`` bytes.

    Args:
      m: Bytes synchronized by the proxies.
      p: Number of proxies in the ring (the workers at the paper's COARSE 1:1;
        fewer at COARSE k:1, ``make_mesh(proxies=q)``).
      bw_proxy_gbps: Proxy-to-proxy bandwidth in GB/s.

    Returns:
      Seconds.

    Example:
      >>> round(coarse.perf_model.t_sync_proxy(100e6, 4, 24.0) * 1e3, 3)     # ms
      6.25
    """
    return ring_allreduce_s(m, p, bw_proxy_gbps)


def t_sync_gpu(n_minus_m: float, p: int, bw_gpu_gbps: float) -> float:
    """Paper's ``T_sync(GPU) = 2(p-1)/p * (n-m) / BW_GPU``: worker ring over the leading layers.

    Args:
      n_minus_m: Bytes synchronized by the worker GPUs.
      p: Number of workers.
      bw_gpu_gbps: Worker-to-worker bandwidth in GB/s.

    Returns:
      Seconds.

    Example:
      >>> round(coarse.perf_model.t_sync_gpu(10e6, 4, 9.0) * 1e3, 3)          # ms
      1.667
    """
    return ring_allreduce_s(n_minus_m, p, bw_gpu_gbps)


def leading_bytes_for(m: float, n: float) -> float:
    """Bytes left to the worker ring when ``m`` of ``n`` go through the proxies.

    The paper's ``m`` counts bytes in backward (gradient-ready) order, i.e. the
    *trailing* layers of the model; what remains, ``n - m``, is the leading
    layers' gradients, which the next forward pass needs first.

    Args:
      m: Bytes synchronized by the proxies, ``0 <= m <= n``.
      n: Total gradient bytes per iteration.

    Returns:
      ``n - m``.

    Raises:
      ValueError: If ``m`` is outside ``[0, n]``.

    Example:
      >>> coarse.perf_model.leading_bytes_for(90.0, 100.0)
      10.0
    """
    check_nonneg(n, "n")
    if not 0 <= m <= n:
        raise ValueError(f"m must be in [0, n={n}], got {m!r}.")
    return n - m


def t_train(
    m: float,
    n: float,
    p: int,
    bw_proxy_gbps: float,
    bw_gpu_gbps: float,
    t_fp: float,
    t_bp: float,
) -> float:
    """Paper's iteration-time estimate for a dual-synchronization split.

        T_train = max(T_FP + T_BP + T_sync(GPU), T_FP + T_sync(proxy))

    The worker ring runs after the backward pass (it uses the GPUs and needs the
    leading layers, which finish last); the proxy ring overlaps the backward
    pass, so only the forward pass precedes it.

    Args:
      m: Bytes synchronized by the proxies, ``0 <= m <= n``.
      n: Total gradient bytes per iteration.
      p: Workers (= proxies).
      bw_proxy_gbps: Proxy-to-proxy bandwidth in GB/s.
      bw_gpu_gbps: Worker-to-worker bandwidth in GB/s.
      t_fp: Forward pass seconds.
      t_bp: Backward pass seconds.

    Returns:
      Seconds per iteration.

    Raises:
      ValueError: On out-of-range arguments.

    Example:
      >>> # 100 MB of gradients, 4 workers, 90 MB through the proxies:
      >>> round(coarse.perf_model.t_train(90e6, 100e6, 4, 24.0, 9.0, t_fp=0.03, t_bp=0.06), 4)
      0.0917
    """
    check_nonneg(t_fp, "t_fp")
    check_nonneg(t_bp, "t_bp")
    rest = leading_bytes_for(m, n)
    return max(
        t_fp + t_bp + t_sync_gpu(rest, p, bw_gpu_gbps),
        t_fp + t_sync_proxy(m, p, bw_proxy_gbps),
    )


def best_split(
    n: int,
    p: int,
    bw_proxy_gbps: float,
    bw_gpu_gbps: float,
    t_fp: float,
    t_bp: float,
    candidates: Sequence[int] | None = None,
) -> tuple[int, float]:
    """The ``m`` (bytes through the proxies) that minimizes ``t_train``.

    With ``c = 2(p-1)/p``, the GPU branch of ``t_train`` falls with ``m`` and
    the proxy branch rises, so the continuous optimum is where they cross:

        T_BP + c (n - m) / BW_GPU = c m / BW_proxy
        =>  m* = (T_BP + c n / BW_GPU) / (c (1/BW_proxy + 1/BW_GPU))

    clipped to ``[0, n]``. Left of ``m*`` the GPU branch dominates (flat when
    ``BW_GPU`` is infinite), right of it the proxy branch strictly grows, so
    ``m*`` is the *largest* minimizer. Ties are always broken toward the
    largest ``m``: offloading more to the proxies frees the worker GPUs, which
    is the point of COARSE, at no modeled cost. For the same reason a
    degenerate model (``p == 1``, or both bandwidths infinite, where
    ``t_train`` does not depend on ``m``) returns ``m = n``.

    Args:
      n: Total gradient bytes per iteration.
      p: Workers (= proxies).
      bw_proxy_gbps: Proxy-to-proxy bandwidth in GB/s.
      bw_gpu_gbps: Worker-to-worker bandwidth in GB/s.
      t_fp: Forward pass seconds.
      t_bp: Backward pass seconds.
      candidates: Realizable values of ``m``, e.g. cumulative gradient bytes
        at layer boundaries in backward order. ``0`` and ``n`` (all on the
        workers, all on the proxies) are always considered too. ``None`` means
        any integer ``m``: the continuous optimum, rounded to the better of its
        floor and ceiling.

    Returns:
      ``(m, t_train(m, ...))``.

    Raises:
      ValueError: On out-of-range arguments or a candidate outside ``[0, n]``.

    Example:
      >>> m, t = coarse.perf_model.best_split(100_000_000, 4, 24.0, 9.0, t_fp=0.001, t_bp=0.002)
      >>> m, round(t * 1e3, 3)
      (81454546, 6.091)
    """
    check_p(p)
    check_nonneg(n, "n")
    check_bw(bw_proxy_gbps, "bw_proxy_gbps")
    check_bw(bw_gpu_gbps, "bw_gpu_gbps")
    n = int(n)

    if candidates is not None:
        pool = {0, n}
        for c in candidates:
            if not 0 <= c <= n:
                raise ValueError(f"best_split: candidate {c!r} is outside [0, n={n}].")
            pool.add(int(c))
    else:
        ring = ring_factor(p)
        inv_p = 1.0 / (bw_proxy_gbps * 1e9)
        inv_g = 1.0 / (bw_gpu_gbps * 1e9)
        if ring == 0.0 or inv_p + inv_g == 0.0:
            pool = {n}  # t_train is independent of m
        else:
            m_star = (t_bp + ring * n * inv_g) / (ring * (inv_p + inv_g))
            m_star = min(max(m_star, 0.0), float(n))
            pool = {math.floor(m_star), math.ceil(m_star)}

    def cost(m: int) -> float:
        return t_train(m, n, p, bw_proxy_gbps, bw_gpu_gbps, t_fp, t_bp)

    times = {m: cost(m) for m in pool}
    best_t = min(times.values())
    m = max(m for m, t in times.items() if t <= best_t * (1 + TIE_RTOL))
    return m, times[m]


def coarse_sync_s(
    n: float,
    p: int,
    push_gbps: float,
    pull_gbps: float,
    bw_proxy_gbps: float,
    shard_bytes: float,
    latency_us: float = 0.0,
    bidirectional: bool = True,
) -> float:
    """Time to synchronize ``n`` bytes through the proxies, pipelined by shard.

    The ``n`` bytes are cut into ``k = ceil(n / shard_bytes)`` equal shards of
    ``s = n / k`` bytes (equal so that the total is exact and every pipeline
    stage is uniform). Each shard goes through three stages: every worker
    pushes it to its proxy, the proxies ring-all-reduce it, every worker pulls
    the result back. ``latency_us`` is charged per hop (each push, each pull,
    each of the ``2(p-1)`` ring steps)::

        push = lat + s / push_bw
        ring = ring_allreduce_s(s, p, bw_proxy, lat)
        pull = lat + s / pull_bw

    A pipeline of uniform stages finishes one shard per bottleneck stage after
    the first shard has crossed all of them::

        bidirectional=True  (push and pull on opposite link directions, overlap):
            T = push + ring + pull + (k-1) * max(push, ring, pull)
        bidirectional=False (push and pull share one direction, so the link is
        one stage of push + pull):
            T = push + ring + pull + (k-1) * max(push + pull, ring)

    Args:
      n: Bytes to synchronize.
      p: Workers (= proxies).
      push_gbps: Worker -> proxy bandwidth in GB/s.
      pull_gbps: Proxy -> worker bandwidth in GB/s.
      bw_proxy_gbps: Proxy <-> proxy bandwidth in GB/s.
      shard_bytes: Largest shard in bytes (> 0).
      latency_us: Per-hop latency in microseconds.
      bidirectional: Whether push and pull use opposite directions of the
        worker<->proxy link (full duplex).

    Returns:
      Seconds; 0 when ``n == 0`` or ``p == 1`` (nothing to synchronize).

    Raises:
      ValueError: On out-of-range arguments.

    Example:
      >>> round(coarse.perf_model.coarse_sync_s(100e6, 4, push_gbps=16.0, pull_gbps=16.0,
      ...                                  bw_proxy_gbps=24.0, shard_bytes=4 << 20) * 1e3, 3)
      6.771
    """
    check_p(p)
    check_nonneg(n, "n")
    check_bw(push_gbps, "push_gbps")
    check_bw(pull_gbps, "pull_gbps")
    check_bw(bw_proxy_gbps, "bw_proxy_gbps")
    check_nonneg(latency_us, "latency_us")
    if not shard_bytes > 0:
        raise ValueError(f"shard_bytes must be > 0, got {shard_bytes!r}.")
    if n == 0 or p == 1:
        return 0.0
    k = math.ceil(n / shard_bytes)
    s = n / k
    lat = latency_us * 1e-6
    push = lat + xfer_s(s, push_gbps)
    pull = lat + xfer_s(s, pull_gbps)
    ring = ring_allreduce_s(s, p, bw_proxy_gbps, latency_us)
    bottleneck = max(push, ring, pull) if bidirectional else max(push + pull, ring)
    return push + ring + pull + (k - 1) * bottleneck


def dense_sync_s(
    n: float,
    p: int,
    gbps: float,
    latency_us: float = 0.0,
    *,
    duplex: bool = True,
    shard_bytes: float | None = None,
) -> float:
    """Time to synchronize ``n`` bytes through one centralized parameter server.

    The DENSE baseline: all ``p`` workers push ``n`` bytes to one proxy and
    pull ``n`` bytes back, and that proxy's single port serializes the traffic
    (``p * n / bw`` in, ``p * n / bw`` out). The reduction itself is assumed
    free; the port is the bottleneck::

        duplex=False (half-duplex port, pulls wait for every push):
            T = 2 * p * n / bw + 2 * lat
        duplex=True (full-duplex port, pipelined over shards of ``s = n / k``,
        ``k = ceil(n / shard_bytes)``): the pull of shard ``i`` starts once all
        ``p`` pushes of shard ``i`` are in; in and out run at the same rate, so
        the out-stream trails the in-stream by one shard:
            T = p * n / bw + p * s / bw + 2 * lat

    With ``shard_bytes=None`` there is one shard and the duplex formula equals
    the half-duplex one: nothing can overlap without sharding.

    Args:
      n: Bytes to synchronize.
      p: Workers.
      gbps: Bandwidth of the server's port in GB/s (per direction).
      latency_us: One-hop latency in microseconds (charged once for the push
        and once for the pull).
      duplex: Whether the port sends and receives at once.
      shard_bytes: Pipelining granularity for ``duplex=True``; ``None`` for
        no sharding. Ignored when ``duplex=False``.

    Returns:
      Seconds; 0 when ``n == 0`` or ``p == 1`` (nothing to synchronize).

    Raises:
      ValueError: On out-of-range arguments.

    Example:
      >>> round(coarse.perf_model.dense_sync_s(100e6, 4, 16.0, shard_bytes=4 << 20) * 1e3, 3)
      26.042
    """
    check_p(p)
    check_nonneg(n, "n")
    check_bw(gbps, "gbps")
    check_nonneg(latency_us, "latency_us")
    if shard_bytes is not None and not shard_bytes > 0:
        raise ValueError(f"shard_bytes must be > 0 or None, got {shard_bytes!r}.")
    if n == 0 or p == 1:
        return 0.0
    lat2 = 2 * latency_us * 1e-6
    stream = xfer_s(p * n, gbps)
    if not duplex:
        return 2 * stream + lat2
    k = 1 if shard_bytes is None else math.ceil(n / shard_bytes)
    return stream + xfer_s(p * n / k, gbps) + lat2
