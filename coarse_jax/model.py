"""Analytic performance models for COARSE gradient synchronization.

Two models live here, both pure Python (no JAX), so the planner and the
benchmarks can reason about a configuration without running it:

1. The COARSE paper's dual-synchronization estimate (Section III-F): ``n``
   gradient bytes per iteration, ``m`` of them reduced by a ring among the
   proxies, the remaining ``n - m`` (the leading layers, needed first by the
   next forward pass) by a ring among the worker GPUs. ``best_split`` picks the
   ``m`` that minimizes the estimated iteration time. ``coarse_sync_s`` and
   ``dense_sync_s`` compare the pipelined push -> proxy ring -> pull path with
   a centralized parameter server (the DENSE baseline of Section V).

2. The DAG model of S-SGD (Shi et al., "A DAG Model of Synchronous Stochastic
   Gradient Descent in Distributed Deep Learning"): per-layer forward, backward
   and communication tasks with wait-free backpropagation (a layer's gradient
   is communicated as soon as its backward finishes). ``dag_iterations_s`` also
   chains iterations, so the forward of layer ``l`` waits for the sync of layer
   ``l`` from the previous iteration -- the dependency that makes prioritizing
   the leading layers pay off.

Units: bytes, GB/s (1e9 bytes/s, per direction), microseconds for latencies and
seconds for every returned time. A bandwidth may be ``math.inf`` (a link that
costs nothing), which is how the extremes of the model are probed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Layer",
    "best_split",
    "coarse_sync_s",
    "dag_iteration_s",
    "dag_iterations_s",
    "dense_sync_s",
    "leading_bytes_for",
    "ring_allreduce_s",
    "t_sync_gpu",
    "t_sync_proxy",
    "t_train",
]

# Relative tolerance when comparing candidate times: float noise must not decide
# between splits that the model says are equally fast.
_TIE_RTOL = 1e-12


# --------------------------------------------------------------------------- #
# Validation helpers                                                           #
# --------------------------------------------------------------------------- #


def _check_p(p: int) -> None:
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"p must be an int >= 1, got {p!r}.")


def _check_nonneg(value: float, what: str) -> None:
    # `not value >= 0` also rejects NaN.
    if not value >= 0:
        raise ValueError(f"{what} must be >= 0, got {value!r}.")


def _check_bw(gbps: float, what: str) -> None:
    if not gbps > 0:
        raise ValueError(f"{what} must be > 0 GB/s (math.inf allowed), got {gbps!r}.")


def _xfer_s(nbytes: float, gbps: float) -> float:
    """Seconds to move ``nbytes`` at ``gbps`` GB/s; 0 for an infinite link."""
    if nbytes == 0:
        return 0.0  # avoids 0/inf ambiguity and keeps exact zeros exact
    return nbytes / (gbps * 1e9)


def _ring_factor(p: int) -> float:
    """Fraction of the buffer each ring member sends: 2(p-1)/p."""
    return 2.0 * (p - 1) / p


# --------------------------------------------------------------------------- #
# 1. COARSE paper model (Section III-F)                                        #
# --------------------------------------------------------------------------- #


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
    """
    _check_p(p)
    _check_nonneg(nbytes, "nbytes")
    _check_bw(gbps, "gbps")
    _check_nonneg(latency_us, "latency_us")
    if p == 1:
        return 0.0
    return _ring_factor(p) * _xfer_s(nbytes, gbps) + 2 * (p - 1) * latency_us * 1e-6


