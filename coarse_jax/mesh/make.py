"""`make_mesh`: the workers' mesh, with its proxies recorded beside it (`coarse_jax.mesh`)."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from coarse_jax.mesh.tiers import AXES, HOST_AXES, PROXIES_ON, Proxies, register


def make_mesh(
    workers: int | None = None,
    proxies: int | None = None,
    *,
    devices: Sequence[jax.Device] | None = None,
    proxies_on: str = "devices",
) -> Mesh:
    """Builds the mesh of ``workers`` workers, with ``proxies`` proxies beside it.

    Returns the workers' mesh, axes ``("tier", "data")`` of shape ``(1, p)``:
    the mesh to place state and batches on as jax's sharding guides do
    (``NamedSharding(mesh, P())``, ``NamedSharding(mesh, P("data"))``) and to
    pass to `coarse.sync`. No array placed on it lands on a proxy. The
    proxies are recorded beside it (`proxies_of`); `two_tier_mesh` gives the
    full mesh with the proxies on tier 1.

    With ``proxies=p`` (the default, COARSE 1:1) every worker has a proxy of
    its own. With ``q`` proxies, ``q`` dividing ``p`` (the paper's COARSE
    k:1, k = p / q), proxy ``j`` serves the group of workers ``j*k .. j*k +
    k - 1``, the first its local pair. Routes (``Config.routes``) name
    proxies by their number ``0..q-1``.

    **Proxies in host memory** (``proxies_on="host"``): the q proxies are
    the runtime's host memory and CPU threads, not jax devices, so every
    device can be a worker. The mesh is the same workers' mesh. Host proxies
    take CPU or GPU workers (with GPUs they have run on one GPU only:
    docs/guides/host_proxies.md).

    With several processes (after ``jax.distributed.initialize``) and no
    ``devices``, the mesh is ``("host", "tier", "data")`` of shape
    ``(process_count, 1, workers)``: ``workers`` and ``proxies`` are then per
    process, and each process's first ``workers`` local devices are its
    workers, the next ``proxies`` its proxies. Batches are split over
    ``("host", "data")``.

    Without ``devices`` the first ``p + q`` devices of the default backend
    are used, workers first; the mesh does not read the machine's topology.
    Pass ``devices`` (the p workers, then the q proxies) to choose yourself.

    Args:
      workers: number of workers p; default: as many as the devices hold
        beside the proxies: half of them at 1:1, else the largest multiple of
        ``proxies`` that fits beside them (all but the proxies with
        ``devices``); with ``proxies_on="host"`` all of them (the largest
        multiple of ``proxies`` that fits).
      proxies: number of proxies q, dividing p; default: p (one per worker).
      devices: the p + q devices to use, workers first (with
        ``proxies_on="host"``: the p workers).
      proxies_on: where the proxies live: ``"devices"`` (the default: each
        proxy a jax device) or ``"host"`` (host memory beside the workers).

    Returns:
      A ``jax.sharding.Mesh`` of the workers: shape ``(1, p)`` with axes
      ``("tier", "data")``, ``(process_count, 1, p)`` with axes ``("host",
      "tier", "data")`` across processes.

    Raises:
      ValueError: ``proxies`` does not divide ``workers``, the devices are
        too few, repeated, or do not match ``workers + proxies``, or
        ``proxies_on`` is neither ``"devices"`` nor ``"host"``.

    Warns:
      ProxiesReplaced: these workers had other proxies (`make_mesh` of the
        same workers before): jax's mesh objects are one.

    Example:
      >>> mesh = coarse.make_mesh(workers=4)   # 8 devices: 4 workers, 4 proxies
      >>> mesh.axis_names, mesh.devices.shape
      (('tier', 'data'), (1, 4))
      >>> from coarse_jax.mesh import proxies_of
      >>> [d.id for d in proxies_of(mesh).devices[0]]
      [4, 5, 6, 7]
      >>> shared = coarse.make_mesh(workers=4, proxies=2)   # 6 devices, COARSE(2:1)
      >>> [d.id for d in proxies_of(shared).devices[0]]
      [4, 5]
      >>> coarse.make_mesh(devices=jax.devices()[:4]).devices.shape   # 2 workers
      (1, 2)
      >>> on_host = coarse.make_mesh(workers=8, proxies=2, proxies_on="host")   # 8 devices
      >>> dict(on_host.shape), proxies_of(on_host).on
      ({'tier': 1, 'data': 8}, 'host')
    """
    _check_count("workers", workers)
    _check_count("proxies", proxies)
    _check_proxies_on(proxies_on)
    if proxies_on == "host":
        return _make_host_memory_proxy_mesh(workers, proxies, devices)
    if devices is None and jax.process_count() > 1:
        return _make_mesh_across_hosts(workers, proxies)
    pool = list(jax.devices()) if devices is None else list(devices)
    if devices is not None and len(set(pool)) != len(pool):
        raise ValueError(
            "make_mesh: devices must be distinct (a worker and a proxy each need a device of "
            "their own); got a device twice. Tests that let a proxy share its worker's device "
            "use coarse_jax.testing.shared_device_mesh."
        )
    p, q = _resolve_counts(workers, proxies, len(pool), exact=devices is not None)
    if len(pool) < p + q:
        raise ValueError(
            f"make_mesh: workers={p}, proxies={q} needs {p + q} devices, only {len(pool)} "
            f"available. Use fewer workers or proxies, or on CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={p + q} before importing jax."
        )
    mesh = Mesh(np.array(pool[:p], dtype=object).reshape(1, p), AXES)
    return register(mesh, Proxies("devices", q, p, (tuple(pool[p : p + q]),)), "make_mesh")


def _check_count(name: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"make_mesh: {name} must be a positive int, got {value!r}.")


def _check_proxies_on(value: object) -> None:
    if not isinstance(value, str) or value not in PROXIES_ON:
        raise ValueError(
            f"make_mesh: proxies_on must be 'devices' (each proxy a jax device) or 'host' (the "
            f"proxies in host memory; the mesh holds the workers only), got {value!r}."
        )


def _check_ratio(workers: int, q: int) -> None:
    if q > workers or workers % q:
        divisors = [d for d in range(1, workers + 1) if workers % d == 0]
        raise ValueError(
            f"make_mesh: proxies must divide workers: each proxy serves an equal group of "
            f"workers (COARSE k:1, k = workers / proxies); got workers={workers}, "
            f"proxies={q}. Fix: proxies in {divisors}."
        )


def _resolve_counts(
    workers: int | None, proxies: int | None, n: int, exact: bool
) -> tuple[int, int]:
    """(p, q) from the arguments and ``n`` devices; ``exact``: they must use all n."""
    if workers is None and proxies is None and exact and n % 2:
        raise ValueError(
            f"make_mesh: devices must hold an even number of devices (the workers, then as "
            f"many proxies), got {n}. For fewer proxies than workers pass proxies=q "
            "(COARSE k:1): the p workers, then the q proxies."
        )
    if workers is None:
        # As many workers as the devices leave room for: at 1:1 half of them
        # (an odd one left over), at k:1 the largest multiple of q beside the
        # q proxies (devices= must use every device, so there n - q).
        if proxies is None:
            workers = n // 2
        else:
            workers = n - proxies if exact else (n - proxies) // proxies * proxies
        if workers < 1:
            need = 2 if proxies is None else 2 * proxies
            raise ValueError(
                f"make_mesh: need at least {need} devices ({need // 2} worker(s) + "
                f"{need // 2} prox{'y' if need == 2 else 'ies'}), found {n}. On CPU set "
                "XLA_FLAGS=--xla_force_host_platform_device_count=8 before importing jax."
            )
    q = workers if proxies is None else proxies
    _check_ratio(workers, q)
    if exact and n != workers + q:
        raise ValueError(
            f"make_mesh: workers={workers}, proxies={q} needs exactly {workers + q} devices "
            f"(the workers, then the proxies), got {n}."
        )
    return workers, q


def _make_host_memory_proxy_mesh(
    workers: int | None, proxies: int | None, devices: Sequence[jax.Device] | None
) -> Mesh:
    """``proxies_on="host"``: the p workers' mesh (per process its first p devices)."""
    across = devices is None and jax.process_count() > 1
    pools = (
        _devices_by_process() if across else [list(jax.devices() if devices is None else devices)]
    )
    if len(set(pools[0])) != len(pools[0]):
        raise ValueError(
            "make_mesh: devices must be distinct (with proxies_on='host' they are the p "
            "workers, each its own device); got a device twice."
        )
    exact, n = devices is not None, min(len(pool) for pool in pools)
    if workers is None:  # all (at least q) devices; a multiple of q
        workers = n if proxies is None or exact else max(1, n // proxies) * proxies
    q = workers if proxies is None else proxies
    _check_ratio(workers, q)
    if exact and n != workers:
        raise ValueError(
            f"make_mesh: with proxies_on='host', devices are the workers only: workers="
            f"{workers} needs exactly {workers} devices, got {n}."
        )
    if n < workers:
        raise ValueError(
            f"make_mesh: workers={workers} needs {workers} devices{' per process' * across} "
            f"(proxies_on='host': the proxies take none), only {n} available. On CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={workers} before importing jax."
        )
    rows = [np.array(pool[:workers], dtype=object).reshape(1, workers) for pool in pools]
    mesh = Mesh(np.stack(rows), HOST_AXES) if across else Mesh(rows[0], AXES)
    return register(mesh, Proxies("host", q, workers), "make_mesh", depth=2)


def _devices_by_process() -> list[list[jax.Device]]:
    by_process: list[list[jax.Device]] = [[] for _ in range(jax.process_count())]
    for d in sorted(jax.devices(), key=lambda d: (d.process_index, d.id)):
        by_process[d.process_index].append(d)
    return by_process


def _make_mesh_across_hosts(workers: int | None, proxies: int | None) -> Mesh:
    """``("host", "tier", "data")``: per process its workers; their proxies recorded beside."""
    by_process = _devices_by_process()
    fewest = min(len(devs) for devs in by_process)
    p, q = _resolve_counts(workers, proxies, fewest, exact=False)
    if fewest < p + q:
        raise ValueError(
            f"make_mesh: workers={p}, proxies={q} per process needs {p + q} devices on every "
            f"process, the smallest process has {fewest}. On CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={p + q} in every process."
        )
    rows = np.stack([np.array(devs[:p], dtype=object).reshape(1, p) for devs in by_process])
    proxies_rec = Proxies("devices", q, p, tuple(tuple(devs[p : p + q]) for devs in by_process))
    return register(Mesh(rows, HOST_AXES), proxies_rec, "make_mesh", depth=2)
