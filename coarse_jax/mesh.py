"""The coarse mesh: the workers, which users place arrays on, and a record of their proxies.

``coarse.make_mesh(workers=p)`` returns a jax ``Mesh`` of the p workers with
axes ``("tier", "data")`` of shape ``(1, p)`` (``("host", "tier", "data")``
across processes). It is the mesh jax's and flax's sharding guides expect:
``NamedSharding(mesh, P())`` replicates over the workers and
``NamedSharding(mesh, P("data"))`` splits a batch over them, with no copy on a
proxy. "tier" (size 1) stays nameable: inside a step ``lax.axis_index("tier")``
is 0 and ``lax.psum(x, "tier")`` is ``x``.

The proxies run no XLA program (their part of a step is the runtime's
service), so they need no place in a jax mesh. Where they are (jax devices,
or host memory), how many (q), and which workers each serves is a `Proxies`
record that `make_mesh` keeps beside the mesh it returns (`proxies_of`); the
same for device and host proxies. Whoever wants the full two-tier device
mesh, proxies on tier 1, asks for it: `two_tier_mesh`. `coarse.sync` still
takes such a mesh (and code written for it, with state placed on both tiers,
still runs; its outputs then follow onto both tiers, `coarse.sync` says at
what cost).

jax keeps one ``Mesh`` object per devices and axis names, so one set of
workers has one record at a time: a later `make_mesh` of the same workers
with other proxies replaces it, and warns (`ProxiesReplaced`). A step keeps
the proxies it was decorated with (`Tiers`, fixed by `check_mesh`).
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

HOST = "host"
TIER = "tier"
DATA = "data"
AXES = (TIER, DATA)
HOST_AXES = (HOST, TIER, DATA)
# The step's program spans the workers: the mesh `make_mesh` returns, "tier"
# of size 1 in it. A worker's value varies over these axes: "data" (and
# "host" across hosts), never "tier".
PROGRAM_AXES = (DATA,)
PROGRAM_HOST_AXES = (HOST, DATA)
# Where the proxies live (make_mesh's proxies_on): jax devices (the default),
# or host memory beside the workers.
PROXIES_ON = ("devices", "host")


class ProxiesReplaced(UserWarning):
    """`make_mesh` gave a set of workers other proxies than it had: the mesh objects are one."""


class LegacyPlacement(UserWarning):
    """A step decorated with a two-tier mesh got state placed on that whole mesh: its outputs
    follow there, a copy per call on every proxy's device (`coarse.sync` measures it once)."""


@dataclasses.dataclass(frozen=True)
class Proxies:
    """A coarse mesh's proxies: where they live, how many, and which workers each serves.

    Attributes:
      on: ``"devices"`` (each proxy a jax device) or ``"host"`` (host memory
        and CPU threads beside the workers).
      count: q, the proxies per host; q divides the workers per host p, and
        proxy j serves the group of workers ``j*k .. j*k + k - 1`` (k = p / q,
        COARSE k:1; `local_proxy`).
      devices: per host (one row per process across hosts), proxy j's jax
        device; empty rows with proxies in host memory.

    Example:
      >>> from coarse_jax.mesh import proxies_of
      >>> proxies = proxies_of(coarse.make_mesh(workers=4, proxies=2))
      >>> proxies.on, proxies.count, [d.id for d in proxies.devices[0]]
      ('devices', 2, [4, 5])
      >>> proxies.serves(1)
      (2, 3)
      >>> proxies_of(coarse.make_mesh(workers=8, proxies=2, proxies_on="host"))
      Proxies(on='host', count=2, workers=8)
    """

    on: str
    count: int
    workers: int  # p per host
    devices: tuple[tuple[jax.Device, ...], ...] = ()

    def serves(self, proxy: int) -> tuple[int, ...]:
        """The workers (of each host) proxy ``proxy`` serves, its local pair first."""
        k = self.workers // self.count
        return tuple(range(proxy * k, proxy * k + k))

    def __repr__(self) -> str:
        ids = [[getattr(d, "id", d) for d in row] for row in self.devices]
        where = f", devices={ids}" if self.on == "devices" else ""
        return f"Proxies(on={self.on!r}, count={self.count}, workers={self.workers}{where})"

    def describe(self) -> str:
        """How messages name them: "2 proxies on devices [[4, 5]]", "2 proxies in host memory"."""
        many = f"{self.count} prox{'y' if self.count == 1 else 'ies'}"
        if self.on == "host":
            return f"{many} in host memory"
        return f"{many} on devices {[[getattr(d, 'id', d) for d in r] for r in self.devices]}"


