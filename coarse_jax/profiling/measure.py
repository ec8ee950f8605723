"""`coarse.diagnostics.profile`: measure the mesh's links through the runtime's own transport.

One compiled program per transfer size runs the ``coarse_probe`` custom call
on every device, the p workers and the q distinct proxies (q = p at COARSE
1:1, fewer at COARSE k:1, where the mesh lists each proxy under its k
workers); which (source, destination) pairs transfer is an operand, so all
links of that size reuse the program. Measured: every worker -> proxy pair
one way and both ways at once (push + pull), every proxy -> neighbour in the
proxies' ring (of q) one way and both ways, every worker -> neighbour in the
workers' ring (of p) one way (AllReduce's links).
On an emulated interconnect (``topology=``) the probe books the same links,
ports and time scale a push, ring step or pull does (on the real clock it
times the emulated link itself: the host's copy is not counted); without one
it measures the host's real copies.

Routing decisions do not follow noise: after that first pass, the links of
every decision still open (each worker's latency proxy, bandwidth proxy and
threshold) are measured again, round after round, interleaved in a shuffled
order, until each decision is clear by `rounds.DECISION_MARGIN` (5%) at
`rounds.DECISION_CONFIDENCE` (99%), or the time budget (``budget_s``) is
spent; a decision still unclear then keeps the model's choice for the
emulated topology (or, on the host's own devices, the local proxy), and the
`Profile` says so (`Profile.decisions`, `Profile.table()`). See
`coarse_jax.profiling.rounds` for the rule.

CLI::

    python -m coarse_jax.profiling --emulate v100 --workers 4

prints the link table, each worker's routing table, the threshold S, shard size
S', the dual-sync split m, and predicted vs measured sync time for DENSE,
AllReduce and COARSE on a ResNet-50-shaped gradient tree.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from coarse_jax import _ffi
from coarse_jax.emulation.topology import EmulatedTopology
from coarse_jax.mesh import (
    DATA,
    MeshLike,
    Tiers,
    check_mesh,
    has_hosts,
    local_proxy,
    num_proxies,
    platform,
    proxies_on,
    proxy_devices,
)
from coarse_jax.profiling.data import Profile
from coarse_jax.profiling.decision import DECISION_KINDS, Decision
from coarse_jax.profiling.rounds import decide as decide_rounds

DEFAULT_SIZES = tuple(4**k for k in range(5, 13))  # 1 KiB, 4 KiB, .., 16 MiB
_PROBE_SITE = 1 << 40  # keeps probe sessions apart from sync sites
_PROBE_AXIS = "device"  # the probe's own mesh: the p workers, then the q proxies
DEFAULT_BUDGET_S = 15.0  # re-measuring open decisions, after the first pass
MAX_ROUNDS = 64  # rounds of re-measurement at most, whatever the budget


def _probe_mesh(mesh: Tiers) -> Mesh:
    """A 1-D mesh of ``mesh``'s p workers, then its q distinct proxies.

    A step's program spans the workers only; the probe runs on both tiers
    (it times worker-proxy links). jax runs no program on a mesh that lists a
    device twice, and a k:1 mesh lists each proxy k times: the probe's mesh
    lists every device once, in the runtime's numbering (worker i is device
    i, proxy j device p + j). Host proxies are no devices: the probe's mesh
    is the p workers, and worker k < q also stands for host proxy k
    (ffi/runtime/probe.h).
    """
    if proxies_on(mesh) == "host":
        return Mesh(np.asarray(mesh.devices).reshape(-1), (_PROBE_AXIS,))
    devices = [*np.asarray(mesh.devices)[0], *proxy_devices(mesh)]
    if len(set(devices)) != len(devices):
        raise ValueError(
            "coarse.diagnostics.profile: the mesh's workers and proxies must be distinct devices "
            "(the probe times the links between them), got "
            f"{[[getattr(d, 'id', d) for d in row] for row in np.asarray(mesh.devices)]}. "
            "Build the mesh with coarse.make_mesh(workers=p, proxies=q)."
        )
    return Mesh(np.array(devices, dtype=object), (_PROBE_AXIS,))


def _probe_program(
    probe_mesh: Mesh, p: int, q: int, nbytes: int, reps: int, topology: EmulatedTopology | None
) -> Callable[[jax.Array], np.ndarray]:
    """jit(shard_map): every device runs coarse_probe; returns seconds [p + q, reps].

    The payload (``nbytes`` per device) is made once and kept: a program that
    made it would fill ``(p + q) * nbytes`` bytes on every call. With host
    proxies (a probe mesh of the p workers) each worker returns its times and
    those of the host proxy it stands for.
    """
    host = probe_mesh.size == p < p + q
    attrs = {
        "workers": np.int64(p),
        "proxies": np.int64(q),
        "site": np.int64(_PROBE_SITE),
        "timeout_ms": np.int64(60_000),
    }
    if topology is not None:
        attrs.update(topology.ffi_attrs())
    if host:
        attrs["host_proxies"] = np.int64(1)
    per_device = 2 * reps if host else reps

    def body(pairs: jax.Array, payload: jax.Array) -> jax.Array:
        # The calling device's (tier, index): worker (0, i) for i < p, proxy (1, j) at p + j.
        d = lax.axis_index(_PROBE_AXIS).astype(jnp.int32)
        is_proxy = (d >= p).astype(jnp.int32)
        me = jnp.stack([is_proxy, d - p * is_proxy])
        times = jax.ffi.ffi_call(
            "coarse_probe",
            jax.ShapeDtypeStruct((per_device,), jnp.float32, manual_axis_type=None),
            has_side_effect=True,
            vmap_method="broadcast_all",
        )(me, _ffi.vary(pairs, (_PROBE_AXIS,)), payload.reshape(-1), **attrs)
        return times[None]

    fn = jax.jit(
        jax.shard_map(
            body,
            mesh=probe_mesh,
            in_specs=(P(), P(_PROBE_AXIS)),
            out_specs=P(_PROBE_AXIS),
            check_vma=False,
        )
    )
    payload = jax.jit(
        lambda: jnp.zeros((probe_mesh.size, nbytes), jnp.uint8),
        out_shardings=NamedSharding(probe_mesh, P(_PROBE_AXIS)),
    )()

    def run(pairs: jax.Array) -> np.ndarray:
        times = np.asarray(fn(pairs, payload))
        if not host:
            return times.reshape(p + q, reps)
        both = times.reshape(p, 2, reps)  # worker k's, then host proxy k's (k < q)
        return np.concatenate([both[:, 0], both[:q, 1]])

    return run


def robust_time(times: np.ndarray) -> tuple[float, float]:
    """``(seconds, spread)`` of one transfer from its repetitions (warm-up already dropped).

    Host noise (a thread woken late, another process on the core) only ever
    adds time, so the transfer's own time is the fastest repetition.
    ``spread`` says how noisy the repetitions were: the median's excess over
    the fastest, relative to it, after dropping outliers (repetitions more
    than 5 median absolute deviations above the median: one preempted
    repetition says nothing about the rest). 0 on a virtual clock.
    """
    times = np.asarray(times, dtype=np.float64)
    fastest = float(times.min())
    median = float(np.median(times))
    mad = float(np.median(np.abs(times - median)))
    kept = times[times <= median + 5 * mad] if mad > 0 else times
    return fastest, float(np.median(kept) - fastest) / fastest


def _device(tier: int, index: int, p: int) -> int:
    """The runtime's number of worker (tier 0) or proxy (tier 1) ``index``: i, or p + j."""
    return index if tier == 0 else p + index


