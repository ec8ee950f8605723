"""The two-tier mesh: workers on tier 0, their proxies on tier 1; one more axis across hosts.

On one process the mesh is ``("tier", "data")``. After
``jax.distributed.initialize`` with several processes it is
``("host", "tier", "data")``: each process (host) holds its own workers and
proxies, and the runtime works within a host; only XLA collectives over
"host" cross hosts (`coarse_jax.api._hosts`).
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
# The step's program spans the workers only (the proxies are a runtime
# service, DESIGN.md section 12): its axes are the public mesh's without "tier".
PROGRAM_AXES = (DATA,)
PROGRAM_HOST_AXES = (HOST, DATA)


def traced_axes() -> tuple[str, ...]:
    """The axes of the step's ``shard_map`` being traced: ``PROGRAM_HOST_AXES`` across hosts,
    else ``PROGRAM_AXES``."""
    names = jax.sharding.get_abstract_mesh().axis_names
    return PROGRAM_HOST_AXES if HOST in names else PROGRAM_AXES


def workers_mesh(mesh: Mesh) -> Mesh:
    """The mesh of the step's program: ``mesh``'s workers (tier 0), without the "tier" axis.

    The proxies (tier 1) run no XLA program: their work is the runtime's
    service, driven by the workers' custom calls.
    """
    if has_hosts(mesh):
        return Mesh(mesh.devices[:, 0, :], PROGRAM_HOST_AXES)
    return Mesh(mesh.devices[0], PROGRAM_AXES)


def has_hosts(mesh: Mesh) -> bool:
    """Whether ``mesh`` spans hosts (has the "host" axis)."""
    return HOST in mesh.axis_names


def batch_axes(mesh: Mesh) -> str | tuple[str, str]:
    """The axes a batch's leading axis is split over: "data", or ("host", "data")."""
    return (HOST, DATA) if has_hosts(mesh) else DATA


def local_mesh(mesh: Mesh) -> Mesh:
    """This process's ``("tier", "data")`` part of ``mesh`` (the mesh itself on one host)."""
    if not has_hosts(mesh):
        return mesh
    rows = [h for h in range(mesh.devices.shape[0]) if _is_local(mesh.devices[h])]
    if len(rows) != 1:
        raise ValueError(
            f"coarse mesh: process {jax.process_index()} must own exactly one row of the "
            f"'host' axis, owns {len(rows)} of {mesh.devices.shape[0]}. Build the mesh with "
            "coarse.make_mesh(workers=p_local) after jax.distributed.initialize."
        )
    return Mesh(mesh.devices[rows[0]], AXES)


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


