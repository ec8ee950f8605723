"""The lab extensions: the C++ self-tests and benchmarks, built beside the product's modules.

Design (issue 53, "lab code out of the product"): the runtime's self-tests
(``sync_selftest``: the whole protocol without XLA; ``wakeup_selftest``: the
mailboxes under seeded delays) and its micro-benchmarks (``HostOptimizerBench``;
on CUDA ``bench_kernels`` and ``bench_host_copy``) are compiled from ffi/lab/
into modules of their own, ``_coarse_lab_cpu`` beside ``_coarse_cpu`` and
``_coarse_lab_cuda`` beside ``_coarse_cuda`` (in coarse_jax/ or, from the
CUDA wheel, coarse_jax_cuda13/). Each links the same runtime and backend
libraries as its product twin, but holds its own copy of the runtime's state
(sessions, storage pool, service threads): a self-test's sessions are counted
by the lab module's ``live_sessions()``, not the product's.

Product code never imports this module (the "protected" contract in
.importlinter); tests/, benchmarks/ and tools/ do, through `lab_cpu` and
`lab_cuda`. The extensions are installed with the package, so a test of an
installed wheel finds them.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["lab_cpu", "lab_cuda"]


def lab_cpu() -> Any:
    """The CPU lab extension (ffi/lab/module_lab_cpu.cc), on the backend ``COARSE_JAX_BACKEND``
    names, chosen when it loads, as the product module chooses its own."""
    return importlib.import_module("coarse_jax._coarse_lab_cpu")


def lab_cuda() -> Any | None:
    """The CUDA lab extension (ffi/lab/module_lab_cuda.cc) from where coarse_jax's CUDA module
    came (a source build or the CUDA wheel), or None when there is no CUDA module."""
    from coarse_jax import _ffi

    cuda = _ffi.cuda_module()
    if cuda is None:
        return None
    package = cuda.__name__.rpartition(".")[0]
    return importlib.import_module(f"{package}._coarse_lab_cuda")
