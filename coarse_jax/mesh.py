"""The two-tier mesh: workers on tier 0, their proxies on tier 1; one more axis across hosts.

At COARSE k:1 (``make_mesh(workers=p, proxies=q)``) the tier-1 row repeats
each of the q proxies under the k = p / q workers it serves.

On one process the mesh is ``("tier", "data")``. After
``jax.distributed.initialize`` with several processes it is
``("host", "tier", "data")``: each process (host) holds its own workers and
proxies, and the runtime works within a host; only XLA collectives over
"host" cross hosts (`coarse_jax.api._hosts`).

With ``make_mesh(..., proxies_on="host")`` the proxies are host memory, not
jax devices, and the mesh holds the workers only: ``("tier", "data",
"proxies_on_host=q")`` of shape ``(1, p, 1)``, whose last axis records q in
its name (`host_proxies_axis`; `make_mesh` says why there).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

HOST = "host"
TIER = "tier"
DATA = "data"
AXES = (TIER, DATA)
HOST_AXES = (HOST, TIER, DATA)
# The step's program spans the workers only: its mesh is the public mesh's
# tier-0 row, same axes, so "tier" is bound inside a step (size 1, index 0)
# and code written for the public mesh reads the same there. A worker's
# value varies over these axes: "data" (and "host" across hosts), never "tier".
PROGRAM_AXES = (DATA,)
PROGRAM_HOST_AXES = (HOST, DATA)
# Where the proxies live (make_mesh's proxies_on): jax devices on tier 1
# (the default), or host memory beside the workers.
PROXIES_ON = ("devices", "host")
# A host-proxy mesh's last axis (size 1) is named HOST_PROXIES + "=q".
HOST_PROXIES = "proxies_on_host"


def host_proxies_axis(proxies: int) -> str:
    """The name of a host-proxy mesh's last axis, which records q: ``"proxies_on_host=q"``.

    Example:
      >>> from coarse_jax.mesh import host_proxies_axis
      >>> host_proxies_axis(2)
      'proxies_on_host=2'
    """
    return f"{HOST_PROXIES}={proxies}"


def _host_proxies_in(names: Sequence[object]) -> int | None:
    """q from a host-proxy mesh's axis names (their last), else None."""
    head, _, q = str(names[-1]).partition("=") if names else ("", "", "")
    return int(q) if head == HOST_PROXIES and q.isdigit() and int(q) > 0 else None


def proxies_on(mesh: Mesh) -> str:
    """Where ``mesh``'s proxies live: ``"devices"`` (tier 1 of the mesh) or ``"host"``.

    Example:
      >>> from coarse_jax.mesh import proxies_on
      >>> proxies_on(coarse.make_mesh(workers=4))
      'devices'
      >>> proxies_on(coarse.make_mesh(workers=8, proxies=2, proxies_on="host"))
      'host'
    """
    return "host" if _host_proxies_in(mesh.axis_names) is not None else "devices"


def _two_tier(mesh: Mesh) -> np.ndarray:
    """``mesh``'s devices as ``(tier, data)`` (``(host, tier, data)``): a host-proxy mesh
    without its last axis of size 1."""
    devices = np.asarray(mesh.devices)
    return devices[..., 0] if proxies_on(mesh) == "host" else devices


def traced_axes() -> tuple[str, ...]:
    """The axes of the step's ``shard_map`` being traced: ``PROGRAM_HOST_AXES`` across hosts,
    else ``PROGRAM_AXES``."""
    names = jax.sharding.get_abstract_mesh().axis_names
    return PROGRAM_HOST_AXES if HOST in names else PROGRAM_AXES


def workers_mesh(mesh: Mesh) -> Mesh:
    """The mesh of the step's program: ``mesh``'s workers (tier 0), with ``mesh``'s axes.

    The proxies (tier 1) run no XLA program: their work is the runtime's
    service, driven by the workers' custom calls. The workers' mesh keeps the
    public mesh's axis names, with "tier" of size 1: ``(1, p)`` on
    ``("tier", "data")``, ``(hosts, 1, p)`` across hosts. So inside a step
    ``lax.axis_index("tier")`` is 0, ``lax.psum(x, "tier")`` is ``x`` and
    ``lax.pmax(x, ("tier", "data"))`` reduces over the workers, as they read
    on the public mesh's workers; ``P("data")`` splits over the workers. A
    host-proxy mesh's workers' mesh drops its last axis (which only records
    q): the same program as with device proxies.

    Example:
      >>> from coarse_jax.mesh import workers_mesh
      >>> dict(workers_mesh(coarse.make_mesh(workers=4)).shape)
      {'tier': 1, 'data': 4}
    """
    devices = _two_tier(mesh)
    if has_hosts(mesh):
        return Mesh(devices[:, :1, :], HOST_AXES)
    return Mesh(devices[:1], AXES)


