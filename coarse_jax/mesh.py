"""The two-tier mesh: workers on tier 0, their proxies on tier 1."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

TIER = "tier"
DATA = "data"
AXES = (TIER, DATA)


def make_mesh(workers: int | None = None, *, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Builds the ``("tier", "data")`` mesh of ``workers`` workers and as many proxies.

    Worker ``i`` is ``mesh.devices[0, i]``, its local proxy ``mesh.devices[1, i]``.
    Without ``devices`` the first ``2 * workers`` devices of the default backend
    are paired by index: worker i with device ``workers + i``. (Topology-aware
    pairing comes with the profiler.) Pass ``devices`` (workers first, then
    proxies) to choose the pairing yourself.

    Args:
      workers: number of workers p; default: half of the given or available devices.
      devices: the 2p devices to use.

    Returns:
      A ``jax.sharding.Mesh`` of shape ``(2, p)``.

    Raises:
      ValueError: the device count is odd, too small, or does not match ``workers``.

    Example:
      >>> mesh = coarse.make_mesh(workers=4)   # 8 devices
    """
    pool = list(jax.devices()) if devices is None else list(devices)
    if devices is not None and len(pool) % 2:
        raise ValueError(
            f"make_mesh: devices must hold an even number of devices (workers, then their "
            f"proxies), got {len(pool)}."
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


def check_mesh(mesh: object, where: str) -> Mesh:
    """Raises a clear error unless ``mesh`` is a coarse two-tier mesh."""
    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"{where}: mesh must be a jax.sharding.Mesh from coarse.make_mesh(), got "
            f"{type(mesh).__name__}."
        )
    if tuple(mesh.axis_names) != AXES or mesh.devices.shape[0] != 2:
        raise ValueError(
            f"{where}: mesh must have axes ('tier', 'data') with tier of size 2 (workers, "
            f"proxies), got axes {tuple(mesh.axis_names)} of shape {mesh.devices.shape}. "
            "Build it with coarse.make_mesh(workers=p)."
        )
    return mesh