def t_sync_proxy(m: float, p: int, bw_proxy_gbps: float) -> float:
    """Paper's ``T_sync(proxy) = 2(p-1)/p * m / BW_proxy``: ring of ``p`` proxies over ``m`` bytes.

    Args:
      m: Bytes synchronized by the proxies.
      p: Number of proxies (= number of workers).
      bw_proxy_gbps: Proxy-to-proxy bandwidth in GB/s.

    Returns:
      Seconds.
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
    """
    _check_nonneg(n, "n")
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
    """
    _check_nonneg(t_fp, "t_fp")
    _check_nonneg(t_bp, "t_bp")
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
    """
    _check_p(p)
    _check_nonneg(n, "n")
    _check_bw(bw_proxy_gbps, "bw_proxy_gbps")
    _check_bw(bw_gpu_gbps, "bw_gpu_gbps")
    n = int(n)

    if candidates is not None:
        pool = {0, n}
        for c in candidates:
            if not 0 <= c <= n:
                raise ValueError(f"best_split: candidate {c!r} is outside [0, n={n}].")
            pool.add(int(c))
    else:
        c = _ring_factor(p)
        inv_p = 1.0 / (bw_proxy_gbps * 1e9)
        inv_g = 1.0 / (bw_gpu_gbps * 1e9)
        if c == 0.0 or inv_p + inv_g == 0.0:
            pool = {n}  # t_train is independent of m
        else:
            m_star = (t_bp + c * n * inv_g) / (c * (inv_p + inv_g))
            m_star = min(max(m_star, 0.0), float(n))
            pool = {math.floor(m_star), math.ceil(m_star)}

    def cost(m: int) -> float:
        return t_train(m, n, p, bw_proxy_gbps, bw_gpu_gbps, t_fp, t_bp)

    times = {m: cost(m) for m in pool}
    best_t = min(times.values())
    m = max(m for m, t in times.items() if t <= best_t * (1 + _TIE_RTOL))
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
    each of the ``2(p-1)`` ring steps):

        push = lat + s / push_bw
        ring = ring_allreduce_s(s, p, bw_proxy, lat)
        pull = lat + s / pull_bw

    A pipeline of uniform stages finishes one shard per bottleneck stage after
    the first shard has crossed all of them:

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
    """
    _check_p(p)
    _check_nonneg(n, "n")
    _check_bw(push_gbps, "push_gbps")
    _check_bw(pull_gbps, "pull_gbps")
    _check_bw(bw_proxy_gbps, "bw_proxy_gbps")
    _check_nonneg(latency_us, "latency_us")
    if not shard_bytes > 0:
        raise ValueError(f"shard_bytes must be > 0, got {shard_bytes!r}.")
    if n == 0 or p == 1:
        return 0.0
    k = math.ceil(n / shard_bytes)
    s = n / k
    lat = latency_us * 1e-6
    push = lat + _xfer_s(s, push_gbps)
    pull = lat + _xfer_s(s, pull_gbps)
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
    free; the port is the bottleneck.

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
    """
    _check_p(p)
    _check_nonneg(n, "n")
    _check_bw(gbps, "gbps")
    _check_nonneg(latency_us, "latency_us")
    if shard_bytes is not None and not shard_bytes > 0:
        raise ValueError(f"shard_bytes must be > 0 or None, got {shard_bytes!r}.")
    if n == 0 or p == 1:
        return 0.0
    lat2 = 2 * latency_us * 1e-6
    stream = _xfer_s(p * n, gbps)
    if not duplex:
        return 2 * stream + lat2
    k = 1 if shard_bytes is None else math.ceil(n / shard_bytes)
    return stream + _xfer_s(p * n / k, gbps) + lat2


# --------------------------------------------------------------------------- #
# 2. DAG model of S-SGD with wait-free backpropagation                         #
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class Layer:
    """Per-layer costs of one training iteration on one worker.

    Attributes:
      name: Label, for reporting only.
      fwd_s: Forward computation seconds.
      bwd_s: Backward computation seconds.
      grad_bytes: Gradient bytes to synchronize (0 for parameter-free layers,
        which then need no communication task).
    """

    name: str
    fwd_s: float
    bwd_s: float
    grad_bytes: int

    def __post_init__(self) -> None:
        _check_nonneg(self.fwd_s, f"Layer {self.name!r}: fwd_s")
        _check_nonneg(self.bwd_s, f"Layer {self.name!r}: bwd_s")
        _check_nonneg(self.grad_bytes, f"Layer {self.name!r}: grad_bytes")


