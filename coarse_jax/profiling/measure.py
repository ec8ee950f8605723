"""`coarse.profile`: measure the mesh's links through the runtime's own transport.

One compiled program per transfer size runs the ``coarse_probe`` custom call
on every device; which (source, destination) pairs transfer is an operand, so
all links of that size reuse the program. Measured: every worker -> proxy pair
one way and both ways at once (push + pull), every proxy -> ring neighbour one
way and both ways, every worker -> ring neighbour one way (AllReduce's links).
On an emulated interconnect (``topology=``) the probe books the same links,
ports and time scale a push, ring step or pull does; without one it measures
the host's real copies.

CLI::

    python -m coarse_jax.profiling --emulate v100 --workers 4

prints the link table, each worker's routing table, the threshold S, shard size
S', the dual-sync split m, and predicted vs measured sync time for DENSE,
AllReduce and COARSE on a ResNet-50-shaped gradient tree.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from coarse_jax import _ffi
from coarse_jax.mesh import AXES, DATA, TIER, check_mesh, has_hosts
from coarse_jax.profiling.data import Profile
from coarse_jax.profiling.topology import Topology

DEFAULT_SIZES = tuple(4**k for k in range(5, 13))  # 1 KiB, 4 KiB, .., 16 MiB
_PROBE_SITE = 1 << 40  # keeps probe sessions apart from sync sites


def _probe_program(
    mesh: Mesh, nbytes: int, reps: int, topology: Topology | None
) -> Callable[[jax.Array], jax.Array]:
    """jit(shard_map): every device runs coarse_probe; returns seconds [2, p, reps]."""
    p = mesh.shape[DATA]
    attrs = {"workers": np.int64(p), "site": np.int64(_PROBE_SITE), "timeout_ms": np.int64(60_000)}
    if topology is not None:
        attrs.update(topology.ffi_attrs())

    def body(pairs: jax.Array) -> jax.Array:
        # The probe runs on both tiers (it times worker-proxy links), unlike
        # a step's program, which spans the workers only: its own (tier, data).
        me = jnp.stack([lax.axis_index(TIER), lax.axis_index(DATA)]).astype(jnp.int32)
        payload = _ffi.vary(jnp.zeros((nbytes,), jnp.uint8))
        times = jax.ffi.ffi_call(
            "coarse_probe",
            jax.ShapeDtypeStruct((reps,), jnp.float32, manual_axis_type=None),
            has_side_effect=True,
            vmap_method="broadcast_all",
        )(me, _ffi.vary(pairs), payload, **attrs)
        return times[None, None]

    fn = jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P(*AXES), check_vma=False)
    return jax.jit(fn)


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
    return index if tier == 0 else p + index


def profile(
    mesh: Mesh,
    *,
    topology: Topology | None = None,
    sizes: Sequence[int] | None = None,
    reps: int = 5,
) -> Profile:
    """Measures latency and bandwidth of every worker->proxy pair and ring neighbour.

    Args:
      mesh: a mesh from `coarse.make_mesh`.
      topology: measure this emulated interconnect (`coarse.Topology`) instead
        of the host's real transport.
      sizes: transfer sizes in bytes (ascending); default 1 KiB to 16 MiB.
        Include sizes past the latency/bandwidth crossing, or the planner
        cannot see which proxy has more bandwidth.
      reps: repetitions per measurement; the first is dropped as warm-up, the
        fastest of the rest is kept (host noise only adds time) and their
        spread recorded (`robust_time`; ``Profile.wp_spread``), so routing
        does not take noise for a difference between links.

    Returns:
      A `coarse.Profile` (``table()``, ``plot(path)``, ``save(path)``);
      `coarse.Config.from_profile` turns it into routes, threshold and shard size.

    Raises:
      ValueError: bad sizes, or a topology for another number of workers, or
        not a coarse mesh.
      NotImplementedError: the mesh spans hosts (profile each host's part).

    Example:
      >>> topo = coarse.Topology.preset("v100", 4, clock="virtual")   # exact, nothing sleeps
      >>> prof = coarse.profile(mesh, topology=topo, sizes=[1 << 10, 1 << 16, 1 << 22])
      >>> cfg = coarse.Config.from_profile(prof, topology=topo)
      >>> cfg.routes       # (latency proxy, bandwidth proxy) per worker: local, then next
      ((0, 1), (1, 2), (2, 3), (3, 0))
    """
    mesh = check_mesh(mesh, "coarse.profile")
    if has_hosts(mesh):
        raise NotImplementedError(
            "coarse.profile: the mesh spans hosts ('host' axis); the profiler times the links "
            "within one host. Fix: profile this host's part, "
            "coarse.profile(coarse_jax.mesh.local_mesh(mesh)), on every process, and pass the "
            "same Config (Config.from_profile) on every process."
        )
    _ffi.check_platform(mesh)
    p = mesh.shape[DATA]
    if topology is not None and topology.workers != p:
        raise ValueError(
            f"coarse.profile: topology describes {topology.workers} workers, the mesh has {p}."
        )
    # The probe's transfers are host memcpys: no CUDA version yet.
    _ffi.check_gpu_target(
        "coarse_probe",
        mesh.devices.flat[0].platform,
        " coarse.profile times host transfers: profile a CPU mesh or an emulated Topology, or "
        "give the routes directly (Config(routes=..., latency_threshold_bytes=...)).",
    )
    sizes = tuple(int(s) for s in (DEFAULT_SIZES if sizes is None else sizes))
    if not sizes or any(s <= 0 for s in sizes) or list(sizes) != sorted(set(sizes)):
        raise ValueError(
            f"coarse.profile: sizes must be ascending positive byte counts, got {sizes}."
        )
    if reps < 2:
        raise ValueError(f"coarse.profile: reps must be >= 2 (one is warm-up), got {reps}.")

    S = len(sizes)
    wp_one, wp_bi, wp_spread = np.zeros((p, p, S)), np.zeros((p, p, S)), np.zeros((p, p, S))
    pp_one, pp_bi = np.zeros((p, 2, S)), np.zeros((p, 2, S))
    ww_one = np.zeros((p, 2, S))
    neighbours = [(lambda k: (k + 1) % p), (lambda k: (k - 1) % p)]

    for j, nbytes in enumerate(sizes):
        run = _probe_program(mesh, nbytes, reps, topology)

        def measure(
            *pairs: tuple[int, int], run: Callable[[jax.Array], jax.Array] = run
        ) -> tuple[float, float]:
            """(seconds, relative spread) of one transfer, or of two at once."""
            flat = [v for pair in pairs for v in pair] + [-1, -1] * (2 - len(pairs))
            times = np.asarray(run(jnp.asarray(flat, jnp.int32))).reshape(2 * p, reps)
            per_pair = [robust_time(times[src, 1:]) for src, _ in pairs]  # [0]: warm-up
            slowest = max(per_pair)  # both directions done
            return slowest[0], max(spread for _, spread in per_pair)

        for i in range(p):
            for k in range(p):
                w, x = _device(0, i, p), _device(1, k, p)
                wp_one[i, k, j], wp_spread[i, k, j] = measure((w, x))
                wp_bi[i, k, j], _ = measure((w, x), (x, w))
        for k in range(p):
            for r, nb in enumerate(neighbours):
                a, b = _device(1, k, p), _device(1, nb(k), p)
                if p == 1:  # no neighbour: a ring of one moves nothing
                    pp_one[k, r, j] = pp_bi[k, r, j] = ww_one[k, r, j] = 1e-9
                    continue
                pp_one[k, r, j], _ = measure((a, b))
                pp_bi[k, r, j], _ = measure((a, b), (b, a))
                ww_one[k, r, j], _ = measure((_device(0, k, p), _device(0, nb(k), p)))

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
      >>> t_fp, t_bp = coarse.measure_step_times(loss_fn, params, batch_shard)
      >>> t_fp > 0 and t_bp >= 0
      True
      >>> topo = coarse.Topology.preset("v100", 4, clock="virtual")
      >>> prof = coarse.profile(mesh, topology=topo, sizes=[1 << 10, 1 << 20])
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