def profile(
    mesh: MeshLike,
    *,
    topology: EmulatedTopology | None = None,
    sizes: Sequence[int] | None = None,
    reps: int = 5,
    budget_s: float = DEFAULT_BUDGET_S,
) -> Profile:
    """Measures latency and bandwidth of every worker->proxy pair and ring neighbour.

    On a COARSE k:1 mesh (``coarse.make_mesh(workers=p, proxies=q)``) it
    measures every worker's links to the q distinct proxies, the proxies'
    ring of q and the workers' ring of p.

    Args:
      mesh: a mesh from `coarse.make_mesh` (1:1 or k:1).
      topology: measure this emulated interconnect (`coarse.EmulatedTopology`, for
        the mesh's p workers and q proxies) instead of the host's real transport.
      sizes: transfer sizes in bytes (ascending); default 1 KiB to 16 MiB.
        Include sizes past the latency/bandwidth crossing, or the planner
        cannot see which proxy has more bandwidth.
      reps: repetitions per measurement; the first is dropped as warm-up, the
        fastest of the rest is kept (host noise only adds time) and their
        spread recorded (`robust_time`; ``Profile.wp_spread``).
      budget_s: seconds the profiler may spend, after its first pass over
        every link, re-measuring the links of routing decisions that are not
        yet clear (at most `MAX_ROUNDS` rounds). Each round measures those
        links once more, in a shuffled order; a decision is clear when the
        99% confidence interval of its paired per-round ratios clears a 5%
        margin (`coarse_jax.profiling.rounds`). One still unclear when the
        budget is spent keeps the model's choice for ``topology`` (or the
        local proxy on the host's own devices), and ``Profile.decisions``
        and ``Profile.table()`` say so. 0 decides from the first pass alone
        (every decision that needs a confidence interval then falls back). A
        virtual clock is exact: one pass decides and the budget is unused.
        ``wp_oneway_s`` holds each link's median over its rounds.

    Returns:
      A `coarse.diagnostics.Profile` (``table()``, ``plot(path)``, ``save(path)``);
      `coarse.Config.from_profile` turns it into routes, threshold and shard size.

    With proxies in host memory (``make_mesh(..., proxies_on="host")``) the
    worker<->proxy links are the workers' PCIe links: give a PCIe-link
    topology (``EmulatedTopology.preset(name, p, proxies=q, proxies_on="host")``) to
    measure the emulated link; without one the probe times the host's own
    copies, which on CPU devices are memory-to-memory copies.

    Raises:
      ValueError: bad sizes, reps or budget_s, or a topology for another
        number of workers or proxies or another placement, or not a coarse
        mesh (or one whose proxies share the workers' devices).
      NotImplementedError: the mesh spans hosts (profile each host's part).

    Example:
      >>> topo = coarse.EmulatedTopology.preset("v100", 4, clock="virtual")  # exact, no sleep
      >>> sizes = [1 << 10, 1 << 16, 1 << 22]
      >>> prof = coarse.diagnostics.profile(mesh, topology=topo, sizes=sizes)
      >>> cfg = coarse.Config.from_profile(prof, topology=topo)
      >>> cfg.routes       # (latency proxy, bandwidth proxy) per worker: local, then next
      ((0, 1), (1, 2), (2, 3), (3, 0))
      >>> shared = coarse.make_mesh(workers=4, proxies=2)            # COARSE(2:1)
      >>> topo = coarse.EmulatedTopology.preset("v100", 4, proxies=2, clock="virtual")
      >>> prof = coarse.diagnostics.profile(shared, topology=topo, sizes=sizes)
      >>> coarse.Config.from_profile(prof, topology=topo).routes   # local i // 2, then the other
      ((0, 1), (0, 1), (1, 0), (1, 0))
      >>> host = coarse.make_mesh(workers=4, proxies=2, proxies_on="host")
      >>> topo = coarse.EmulatedTopology.preset(
      ...     "pcie4", 4, proxies=2, proxies_on="host", clock="virtual"
      ... )
      >>> prof = coarse.diagnostics.profile(host, topology=topo, sizes=[1 << 10, 1 << 22])
      >>> us = float(prof.wp_oneway_s[0, 1, -1]) * 1e6    # 4 MiB at 12.5 GB/s (Gen4 shared) + 2 us
      >>> round(us, 1), round(topo.transfer_s("wp", 0, 1, 1 << 22) * 1e6, 1)
      (337.5, 337.5)
    """
    tiers = check_mesh(mesh, "coarse.diagnostics.profile")
    placement = proxies_on(tiers)
    if has_hosts(tiers):
        raise NotImplementedError(
            "coarse.diagnostics.profile: the mesh spans hosts ('host' axis); the profiler times "
            "the links within one host. Fix: profile this host's part, "
            "coarse.diagnostics.profile(coarse_jax.mesh.local_mesh(mesh)), on every process, and "
            "pass the same Config (Config.from_profile) on every process."
        )
    _ffi.check_platform(tiers)
    p = tiers.shape[DATA]
    q = num_proxies(tiers)
    if topology is not None and (topology.workers, topology.proxies) != (p, q):
        raise ValueError(
            f"coarse.diagnostics.profile: topology describes {topology.workers} workers and "
            f"{topology.proxies} proxies, the mesh has {p} workers and {q} proxies. Fix: "
            f"coarse.EmulatedTopology.preset(name, {p}, proxies={q}), or an EmulatedTopology of "
            f"{p}x{q} "
            "worker_proxy matrices."
        )
    if topology is not None and topology.proxies_on != placement:
        raise ValueError(
            "coarse.diagnostics.profile: topology describes proxies on "
            f"{topology.proxies_on!r}, the mesh's are on {placement!r}. Fix: "
            f"coarse.EmulatedTopology.preset(name, {p}, proxies={q}, proxies_on={placement!r})."
        )
    probe_mesh = _probe_mesh(tiers)
    # The probe's transfers are host memcpys: no CUDA version yet.
    _ffi.check_gpu_target(
        "coarse_probe",
        platform(tiers),
        " coarse.diagnostics.profile times host transfers: profile a CPU mesh or an emulated "
        "topology (coarse.EmulatedTopology), or give the routes directly "
        "(Config(routes=..., latency_threshold_bytes=...)).",
    )
    sizes = tuple(int(s) for s in (DEFAULT_SIZES if sizes is None else sizes))
    if not sizes or any(s <= 0 for s in sizes) or list(sizes) != sorted(set(sizes)):
        raise ValueError(
            "coarse.diagnostics.profile: sizes must be ascending positive byte counts, got "
            f"{sizes}."
        )
    if reps < 2:
        raise ValueError(
            f"coarse.diagnostics.profile: reps must be >= 2 (one is warm-up), got {reps}."
        )
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not budget_s >= 0:
        raise ValueError(
            "coarse.diagnostics.profile: budget_s must be seconds >= 0 (the time to re-measure "
            f"routing decisions that are not yet clear), got {budget_s!r}. Fix: e.g. budget_s=20, "
            "or 0 to decide from one pass."
        )

    S = len(sizes)
    wp_bi, wp_spread = np.zeros((p, q, S)), np.zeros((p, q, S))
    pp_one, pp_bi = np.zeros((q, 2, S)), np.zeros((q, 2, S))
    ww_one = np.zeros((p, 2, S))
    # Worker -> proxy one way, per (worker, proxy, size index): round -> fastest repetition.
    samples: dict[tuple[int, int, int], dict[int, float]] = {
        (i, k, j): {} for i in range(p) for k in range(q) for j in range(S)
    }
    programs = [_probe_program(probe_mesh, p, q, n, reps, topology) for n in sizes]

    def measure(j: int, *pairs: tuple[int, int]) -> tuple[float, float]:
        """(seconds, relative spread) of one transfer of sizes[j], or of two at once."""
        flat = [v for pair in pairs for v in pair] + [-1, -1] * (2 - len(pairs))
        times = programs[j](jnp.asarray(flat, jnp.int32))
        per_pair = [robust_time(times[src, 1:]) for src, _ in pairs]  # [0]: warm-up
        slowest = max(per_pair)  # both directions done
        return slowest[0], max(spread for _, spread in per_pair)

    def ring(k: int, n: int) -> tuple[int, int]:
        """Device k's (next, previous) neighbour in a ring of n."""
        return (k + 1) % n, (k - 1) % n

    # The first pass: every link once.
    for j in range(S):
        for i in range(p):
            for k in range(q):
                w, x = _device(0, i, p), _device(1, k, p)
                samples[i, k, j][0], wp_spread[i, k, j] = measure(j, (w, x))
                wp_bi[i, k, j], _ = measure(j, (w, x), (x, w))
        # A ring of one device moves nothing: its entries are a placeholder 1 ns.
        for k in range(q):
            for r, nb in enumerate(ring(k, q)):
                if q == 1:
                    pp_one[k, r, j] = pp_bi[k, r, j] = 1e-9
                    continue
                a, b = _device(1, k, p), _device(1, nb, p)
                pp_one[k, r, j], _ = measure(j, (a, b))
                pp_bi[k, r, j], _ = measure(j, (a, b), (b, a))
        for k in range(p):
            for r, nb in enumerate(ring(k, p)):
                if p == 1:
                    ww_one[k, r, j] = 1e-9
                    continue
                ww_one[k, r, j], _ = measure(j, (_device(0, k, p), _device(0, nb, p)))

    # Then the open decisions' links, round after round, until each is clear or the budget is spent.
    exact = topology is not None and topology.clock == "virtual"
    model_s = None
    if topology is not None:
        model_s = np.array(
            [[[topology.transfer_s("wp", i, k, n) for n in sizes] for k in range(q)]
             for i in range(p)]
        )  # fmt: skip
    decide = functools.partial(
        decide_rounds,
        lambda i, k, j: samples[i, k, j],
        sizes,
        [local_proxy(i, p, q) for i in range(p)],
        q,
        exact=exact,
        model_s=model_s,
        model_name=None if topology is None else topology.name,
    )
    rng = np.random.default_rng(0)
    settled: dict[tuple[int, str], Decision] = {}
    start, rounds = time.monotonic(), 0
    while True:
        spent = time.monotonic() - start
        why = ""
        if not exact and spent >= budget_s:
            why = f" (budget_s={budget_s:g} spent after {rounds} more rounds)"
        elif rounds >= MAX_ROUNDS:
            why = f" ({MAX_ROUNDS} more rounds, the most)"
        settled, needed = decide(settled=settled, final=exact or bool(why), why=why)
        if not needed:
            break
        rounds += 1
        links = sorted(needed)
        rng.shuffle(links)  # interleaved: no link is always measured first or after another
        for i, k, j in links:
            samples[i, k, j][rounds], _ = measure(j, (_device(0, i, p), _device(1, k, p)))
    wp_one = np.array(
        [[[np.median(list(samples[i, k, j].values())) for j in range(S)] for k in range(q)]
         for i in range(p)]
    )  # fmt: skip

    return Profile(
        workers=p,
        sizes=sizes,
        wp_oneway_s=wp_one,
        wp_bidir_s=wp_bi,
        pp_oneway_s=pp_one,
        pp_bidir_s=pp_bi,
        ww_oneway_s=ww_one,
        topology=None if topology is None else topology.name,
        time_scale=1.0 if topology is None else topology.time_scale,
        host=f"{jax.devices()[0].platform}, {len(jax.devices())} devices",
        wp_spread=wp_spread,
        proxies=q,
        decisions=tuple(settled[i, kind] for i in range(p) for kind in DECISION_KINDS),
    )