@dataclasses.dataclass(frozen=True)
class Tiers:
    """A step's two tiers, fixed when it is decorated (`check_mesh`): the workers' mesh and its
    proxies. Reads as its workers' mesh (``shape``, ``axis_names``, ``devices``)."""

    workers: Mesh
    proxies: Proxies

    @property
    def shape(self):  # type: ignore[no-untyped-def]
        return self.workers.shape

    @property
    def axis_names(self) -> tuple:
        return tuple(self.workers.axis_names)

    @property
    def devices(self) -> np.ndarray:
        return np.asarray(self.workers.devices)


MeshLike = Mesh | Tiers

_lock = threading.Lock()
_registry: dict[Mesh, Proxies] = {}  # make_mesh's workers' meshes (hashed by devices and names)


def _register(workers: Mesh, proxies: Proxies, where: str, depth: int = 1) -> Mesh:
    """Records ``proxies`` beside ``workers``; ``depth``: calls between the user's and this."""
    with _lock:
        old = _registry.get(workers)
        _registry[workers] = proxies
    if old is not None and old != proxies:
        warnings.warn(
            f"{where}: these {proxies.workers} workers now have {proxies.describe()}; they had "
            f"{old.describe()}. jax keeps one Mesh object per devices and axis names, so a "
            "mesh of these workers you got before is this one: steps decorated from now on "
            "use the new proxies (steps decorated before keep theirs). To run both, decorate "
            "each step right after its make_mesh.",
            ProxiesReplaced,
            stacklevel=2 + depth,
        )
    return workers


def proxies_of(mesh: MeshLike) -> Proxies:
    """The proxies of a coarse mesh: the record `make_mesh` keeps, or a two-tier mesh's tier 1.

    Raises:
      ValueError: ``mesh`` is no coarse mesh (`check_mesh` says what it needs).
    """
    return check_mesh(mesh, "coarse_jax.mesh.proxies_of").proxies


def traced_axes() -> tuple[str, ...]:
    """The axes of the step's ``shard_map`` being traced: ``PROGRAM_HOST_AXES`` across hosts,
    else ``PROGRAM_AXES``."""
    names = jax.sharding.get_abstract_mesh().axis_names
    return PROGRAM_HOST_AXES if HOST in names else PROGRAM_AXES


def workers_mesh(mesh: MeshLike) -> Mesh:
    """The mesh of the step's program and of the user's arrays: the workers.

    `make_mesh`'s mesh is itself; a two-tier mesh (`two_tier_mesh`) gives its
    tier-0 row, with the same axis names, "tier" of size 1: ``(1, p)`` on
    ``("tier", "data")``, ``(hosts, 1, p)`` across hosts.

    Example:
      >>> from coarse_jax.mesh import two_tier_mesh, workers_mesh
      >>> mesh = coarse.make_mesh(workers=4)
      >>> workers_mesh(mesh) is mesh, dict(workers_mesh(two_tier_mesh(mesh)).shape)
      (True, {'tier': 1, 'data': 4})
    """
    return check_mesh(mesh, "coarse_jax.mesh.workers_mesh").workers