def has_hosts(mesh: Mesh) -> bool:
    """Whether ``mesh`` spans hosts (has the "host" axis)."""
    return HOST in mesh.axis_names


def batch_axes(mesh: Mesh) -> str | tuple[str, str]:
    """The axes a batch's leading axis is split over: "data", or ("host", "data")."""
    return (HOST, DATA) if has_hosts(mesh) else DATA


def local_mesh(mesh: Mesh) -> Mesh:
    """This process's part of ``mesh`` without the "host" axis (the mesh itself on one host)."""
    if not has_hosts(mesh):
        return mesh
    rows = [h for h in range(mesh.devices.shape[0]) if _is_local(mesh.devices[h])]
    if len(rows) != 1:
        raise ValueError(
            f"coarse mesh: process {jax.process_index()} must own exactly one row of the "
            f"'host' axis, owns {len(rows)} of {mesh.devices.shape[0]}. Build the mesh with "
            "coarse.make_mesh(workers=p_local) after jax.distributed.initialize."
        )
    return Mesh(mesh.devices[rows[0]], tuple(mesh.axis_names)[1:])


def _is_local(devices: np.ndarray) -> bool:
    me = jax.process_index()
    owners = {d.process_index for d in devices.flat}
    if owners == {me}:
        return True
    if me in owners:
        raise ValueError(
            f"coarse mesh: a row of the 'host' axis mixes processes {sorted(owners)}; each row "
            "must hold one process's devices (its workers, then its proxies)."
        )
    return False


def make_mesh(
    workers: int | None = None,
    proxies: int | None = None,
    *,
    devices: Sequence[jax.Device] | None = None,
    proxies_on: str = "devices",
) -> Mesh:
    """Builds the ``("tier", "data")`` mesh of ``workers`` workers and ``proxies`` proxies.

    The mesh has shape ``(2, p)``: worker ``i`` is ``mesh.devices[0, i]`` and
    ``mesh.devices[1, i]`` is its *local* proxy. With ``proxies=p`` (the
    default, COARSE 1:1) every worker has a proxy of its own. With ``q``
    proxies, ``q`` dividing ``p`` (the paper's COARSE k:1, k = p / q), proxy
    ``j`` serves the group of workers ``j*k .. j*k + k - 1`` and the tier-1
    row lists it once per worker of its group, so the proxies stay on their
    own axis and every column still pairs a worker with its local proxy::

        make_mesh(workers=4, proxies=2)   ->   tier 0: W0 W1 W2 W3
                                               tier 1: P0 P0 P1 P1

    Routes (``Config.routes``) name proxies by their number ``0..q-1``. The
    step's program spans the workers only: a device listed twice costs
    nothing, but jax refuses ``jax.device_put(x, NamedSharding(mesh,
    P("data")))`` on such a mesh. Pass host arrays (`coarse.sync` splits the
    batch) or use ``NamedSharding(coarse_jax.mesh.workers_mesh(mesh), P("data"))``.

    **Proxies in host memory** (``proxies_on="host"``): the q proxies are
    the runtime's host memory and CPU threads, not jax devices, so every
    device can be a worker. The mesh holds the p workers only: ``("tier",
    "data", "proxies_on_host=q")`` of shape ``(1, p, 1)``, read by
    ``P("data")`` and every coarse call as a two-tier mesh is. Its last axis
    records q in its name because jax keeps one ``Mesh`` object per devices
    and axis names (subclasses included): a plain ``("tier", "data")`` mesh
    of the workers would be the object `workers_mesh` makes of a
    device-proxy mesh, and the host meshes of one set of workers at every q
    one object. Across processes it is ``("host", "tier", "data",
    "proxies_on_host=q")``, each process's first p devices its workers. Host
    proxies take CPU or GPU workers (with GPUs they have run on one GPU only:
    docs/guides/host_proxies.md).

    With several processes (after ``jax.distributed.initialize``) and no
    ``devices``, the mesh is ``("host", "tier", "data")`` of shape
    ``(process_count, 2, workers)``: ``workers`` and ``proxies`` are then per
    process, and each process's first ``workers + proxies`` local devices are
    its workers, then its proxies. Batches are split over ``("host", "data")``.

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
        proxy a jax device, on the mesh's tier 1) or ``"host"`` (host memory
        beside the workers; the mesh holds the workers only).

    Returns:
      A ``jax.sharding.Mesh`` of shape ``(2, p)`` with axes ``("tier", "data")``
      (``(process_count, 2, p)`` with axes ``("host", "tier", "data")`` across
      processes); with ``proxies_on="host"`` of shape ``(1, p, 1)`` with axes
      ``("tier", "data", "proxies_on_host=q")``.

    Raises:
      ValueError: ``proxies`` does not divide ``workers``, the devices are
        too few, repeated, or do not match ``workers + proxies``, or
        ``proxies_on`` is neither ``"devices"`` nor ``"host"``.

    Example:
      >>> mesh = coarse.make_mesh(workers=4)   # 8 devices
      >>> mesh.axis_names, mesh.devices.shape
      (('tier', 'data'), (2, 4))
      >>> [d.id for d in mesh.devices[:, 1]]   # worker 1 and its local proxy
      [1, 5]
      >>> shared = coarse.make_mesh(workers=4, proxies=2)   # 6 devices, COARSE(2:1)
      >>> [[d.id for d in row] for row in shared.devices]
      [[0, 1, 2, 3], [4, 4, 5, 5]]
      >>> coarse.make_mesh(devices=jax.devices()[:4]).devices.shape   # 2 workers
      (2, 2)
      >>> on_host = coarse.make_mesh(workers=8, proxies=2, proxies_on="host")   # 8 devices
      >>> dict(on_host.shape)
      {'tier': 1, 'data': 8, 'proxies_on_host=2': 1}
    """
    _check_count("workers", workers)
    _check_count("proxies", proxies)
    _check_proxies_on(proxies_on)
    if proxies_on == "host":
        return _make_host_proxy_mesh(workers, proxies, devices)
    if devices is None and jax.process_count() > 1:
        return _make_host_mesh(workers, proxies)
    pool = list(jax.devices()) if devices is None else list(devices)
    if devices is not None and len(set(pool)) != len(pool):
        raise ValueError(
            "make_mesh: devices must be distinct (a worker and a proxy each need a device of "
            "their own; a shared proxy is listed once and the mesh repeats it); got a device "
            "twice. Tests that let a proxy share its worker's device use "
            "coarse_jax.testing.shared_device_mesh."
        )
    p, q = _resolve_counts(workers, proxies, len(pool), exact=devices is not None)
    if len(pool) < p + q:
        raise ValueError(
            f"make_mesh: workers={p}, proxies={q} needs {p + q} devices, only {len(pool)} "
            f"available. Use fewer workers or proxies, or on CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={p + q} before importing jax."
        )
    return Mesh(_grid(pool[:p], pool[p : p + q]), AXES)