def measure_step_times(
    fun: Callable[..., Any], *args: Any, argnums: int | Sequence[int] = 0, reps: int = 5
) -> tuple[float, float]:
    """``(T_FP, T_BP)``: seconds of ``fun``'s forward and backward pass on one device.

    Runs ``jit(fun)`` and ``jit(value_and_grad(fun))`` a few times on the
    first device with ``args`` (give one worker's share of the batch) and
    takes medians; T_BP is the difference. For ``Config(leading_bytes="auto")``.

    Args:
      fun: the loss function.
      *args: its arguments, with one worker's share of the batch.
      argnums: which arguments to differentiate, as for ``jax.value_and_grad``.
      reps: timed runs of each (after one for compilation).

    Returns:
      ``(T_FP, T_BP)`` in seconds.

    Example:
      >>> def loss_fn(params, batch):
      ...     return jnp.mean((batch @ params["w"]) ** 2)
      >>> params, batch_shard = {"w": jnp.ones((64, 8))}, jnp.ones((16, 64))
      >>> t_fp, t_bp = coarse.diagnostics.measure_step_times(loss_fn, params, batch_shard)
      >>> t_fp > 0 and t_bp >= 0
      True
      >>> topo = coarse.EmulatedTopology.preset("v100", 4, clock="virtual")
      >>> prof = coarse.diagnostics.profile(mesh, topology=topo, sizes=[1 << 10, 1 << 20])
      >>> cfg = coarse.Config.from_profile(prof, leading_bytes="auto", step_times_s=(t_fp, t_bp))
    """
    device = jax.devices()[0]
    args = jax.device_put(args, device)
    forward = jax.jit(fun)
    both = jax.jit(jax.value_and_grad(fun, argnums=argnums))

    def median_s(f: Callable[..., Any]) -> float:
        jax.block_until_ready(f(*args))  # compile, warm up
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            jax.block_until_ready(f(*args))
            times.append(time.perf_counter() - start)
        return float(np.median(times))

    t_fp = median_s(forward)
    return t_fp, max(0.0, median_s(both) - t_fp)