def dag_iteration_s(
    layers: Sequence[Layer],
    comm_s: Callable[[int], float],
    *,
    overlap: bool = True,
    worker_layers: int = 0,
    worker_comm_s: Callable[[int], float] | None = None,
) -> float:
    """Predicted time of one S-SGD iteration from per-layer costs.

    Compute is one serial resource: forward of layers ``0..L-1``, then backward
    of ``L-1..0``. Layer ``l``'s gradient is ready when its backward finishes
    (wait-free backpropagation). Each communication channel is another serial
    resource that takes gradients in the order they become ready (so backward
    order), each lasting ``comm_s(grad_bytes)``. The iteration ends when the
    backward pass and every communication are done.

    Dual synchronization: the first ``worker_layers`` layers (the leading ones)
    go on a second, independent channel with cost ``worker_comm_s`` -- the
    worker ring -- and the rest on the proxy channel with ``comm_s``. The two
    channels share nothing, so they run concurrently.

    Args:
      layers: Layers in forward order.
      comm_s: Seconds to synchronize a gradient of the given byte size on the
        proxy (main) channel.
      overlap: If False, no communication starts before the whole backward
        pass is done (the non-WFBP baseline).
      worker_layers: How many leading layers use the worker channel.
      worker_comm_s: Cost function of the worker channel; required when
        ``worker_layers > 0``.

    Returns:
      Seconds from the start of the forward pass to the end of the iteration.

    Raises:
      ValueError: On an invalid ``worker_layers``/``worker_comm_s``.
    """
    return dag_iterations_s(
        layers,
        comm_s,
        1,
        overlap=overlap,
        worker_layers=worker_layers,
        worker_comm_s=worker_comm_s,
    )


