"""coarse_jax's CUDA 13 extension: the module ``_coarse_cuda``, imported by coarse_jax.

Installed by ``pip install "coarse_jax[cuda13]"``. The module links the shared
CUDA runtime ``libcudart.so.13`` of NVIDIA's ``nvidia-cuda-runtime`` wheel and
finds it through its RPATH (``$ORIGIN/../nvidia/cu13/lib``) when both wheels
share a site-packages folder. When they do not (a venv with
``--system-site-packages``, a user site), `preload_cuda_runtime` loads it first
from wherever the ``nvidia`` namespace package lies, as jax's CUDA plugin does.
"""

from __future__ import annotations

import ctypes
import importlib
import os

__version__ = "0.1.0"

CUDA_RUNTIME = "libcudart.so.13"


def preload_cuda_runtime() -> str | None:
    """Loads NVIDIA's ``libcudart.so.13`` from the ``nvidia`` namespace package.

    Returns:
      The path loaded, or None when no ``nvidia/cu13/lib/libcudart.so.13``
      exists on ``sys.path`` (then the module's RPATH and the system's
      loader path are all that is left).
    """
    try:
        nvidia = importlib.import_module("nvidia")
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        path = os.path.join(root, "cu13", "lib", CUDA_RUNTIME)
        if os.path.exists(path):
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            return path
    return None
