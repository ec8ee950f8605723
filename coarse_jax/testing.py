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
a test can tell the default CPU backend (an inline stream, one address
space) from the stream-semantics one (``COARSE_JAX_BACKEND=streams``).

Test switches, each a call in the process it changes (never an environment
variable, so none leaks into a user's run): `set_default_xla_below_bytes`
(the project's suite sends small trees through the proxies, the path a GPU
run takes), `xla_hand_out` (XLA's all_gather hands out within a host on CPU
too, as on GPUs), `kill_before_rename` (a crash between a checkpoint's
write and its rename) and `deliberate_faults` (an old cost brought back, for
a budget test to show it fails without the change that removed it).

`stream_ops` counts, per kind, what the runtime asked of its streams (kernel
launches, copies by direction with their bytes, event records, stream waits,
host waits and synchronizations, hand-offs between threads) on CUDA and on the
CPU's streams (the default inline one copies nothing), so what a GPU step
would be asked to do can be counted, and held to a budget, on a machine with
no GPU; `reset_stream_ops` zeroes it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from coarse_jax import _ffi
from coarse_jax._ffi.stream_ops import StreamOps, reset_stream_ops, stream_ops
from coarse_jax._hooks import HOOKS
from coarse_jax.config import check_bytes
from coarse_jax.mesh import AXES

__all__ = [
    "StreamOps",
    "active_backend",
    "deliberate_faults",
    "kill_before_rename",
    "reset_stream_ops",
    "set_default_xla_below_bytes",
    "shared_device_mesh",
    "stream_ops",
    "xla_hand_out",
]


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
    default: the same orchestration on an inline stream, every operation done
    when it returns, devices reading each other's memory in place) or
    ``"streams"`` (each device has its own memory and one in-order stream,
    with events between them: the CUDA backend's semantics, run on the CPU).
    On GPUs it is ``"cuda"``.

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


def set_default_xla_below_bytes(value: int | str) -> int | str:
    """Sets the default of ``Config.xla_below_bytes`` for this process. Test only.

    A Config built afterwards without ``xla_below_bytes`` takes ``value``; one
    that names it is unchanged. The project's suite sets 0 (tests/conftest.py),
    so its small trees go through the proxies, the path a GPU run takes.

    Args:
      value: ``"auto"`` (the user's default) or a non-negative number of bytes.

    Returns:
      The default it replaces, to restore.

    Raises:
      ValueError: ``value`` is neither "auto" nor a non-negative int.

    Example:
      >>> from coarse_jax.testing import set_default_xla_below_bytes
      >>> before = set_default_xla_below_bytes(0)
      >>> coarse.Config().xla_below_bytes, coarse.Config(xla_below_bytes=64).xla_below_bytes
      (0, 64)
      >>> _ = set_default_xla_below_bytes(before)
    """
    check_bytes(
        "set_default_xla_below_bytes",
        value,
        auto=True,
        fix=" Fix: pass 0 (every tree through the proxies) or 'auto'.",
    )
    before, HOOKS.xla_below_bytes = HOOKS.xla_below_bytes, value
    return before


@contextlib.contextmanager
def xla_hand_out() -> Iterator[None]:
    """Within it, steps traced across hosts hand out within a host by XLA's all_gather
    on CPU workers too, as on GPUs (the runtime's hand-out otherwise). Test only.

    Example:
      >>> from coarse_jax.testing import xla_hand_out
      >>> with xla_hand_out():
      ...     pass
    """
    before, HOOKS.xla_hand_out = HOOKS.xla_hand_out, True
    try:
        yield
    finally:
        HOOKS.xla_hand_out = before


@contextlib.contextmanager
def deliberate_faults(
    notify_per_piece: bool = False, clip_sync_per_piece: bool = False
) -> Iterator[None]:
    """Within it, the CPU runtime runs with deliberate faults, each an old cost back. Test only.

    Args:
      notify_per_piece: a push wakes its proxies, and a proxy the pulls reading
        it, once per piece instead of once per bucket / group of pieces.
      clip_sync_per_piece: global-norm clipping synchronizes the host once per
        range of the gradient a proxy owns (the sums stay on the device still).

    Example:
      >>> from coarse_jax.testing import deliberate_faults
      >>> with deliberate_faults(notify_per_piece=True):
      ...     pass
    """
    mask = (1 if notify_per_piece else 0) | (2 if clip_sync_per_piece else 0)
    before = _ffi.set_faults(mask)
    try:
        yield
    finally:
        _ffi.set_faults(before)


def kill_before_rename(step: int | None) -> None:
    """Kills this process (SIGKILL) once optimizer step ``step``'s snapshot is written
    to ``Snapshots.directory`` and before it is renamed complete. Test only.

    Args:
      step: the snapshot's optimizer step count; None turns it off.

    Raises:
      ValueError: ``step`` is neither None nor a non-negative int.
    """
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise ValueError(f"kill_before_rename: expected None or a step count >= 0, got {step!r}.")
    HOOKS.kill_before_rename = step
