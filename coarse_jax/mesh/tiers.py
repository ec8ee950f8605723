"""The coarse mesh's model: the workers' mesh and its `Proxies`, the record of them kept beside
it, and the queries every reader of a mesh uses (`coarse_jax.mesh` says why)."""

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

    A record of places, not of state: what the proxies hold for a step (its
    stores, snapshots) has one holder, the step's
    `coarse_jax.api.proxy_state.ProxyState`.

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


def register(workers: Mesh, proxies: Proxies, where: str, depth: int = 1) -> Mesh:
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
    itself on one host): what ``coarse.diagnostics.profile`` times across hosts."""
    tiers = local_tiers(mesh)
    if tiers.workers is workers_mesh(mesh):
        return tiers.workers
    return register(tiers.workers, tiers.proxies, "coarse_jax.mesh.local_mesh")


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
