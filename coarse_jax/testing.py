"""Test-only helpers: not part of the public API (not in ``coarse.__all__``).

`shared_device_mesh` lets a proxy share a physical device with its worker,
so one device (a single lent GPU, say) can run the whole protocol at p = 1:
the workers' program through XLA, the proxy in the runtime's service
(ffi/runtime/service.h), on a stream of its own on a GPU. The proxy's
storage (its slots, the master parameters, the optimizer state) then takes
memory on the worker's device, so this mesh tests the protocol; it does not
give the memory a real proxy device gives. Results are bitwise those of a
mesh with separate proxy devices (tests/test_shared_device.py).

`active_backend` names the device backend the runtime's sessions run on, so
a test can tell the plain CPU backend from the stream-semantics one
(``COARSE_JAX_BACKEND=streams``).

`stream_ops` counts, per kind, what the runtime asked of its streams (kernel
launches, copies by direction with their bytes, event records, stream waits,
host waits and synchronizations, hand-offs between threads) on CUDA and on the
stream-semantics CPU backend, so what a GPU step would be asked to do can be
counted, and held to a budget, on a machine with no GPU; `reset_stream_ops`
zeroes it.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from coarse_jax import _ffi
from coarse_jax._ffi.stream_ops import StreamOps, reset_stream_ops, stream_ops
from coarse_jax.mesh import AXES

__all__ = ["StreamOps", "active_backend", "reset_stream_ops", "shared_device_mesh", "stream_ops"]


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


def active_backend(platform: str | None = None) -> str:
    """The device backend coarse_jax's runtime runs a step's sync on. Test only.

    On CPU it is chosen once, from the environment variable
    ``COARSE_JAX_BACKEND``, when the CPU extension loads: ``"cpu"`` (the
    default: every operation is done when it returns, devices read each
    other's memory in place) or ``"streams"`` (each device has its own
    memory and one in-order stream, with events between them: the CUDA
    backend's semantics, run on the CPU). On GPUs it is ``"cuda"``.

    Args:
      platform: ``"cpu"`` or ``"gpu"``/``"cuda"``; default: jax's default backend.

    Returns:
      ``"cpu"``, ``"streams"`` or ``"cuda"``.

    Example:
      >>> from coarse_jax.testing import active_backend
      >>> active_backend("cpu") in ("cpu", "streams")
      True
    """
    platform = (platform or jax.default_backend()).lower()
    if platform in ("gpu", "cuda"):
        return "cuda"
    return str(_ffi.cpu_module().backend())
