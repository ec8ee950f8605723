"""Test-only helpers: not part of the public API (not in ``coarse.__all__``).

`shared_device_mesh` lets a proxy share a physical device with its worker,
so one device (a single lent GPU, say) can run the whole protocol at p = 1:
the workers' program through XLA, the proxy in the runtime's service
(ffi/runtime/service.h), on a stream of its own on a GPU. The proxy's
storage (its slots, the master parameters, the optimizer state) then takes
memory on the worker's device, so this mesh tests the protocol; it does not
give the memory a real proxy device gives. Results are bitwise those of a
mesh with separate proxy devices (tests/test_shared_device.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from coarse_jax.mesh import AXES

__all__ = ["shared_device_mesh"]


def shared_device_mesh(workers: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``("tier", "data")`` mesh whose proxy k is worker k's own device. Test only.

    Args:
      workers: number of workers p.
      devices: the p workers' devices; default: the first p of the default backend.

    Returns:
      A ``jax.sharding.Mesh`` of shape ``(2, p)``, its proxy row equal to its worker row.

    Raises:
      ValueError: ``workers`` is not a positive int, or does not match ``devices``.

    Example:
      >>> from coarse_jax.testing import shared_device_mesh
      >>> mesh = shared_device_mesh(workers=1)
      >>> mesh.devices[0, 0] == mesh.devices[1, 0]
      True
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"shared_device_mesh: workers must be a positive int, got {workers!r}.")
    pool = list(jax.devices()[:workers] if devices is None else devices)
    if len(pool) != workers:
        raise ValueError(
            f"shared_device_mesh: workers={workers} needs {workers} devices, got {len(pool)}."
        )
    row = np.array(pool, dtype=object)
    return Mesh(np.stack([row, row]), AXES)
