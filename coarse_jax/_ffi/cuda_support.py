"""Whether the CUDA extension can run here, and if not, why (`coarse.has_cuda_support`).

Three things must hold, checked in this order, each with its own answer:

1. *installed*: the module ``_coarse_cuda`` imported, from a build from source
   (``coarse_jax._coarse_cuda``) or from the CUDA wheel
   (``coarse_jax_cuda13._coarse_cuda``, ``pip install "coarse_jax[cuda13]"``);
2. *a driver*: NVIDIA's driver library ``libcuda.so.1`` loads, and supports
   CUDA 13 (driver 580 or newer);
3. *a GPU*: the driver initializes and counts at least one device.

The driver is asked through ``ctypes`` (``cuDriverGetVersion``, ``cuInit``,
``cuDeviceGetCount``), not through the extension, so the answer holds on a
machine with no GPU and no driver, where ``import coarse_jax`` works all the
same.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Callable
from typing import Any

DRIVER_LIBRARY = "libcuda.so.1"
# CUDA 13 needs a driver that supports CUDA 13.0 (cuDriverGetVersion: 1000 * major + 10 * minor).
MIN_DRIVER_CUDA = 13000
_CUDA_ERROR_NO_DEVICE = 100


@dataclasses.dataclass(frozen=True)
class CudaSupport:
    """What `coarse.has_cuda_support` answers: true only when CUDA can run.

    Attributes:
      available: the CUDA extension is installed, NVIDIA's driver loads and
        supports CUDA 13, and it sees at least one GPU.
      reason: ``"ready"``, or why not, starting with one of ``"not
        installed"``, ``"no driver"``, ``"no GPU"``, followed by what was
        found and the fix.
      module: where the extension came from (``"coarse_jax._coarse_cuda"``
        for a build from source, ``"coarse_jax_cuda13._coarse_cuda"`` for
        the CUDA wheel), or None when it is not installed.
      gpus: the GPUs the driver counts (0 when there is no driver).

    ``bool(support)`` is ``available``, so ``if coarse.has_cuda_support():``
    reads as before; ``print(support)`` gives the reason.
    """

    available: bool
    reason: str
    module: str | None = None
    gpus: int = 0

    def __bool__(self) -> bool:
        return self.available

    def __str__(self) -> str:
        return self.reason


def _driver_state(load: Callable[[str], Any]) -> tuple[str | None, int]:
    """(why the driver cannot run CUDA 13 or None, GPUs counted)."""
    try:
        libcuda = load(DRIVER_LIBRARY)
    except OSError as err:
        return (
            f"no driver: NVIDIA's driver library {DRIVER_LIBRARY} is not found ({err}). Fix: "
            "install NVIDIA's driver (580 or newer for CUDA 13) on a machine with a GPU",
            0,
        )
    version = ctypes.c_int(0)
    if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0 or version.value < MIN_DRIVER_CUDA:
        found = f"{version.value // 1000}.{version.value % 1000 // 10}" if version.value else "?"
        return (
            f"no driver: the driver supports CUDA {found}, the extension needs CUDA 13 "
            f"(driver 580 or newer). Fix: update NVIDIA's driver",
            0,
        )
    rc = libcuda.cuInit(0)
    count = ctypes.c_int(0)
    if rc == 0:
        rc = libcuda.cuDeviceGetCount(ctypes.byref(count))
    if rc == _CUDA_ERROR_NO_DEVICE or (rc == 0 and count.value == 0):
        return (
            "no GPU: NVIDIA's driver loads but sees no GPU (CUDA_VISIBLE_DEVICES may hide them)",
            0,
        )
    if rc != 0:
        return f"no GPU: NVIDIA's driver failed to initialize (cuInit error {rc})", 0
    return None, count.value


def probe(
    module: str | None, import_error: str | None, load: Callable[[str], Any] = ctypes.CDLL
) -> CudaSupport:
    """Checks the three conditions in order; ``load`` opens a shared library (ctypes.CDLL).

    Args:
      module: where ``_coarse_cuda`` was imported from, or None.
      import_error: why the CUDA wheel's module failed to import when the
        wheel is installed (its CUDA runtime missing, say), else None.
      load: opens ``libcuda.so.1``; tests pass a stand-in driver.
    """
    if module is None:
        if import_error is not None:
            why = (
                f"not installed: the CUDA wheel coarse-jax-cuda13 is installed but its module "
                f"failed to load ({import_error}). Fix: `pip install 'nvidia-cuda-runtime>=13,<14'`"
                " (NVIDIA's CUDA runtime), or reinstall `coarse_jax[cuda13]`"
            )
        else:
            why = (
                "not installed: coarse_jax has no CUDA extension (the CPU wheels hold the CPU "
                "extension only). Fix: `pip install --find-links dist 'coarse_jax[cuda13]'` with "
                "the wheels of `make wheel` (Python 3.12+), or build from source with "
                "COARSE_JAX_ENABLE_CUDA=ON"
            )
        return CudaSupport(False, why)
    why_not, gpus = _driver_state(load)
    if why_not is not None:
        return CudaSupport(False, f"{why_not} ({module} is installed)", module, gpus)
    return CudaSupport(True, f"ready: {module} with {gpus} GPU(s)", module, gpus)