def _check_count(name: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"make_mesh: {name} must be a positive int, got {value!r}.")


def _check_proxies_on(value: object) -> None:
    if not isinstance(value, str) or value not in PROXIES_ON:
        raise ValueError(
            f"make_mesh: proxies_on must be 'devices' (each proxy a jax device, on the mesh's "
            f"tier 1) or 'host' (the proxies in host memory; the mesh holds the workers only), "
            f"got {value!r}."
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


def _make_host_proxy_mesh(
    workers: int | None, proxies: int | None, devices: Sequence[jax.Device] | None
) -> Mesh:
    """``proxies_on="host"``: ``("tier", "data", "proxies_on_host=q")`` of the p workers only
    (``("host", ...)`` first across processes: per process its first p devices)."""
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
    grids = [np.array(pool[:workers], dtype=object).reshape(1, workers, 1) for pool in pools]
    if across:
        return Mesh(np.stack(grids), (*HOST_AXES, host_proxies_axis(q)))
    return Mesh(grids[0], (*AXES, host_proxies_axis(q)))


def local_proxy(worker: int, workers: int, proxies: int) -> int:
    """Worker ``worker``'s local proxy: ``worker // k``, k = workers / proxies.

    Proxy j serves the group of workers ``j*k .. j*k + k - 1`` (COARSE k:1;
    at 1:1 worker i's local proxy is proxy i). The one rule the mesh, the
    default routes, the emulated presets and the profile all follow (and the
    runtime's ``Plan::led_proxy``).
    """
    return worker // (workers // proxies)


def _grid(workers: Sequence[jax.Device], proxies: Sequence[jax.Device]) -> np.ndarray:
    """The (2, p) grid: the workers, and under each its local proxy."""
    p, q = len(workers), len(proxies)
    row = [proxies[local_proxy(i, p, q)] for i in range(p)]
    return np.array([list(workers), row], dtype=object)


def _distinct_in_order(row: Sequence[jax.Device]) -> list[jax.Device]:
    """``row`` with each run of one device kept once (P0 P0 P1 P1 -> P0 P1)."""
    return [d for i, d in enumerate(row) if i == 0 or row[i - 1] != d]


def _devices_by_process() -> list[list[jax.Device]]:
    by_process: list[list[jax.Device]] = [[] for _ in range(jax.process_count())]
    for d in sorted(jax.devices(), key=lambda d: (d.process_index, d.id)):
        by_process[d.process_index].append(d)
    return by_process


def _make_host_mesh(workers: int | None, proxies: int | None) -> Mesh:
    """``("host", "tier", "data")``: per process its workers, then their proxies."""
    by_process = _devices_by_process()
    fewest = min(len(devs) for devs in by_process)
    p, q = _resolve_counts(workers, proxies, fewest, exact=False)
    if fewest < p + q:
        raise ValueError(
            f"make_mesh: workers={p}, proxies={q} per process needs {p + q} devices on every "
            f"process, the smallest process has {fewest}. On CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={p + q} in every process."
        )
    grids = [_grid(devs[:p], devs[p : p + q]) for devs in by_process]
    return Mesh(np.stack(grids), HOST_AXES)


def proxy_devices(mesh: Mesh) -> list[jax.Device]:
    """The q distinct proxies of ``mesh`` (one host's mesh), in order; none on a host-proxy
    mesh (its proxies are host memory, `proxies_on`).

    Proxy j is ``mesh.devices[1, j * k]`` (k = p / q): the tier-1 row repeats
    each proxy once per worker of its group (`make_mesh`).
    """
    if proxies_on(mesh) == "host":
        return []
    return _distinct_in_order(list(np.asarray(mesh.devices)[1]))


def num_proxies(mesh: Mesh) -> int:
    """q: the number of distinct proxies per host of a coarse mesh (devices or host memory)."""
    on_host = _host_proxies_in(mesh.axis_names)
    if on_host is not None:
        return on_host
    return len(proxy_devices(local_mesh(mesh)))


def _check_proxy_row(devices: np.ndarray, where: str) -> None:
    """Raises unless the tier-1 row lists q distinct proxies, each k = p/q times in a run."""
    row = list(devices[1])
    p = len(row)
    runs = _distinct_in_order(row)
    q = len(runs)
    ok = len(set(runs)) == q and p % q == 0
    ok = ok and all(row[i] == runs[local_proxy(i, p, q)] for i in range(p))
    if not ok:
        raise ValueError(
            f"{where}: the mesh's proxy row (tier 1) must list q distinct proxies, each once per "
            f"worker of its group (q dividing p, proxy j under workers j*k .. j*k + k - 1), got "
            f"{[getattr(d, 'id', d) for d in row]}. Build it with "
            "coarse.make_mesh(workers=p, proxies=q)."
        )


def _check_host_proxy_mesh(mesh: Mesh, q: int, where: str) -> None:
    """Raises unless ``mesh`` is ``("tier", "data", "proxies_on_host=q")`` of shape ``(1, p, 1)``
    (with "host" first across processes), q dividing p."""
    base = tuple(mesh.axis_names)[:-1]
    ok = base in (AXES, HOST_AXES) and mesh.shape[TIER] == 1 and mesh.devices.shape[-1] == 1
    if not ok:
        raise ValueError(
            f"{where}: a mesh with proxies in host memory must have axes ('tier', 'data', "
            f"'{host_proxies_axis(q)}') of shape (1, p, 1), got axes {tuple(mesh.axis_names)} "
            f"of shape {mesh.devices.shape}. Build it with "
            f"coarse.make_mesh(workers=p, proxies={q}, proxies_on='host')."
        )
    if has_hosts(mesh):
        local_mesh(mesh)  # each process owns one row
    p = int(mesh.shape[DATA])
    if p % q:
        raise ValueError(
            f"{where}: the mesh's proxies in host memory ({q}) must divide its workers ({p}). "
            f"Build it with coarse.make_mesh(workers={p}, proxies=q, proxies_on='host'), q "
            f"in {[d for d in range(1, p + 1) if p % d == 0]}."
        )


def check_mesh(mesh: object, where: str) -> Mesh:
    """Raises a clear error unless ``mesh`` is a coarse mesh: two tiers of devices (one host or
    several), or the workers with their proxies in host memory (`make_mesh`)."""
    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"{where}: mesh must be a jax.sharding.Mesh from coarse.make_mesh(), got "
            f"{type(mesh).__name__}."
        )
    on_host = _host_proxies_in(mesh.axis_names)
    if on_host is not None:
        _check_host_proxy_mesh(mesh, on_host, where)
        return mesh
    names = tuple(mesh.axis_names)
    if names not in (AXES, HOST_AXES) or mesh.shape[TIER] != 2:
        raise ValueError(
            f"{where}: mesh must have axes ('tier', 'data') with tier of size 2 (workers, "
            f"proxies), or ('host', 'tier', 'data') across processes, got axes "
            f"{tuple(mesh.axis_names)} of shape {mesh.devices.shape}. "
            "Build it with coarse.make_mesh(workers=p), or for proxies in host memory (a mesh "
            "of the workers only) coarse.make_mesh(workers=p, proxies=q, proxies_on='host')."
        )
    if names == HOST_AXES:
        _check_proxy_row(np.asarray(local_mesh(mesh).devices), where)  # one row per process
    else:
        _check_proxy_row(np.asarray(mesh.devices), where)
    return mesh