def two_tier_mesh(mesh: MeshLike) -> Mesh:
    """The full two-tier device mesh: the workers on tier 0, under each its local proxy.

    Shape ``(2, p)`` on ``("tier", "data")`` (``(hosts, 2, p)`` across
    hosts). With q proxies (COARSE k:1) the tier-1 row lists proxy j once
    per worker of its group, so each column pairs a worker with its local
    proxy::

        two_tier_mesh(make_mesh(workers=4, proxies=2))   ->   tier 0: W0 W1 W2 W3
                                                              tier 1: P0 P0 P1 P1

    For whoever needs the proxies' devices in a mesh (jax runs no program on
    a mesh that lists a device twice). Arrays placed on it replicate onto
    every proxy's device: place the user's state on `make_mesh`'s mesh.

    Raises:
      ValueError: the proxies are in host memory (no jax devices).

    Example:
      >>> from coarse_jax.mesh import two_tier_mesh
      >>> full = two_tier_mesh(coarse.make_mesh(workers=4, proxies=2))
      >>> [[d.id for d in row] for row in full.devices]
      [[0, 1, 2, 3], [4, 4, 5, 5]]
    """
    tiers = check_mesh(mesh, "coarse_jax.mesh.two_tier_mesh")
    if tiers.proxies.on == "host":
        raise ValueError(
            "coarse_jax.mesh.two_tier_mesh: the mesh's proxies are in host memory, no jax "
            "devices: its mesh is the workers alone (the mesh itself)."
        )
    workers = np.asarray(tiers.workers.devices)
    if has_hosts(tiers):
        grids = [
            _grid(list(workers[h, 0]), list(tiers.proxies.devices[h]))
            for h in range(workers.shape[0])
        ]
        return Mesh(np.stack(grids), HOST_AXES)
    return Mesh(_grid(list(workers[0]), list(tiers.proxies.devices[0])), AXES)


def has_hosts(mesh: MeshLike) -> bool:
    """Whether ``mesh`` spans hosts (has the "host" axis)."""
    return HOST in mesh.axis_names


def batch_axes(mesh: MeshLike) -> str | tuple[str, str]:
    """The axes a batch's leading axis is split over: "data", or ("host", "data")."""
    return (HOST, DATA) if has_hosts(mesh) else DATA


def platform(mesh: MeshLike) -> str:
    """The workers' platform ("cpu", "gpu")."""
    return str(np.asarray(mesh.devices).flat[0].platform)


def _this_row(devices: np.ndarray) -> int:
    """The row of the "host" axis this process owns (checked: exactly one, unmixed)."""
    rows = [h for h in range(devices.shape[0]) if _is_local(devices[h])]
    if len(rows) != 1:
        raise ValueError(
            f"coarse mesh: process {jax.process_index()} must own exactly one row of the "
            f"'host' axis, owns {len(rows)} of {devices.shape[0]}. Build the mesh with "
            "coarse.make_mesh(workers=p_local) after jax.distributed.initialize."
        )
    return rows[0]


def local_tiers(mesh: MeshLike) -> Tiers:
    """This process's part of ``mesh``: its workers (``(1, p)`` on ``("tier", "data")``) and
    proxies. The tiers themselves on one host."""
    tiers = check_mesh(mesh, "coarse_jax.mesh.local_mesh")
    if not has_hosts(tiers):
        return tiers
    devices = np.asarray(tiers.workers.devices)
    row = _this_row(devices)
    proxies = dataclasses.replace(
        tiers.proxies, devices=tiers.proxies.devices[row : row + 1] if tiers.proxies.devices else ()
    )
    return Tiers(Mesh(devices[row], AXES), proxies)


def local_mesh(mesh: MeshLike) -> Mesh:
    """This process's workers, a coarse mesh of one host with this host's proxies (the mesh
    itself on one host): what ``coarse.profile`` times across hosts."""
    tiers = local_tiers(mesh)
    if tiers.workers is workers_mesh(mesh):
        return tiers.workers
    return _register(tiers.workers, tiers.proxies, "coarse_jax.mesh.local_mesh")


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
        return _make_host_proxy_mesh(workers, proxies, devices)
    if devices is None and jax.process_count() > 1:
        return _make_host_mesh(workers, proxies)
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
    return _register(mesh, Proxies("devices", q, p, (tuple(pool[p : p + q]),)), "make_mesh")


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