def dag_iterations_s(
    layers: Sequence[Layer],
    comm_s: Callable[[int], float],
    steps: int,
    *,
    overlap: bool = True,
    worker_layers: int = 0,
    worker_comm_s: Callable[[int], float] | None = None,
) -> float:
    """Predicted total time of ``steps`` consecutive S-SGD iterations.

    Each iteration is scheduled as in :func:`dag_iteration_s`; across
    iterations the forward of layer ``l`` in iteration ``t+1`` also waits for
    the synchronization of layer ``l`` from iteration ``t`` (its parameters are
    updated with the reduced gradient). Because the backward pass finishes with
    layer 0, whose gradient is then synchronized *last* on a FIFO channel, the
    next forward pass stalls on it; putting the leading layers on their own
    channel (``worker_layers``) is what removes that stall. The optimizer
    update is folded into the communication cost.

    Args:
      layers: Layers in forward order.
      comm_s: Seconds to synchronize a gradient of the given byte size on the
        proxy (main) channel.
      steps: Number of iterations (>= 1).
      overlap: If False, an iteration's communications start only after its
        whole backward pass.
      worker_layers: How many leading layers use the worker channel.
      worker_comm_s: Cost function of the worker channel; required when
        ``worker_layers > 0``.

    Returns:
      Seconds from the first forward to the end of the last iteration's
      backward pass and communications; 0 for an empty model.

    Raises:
      ValueError: On ``steps < 1`` or an invalid ``worker_layers``/``worker_comm_s``.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}.")
    num = len(layers)
    if not 0 <= worker_layers <= num:
        raise ValueError(f"worker_layers must be in [0, {num}], got {worker_layers!r}.")
    if worker_layers > 0 and worker_comm_s is None:
        raise ValueError("worker_comm_s is required when worker_layers > 0.")

    compute = 0.0  # when the compute resource is next free
    channel_free = [0.0, 0.0]  # [proxy channel, worker channel]
    synced = [0.0] * num  # when layer l's last gradient sync ended
    end = 0.0
    for _ in range(steps):
        for l, layer in enumerate(layers):
            compute = max(compute, synced[l]) + layer.fwd_s
        ready: list[tuple[int, float]] = []  # (layer, gradient-ready time), backward order
        for l in range(num - 1, -1, -1):
            compute += layers[l].bwd_s
            ready.append((l, compute))
        end = max(end, compute)
        for l, t_ready in ready:
            nbytes = layers[l].grad_bytes
            if nbytes == 0:
                synced[l] = t_ready  # nothing to synchronize
                continue
            # Without overlap every sync waits for the end of the backward pass.
            start = t_ready if overlap else compute
            ch = 1 if l < worker_layers else 0
            cost = (worker_comm_s if ch else comm_s)(nbytes)  # type: ignore[misc]
            _check_nonneg(cost, f"communication time of layer {layers[l].name!r}")
            channel_free[ch] = max(channel_free[ch], start) + cost
            synced[l] = channel_free[ch]
            end = max(end, synced[l])
    return end


# ----------------------------------------------------------------------------- the runtime's schedule


def predict_plan_sync_s(plan: Any, topology: Any) -> float:
    """Predicted seconds for one `coarse.all_reduce` of ``plan`` on an emulated ``topology``.

    The paper's push -> proxy ring -> pull pipeline, evaluated piece by piece
    on the links and ports the runtime books (coarse_jax/topology.py,
    ffi/runtime/emulator.h), so unequal pieces, crossing routes and DENSE
    (every worker routed to one proxy: no ring, one port) are all covered:

    * pushes: each worker issues its pieces in plan order at t=0; a transfer
      books its directed link and, worker<->proxy, both devices' ports; it
      arrives ``latency + bytes / bandwidth`` after its start;
    * proxy ring: piece s starts when every proxy has its pushes and piece
      s-1 is done; two rings in opposite directions each move half of s in
      2(p-1) steps of ``chunk = bytes / 2p`` (a piece held by one proxy has
      no ring);
    * pulls: each worker takes its pieces in order from its proxy once reduced;
    * leading layers: the worker ring (same two rings on worker links), then
      the hand-over to the local proxy when proxies are in use.

    Host costs (copies, additions, thread wake-ups) are not modelled: pick a
    ``time_scale`` that makes the emulated links dominate.
    """
    p = plan.workers
    link_free: dict[tuple[int, int], float] = {}
    port_in = [0.0] * (2 * p)
    port_out = [0.0] * (2 * p)

    def book(src: int, dst: int, nbytes: float, ready: float) -> float:
        src_w, dst_w = src < p, dst < p
        if src_w and dst_w:
            kind, a, b = "ww", src, dst
        elif not src_w and not dst_w:
            kind, a, b = "pp", src - p, dst - p
        else:
            kind = "wp"
            a, b = (src, dst - p) if src_w else (dst, src - p)
        s_per_byte, latency = topology.link(kind, a, b)
        busy = nbytes * s_per_byte
        start = max(ready, link_free.get((src, dst), 0.0))
        serial_bus = src_w != dst_w
        if serial_bus:
            start = max(start, port_out[src], port_in[dst])
        link_free[(src, dst)] = start + busy
        if serial_bus:
            port_out[src] = port_in[dst] = start + busy
        return start + busy + latency

    def ring_s(nbytes: float, kind: str) -> float:
        if p == 1:
            return 0.0
        # Lockstep rings are bounded by their slowest neighbour link.
        step = max(topology.transfer_s(kind, k, (k + 1) % p, nbytes / (2 * p)) for k in range(p))
        return 2 * (p - 1) * step

    pieces = plan.pieces
    # Book in time order (piece by piece, all workers), as the devices do.
    arrival = [[book(i, p + pc.dest[i], pc.nbytes, 0.0) for i in range(p)] for pc in pieces]
    ring_end = 0.0
    done = 0.0
    reduced = []
    for s, pc in enumerate(pieces):
        start = max(max(arrival[s]), ring_end)
        holder = pc.dest[0] if all(d == pc.dest[0] for d in pc.dest) else None
        ring_end = start + (0.0 if holder is not None else ring_s(pc.nbytes, "pp"))
        reduced.append(ring_end)
    for s, pc in enumerate(pieces):
        for i in range(p):
            done = max(done, book(p + pc.dest[i], i, pc.nbytes, reduced[s]))
    lead_bytes = sum(plan.leaves[t].nbytes for t in plan.leading_leaves)
    if plan.leading_leaves:
        lead_done = ring_s(lead_bytes, "ww")
        if pieces:
            lead_done = max(book(i, p + i, lead_bytes, lead_done) for i in range(p))
        done = max(done, lead_done)
    return done