def make_mesh(workers: int | None = None, *, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Builds the ``("tier", "data")`` mesh of ``workers`` workers and as many proxies.

    With several processes (after ``jax.distributed.initialize``) and no
    ``devices``, the mesh is ``("host", "tier", "data")`` of shape
    ``(process_count, 2, workers)``: ``workers`` is then per process (p_local),
    and each process's first ``2 * workers`` local devices are its workers
    and proxies, paired by index as below. Batches are split over
    ``("host", "data")``.

    Worker ``i`` is ``mesh.devices[0, i]``, its local proxy ``mesh.devices[1, i]``.
    Without ``devices`` the first ``2 * workers`` devices of the default backend
    are paired by index: worker i with device ``workers + i``; the mesh does
    not read the machine's topology. Pass ``devices`` (workers first, then
    proxies) to choose the pairing yourself.

    Args:
      workers: number of workers p; default: half of the given or available devices.
      devices: the 2p devices to use.

    Returns:
      A ``jax.sharding.Mesh`` of shape ``(2, p)`` with axes ``("tier", "data")``
      (``(process_count, 2, p)`` with axes ``("host", "tier", "data")`` across
      processes).

    Raises:
      ValueError: the device count is odd, too small, or does not match ``workers``.

    Example:
      >>> mesh = coarse.make_mesh(workers=4)   # 8 devices
      >>> mesh.axis_names, mesh.devices.shape
      (('tier', 'data'), (2, 4))
      >>> [d.id for d in mesh.devices[:, 1]]   # worker 1 and its local proxy
      [1, 5]
      >>> coarse.make_mesh(devices=jax.devices()[:4]).devices.shape   # 2 workers
      (2, 2)
    """
    if devices is None and jax.process_count() > 1:
        return _make_host_mesh(workers)
    pool = list(jax.devices()) if devices is None else list(devices)
    if devices is not None and len(pool) % 2:
        raise ValueError(
            f"make_mesh: devices must hold an even number of devices (workers, then their "
            f"proxies), got {len(pool)}."
        )
    if devices is not None and len(set(pool)) != len(pool):
        raise ValueError(
            "make_mesh: devices must be distinct (a worker and a proxy each need a device of "
            "their own); got a device twice. Tests that let a proxy share its worker's device "
            "use coarse_jax.testing.shared_device_mesh."
        )
    if workers is None:
        if len(pool) < 2:
            raise ValueError(
                f"make_mesh: need at least 2 devices (1 worker + 1 proxy), found {len(pool)}. On "
                "CPU set XLA_FLAGS=--xla_force_host_platform_device_count=8 before importing jax."
            )
        workers = len(pool) // 2
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"make_mesh: workers must be a positive int, got {workers!r}.")
    if devices is not None and len(pool) != 2 * workers:
        raise ValueError(
            f"make_mesh: workers={workers} needs exactly {2 * workers} devices, got {len(pool)}."
        )
    if len(pool) < 2 * workers:
        raise ValueError(
            f"make_mesh: workers={workers} needs {2 * workers} devices (a proxy per worker), only "
            f"{len(pool)} available. Use fewer workers, or on CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={2 * workers} before importing jax."
        )
    grid = np.array(pool[: 2 * workers], dtype=object).reshape(2, workers)
    return Mesh(grid, AXES)


def _make_host_mesh(workers: int | None) -> Mesh:
    """``("host", "tier", "data")``: per process its workers, then their proxies."""
    hosts = jax.process_count()
    by_process: list[list[jax.Device]] = [[] for _ in range(hosts)]
    for d in sorted(jax.devices(), key=lambda d: (d.process_index, d.id)):
        by_process[d.process_index].append(d)
    fewest = min(len(devs) for devs in by_process)
    if workers is None:
        workers = fewest // 2
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(
            f"make_mesh: workers must be a positive int (workers per process), got {workers!r}; "
            f"the smallest process has {fewest} devices."
        )
    if fewest < 2 * workers:
        raise ValueError(
            f"make_mesh: workers={workers} per process needs {2 * workers} devices on every "
            f"process (a proxy per worker), the smallest process has {fewest}. On CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={2 * workers} in every process."
        )
    grid = np.array([devs[: 2 * workers] for devs in by_process], dtype=object)
    return Mesh(grid.reshape(hosts, 2, workers), HOST_AXES)


def check_mesh(mesh: object, where: str) -> Mesh:
    """Raises a clear error unless ``mesh`` is a coarse two-tier mesh (one host or several)."""
    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"{where}: mesh must be a jax.sharding.Mesh from coarse.make_mesh(), got "
            f"{type(mesh).__name__}."
        )
    names = tuple(mesh.axis_names)
    if names not in (AXES, HOST_AXES) or mesh.shape[TIER] != 2:
        raise ValueError(
            f"{where}: mesh must have axes ('tier', 'data') with tier of size 2 (workers, "
            f"proxies), or ('host', 'tier', 'data') across processes, got axes "
            f"{tuple(mesh.axis_names)} of shape {mesh.devices.shape}. "
            "Build it with coarse.make_mesh(workers=p)."
        )
    if names == HOST_AXES:
        local_mesh(mesh)  # one row per process
    return mesh