def _make_host_proxy_mesh(
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
    return _register(mesh, Proxies("host", q, workers), "make_mesh", depth=2)


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
    return _register(Mesh(rows, HOST_AXES), proxies_rec, "make_mesh", depth=2)


def proxy_devices(mesh: MeshLike) -> list[jax.Device]:
    """This process's q distinct proxy devices, in order; none with proxies in host memory."""
    return list(_one_row(local_tiers(mesh).proxies))


def _one_row(proxies: Proxies) -> tuple[jax.Device, ...]:
    return proxies.devices[0] if proxies.devices else ()


def num_proxies(mesh: MeshLike) -> int:
    """q: the number of proxies per host of a coarse mesh (devices or host memory)."""
    return check_mesh(mesh, "coarse_jax.mesh.num_proxies").proxies.count


def proxies_on(mesh: MeshLike) -> str:
    """Where ``mesh``'s proxies live: ``"devices"`` or ``"host"``.

    Example:
      >>> from coarse_jax.mesh import proxies_on
      >>> proxies_on(coarse.make_mesh(workers=4))
      'devices'
      >>> proxies_on(coarse.make_mesh(workers=8, proxies=2, proxies_on="host"))
      'host'
    """
    return check_mesh(mesh, "coarse_jax.mesh.proxies_on").proxies.on


def _proxy_row(devices: np.ndarray, where: str) -> tuple[jax.Device, ...]:
    """A two-tier grid's q distinct proxies; raises unless the tier-1 row lists each once per
    worker of its group, in a run."""
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
    return tuple(runs)


def _from_two_tier(mesh: Mesh, where: str) -> Tiers:
    """The tiers of an explicit two-tier mesh (`two_tier_mesh`, or one built by hand)."""
    devices = np.asarray(mesh.devices)
    if has_hosts(mesh):
        _this_row(devices)  # each process owns one row
        rows = tuple(_proxy_row(devices[h], where) for h in range(devices.shape[0]))
        workers = Mesh(devices[:, :1, :], HOST_AXES)
    else:
        rows = (_proxy_row(devices, where),)
        workers = Mesh(devices[:1], AXES)
    p = devices.shape[-1]
    return Tiers(workers, Proxies("devices", len(rows[0]), p, rows))


def check_mesh(mesh: object, where: str) -> Tiers:
    """The tiers of a coarse mesh, or a clear error naming ``where``.

    A coarse mesh is `make_mesh`'s workers' mesh (its proxies recorded
    beside it), a two-tier device mesh (`two_tier_mesh`, tier 1 the
    proxies), or `Tiers` themselves.
    """
    if isinstance(mesh, Tiers):
        return mesh
    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"{where}: mesh must be a jax.sharding.Mesh from coarse.make_mesh(), got "
            f"{type(mesh).__name__}."
        )
    names = tuple(mesh.axis_names)
    if names in (AXES, HOST_AXES) and mesh.shape[TIER] == 2:
        return _from_two_tier(mesh, where)
    with _lock:
        proxies = _registry.get(mesh)
    if proxies is not None:
        if has_hosts(mesh):
            _this_row(np.asarray(mesh.devices))
        return Tiers(mesh, proxies)
    if names in (AXES, HOST_AXES) and mesh.shape[TIER] == 1:
        raise ValueError(
            f"{where}: this mesh of {mesh.shape[DATA]} workers has no proxies on record: it was "
            "not made by coarse.make_mesh. Fix: mesh = coarse.make_mesh(workers=p, "
            "devices=[...the p workers, then the q proxies]) (or proxies_on='host')."
        )
    raise ValueError(
        f"{where}: mesh must be a coarse mesh, axes ('tier', 'data') (('host', 'tier', 'data') "
        f"across processes), got axes {names} of shape {np.asarray(mesh.devices).shape}. Build "
        "it with coarse.make_mesh(workers=p), or for proxies in host memory "
        "coarse.make_mesh(workers=p, proxies=q, proxies_on='host')."
    )
