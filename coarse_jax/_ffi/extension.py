"""The compiled extensions: loading, registration of their FFI targets, platform checks.

``coarse_jax._coarse_cpu`` always builds; ``coarse_jax._coarse_cuda`` builds
when nvcc is found at install time. Each exposes ``registrations()`` (target
name -> capsule), registered here for "cpu" and "CUDA" under the same names,
plus a few host functions (virtual-clock spans, testing hooks).
"""

from __future__ import annotations

from typing import Any

import jax

# The modules, or None where not built (typed Any: nanobind ships no stubs here).
_coarse_cpu: Any = None
_coarse_cuda: Any = None
_IMPORT_ERROR: Exception | None = None

try:
    import coarse_jax._coarse_cpu as _cpu_extension
except ImportError as _err:  # pragma: no cover - only without a build
    _IMPORT_ERROR = _err
else:
    _coarse_cpu = _cpu_extension
    for _name, _capsule in _coarse_cpu.registrations().items():
        jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")

try:
    import coarse_jax._coarse_cuda as _cuda_extension
except ImportError:  # built without nvcc (COARSE_JAX_ENABLE_CUDA=AUTO found none, or OFF)
    pass
else:
    _coarse_cuda = _cuda_extension
    # Registering for "CUDA" needs no GPU: a jaxlib without the CUDA plugin
    # keeps the targets until a plugin appears, and a GPU-less host never asks.
    for _name, _capsule in _coarse_cuda.registrations().items():
        jax.ffi.register_ffi_target(_name, _capsule, platform="CUDA")

# Custom calls the CUDA extension implements (coarse_probe, the profiler's
# transfers, is CPU-only).
CUDA_TARGETS = frozenset(_coarse_cuda.registrations()) if _coarse_cuda is not None else frozenset()


def has_cuda_support() -> bool:
    """True when the CUDA extension ``coarse_jax._coarse_cuda`` was built.

    It builds when nvcc is found at install time (CMake option
    ``COARSE_JAX_ENABLE_CUDA``, default AUTO) and holds the GPU runtime of
    ``coarse.sync`` (push, rings, pull over peer copies) and the kernels of
    `coarse_jax.kernels`. Whether a GPU is present is jax's business
    (``jax.devices("gpu")``).

    Example:
      >>> import coarse_jax as coarse
      >>> coarse.has_cuda_support()  # doctest: +SKIP
      True
    """
    return _coarse_cuda is not None


def virtual_sync_seconds() -> list[float]:
    """Simulated seconds of each synchronization run on a virtual-clock topology.

    One entry per finished synchronization (a `coarse.sync` step's
    `value_and_grad` / `all_reduce` each count one) with
    ``Config(topology=coarse.Topology(..., clock="virtual"))``, in completion
    order, since the previous call; each call returns and forgets them. A
    synchronization's time is its latest device's simulated clock when it
    ends, counted from 0 when it starts.

    Example:
      >>> topo = coarse.Topology.preset("v100", 4, clock="virtual")
      >>> step = coarse.sync(lambda x: coarse.all_reduce(x[0]), mesh=mesh,
      ...                    config=coarse.Config(topology=topo))
      >>> _ = jax.block_until_ready(step(x))
      >>> coarse.virtual_sync_seconds()  # doctest: +SKIP
      [0.000123]
    """
    if _coarse_cpu is None:
        return []
    return [float(s) for s in _coarse_cpu.take_virtual_spans()]


def check_gpu_target(target: str, platform: str, fallback: str = "") -> None:
    """Raises the actionable error for custom call ``target`` on ``platform``.

    ``fallback``: what else the caller can do, appended to the message.
    """
    if platform not in ("gpu", "cuda"):
        return
    if not has_cuda_support():
        raise RuntimeError(
            f"coarse_jax: {target} is asked to run on a GPU, but coarse_jax was built without its "
            "CUDA extension (coarse_jax._coarse_cuda: no nvcc was found at install time). "
            "Reinstall on a host with the CUDA toolkit (or after `pip install coarse_jax[cuda]`), "
            f"e.g. `COARSE_JAX_ENABLE_CUDA=ON pip install --no-build-isolation .`.{fallback}"
        )
    if target not in CUDA_TARGETS:
        raise NotImplementedError(
            f"coarse_jax: {target} has no CUDA implementation (built for CUDA: "
            f"{', '.join(sorted(CUDA_TARGETS))}).{fallback}"
        )


def check_platform(mesh: jax.sharding.Mesh) -> None:
    """Raises the actionable error before lowering a program the runtime cannot run."""
    platform = mesh.devices.flat[0].platform
    if platform == "cpu":
        if _coarse_cpu is None:
            raise ImportError(
                "coarse_jax: the CPU extension coarse_jax._coarse_cpu is not built "
                f"({_IMPORT_ERROR}). Reinstall with `pip install .` (or `make install`), or use "
                "Config(mode='reference') / COARSE_JAX_MODE=reference."
            )
    elif platform in ("gpu", "cuda"):
        check_gpu_target(
            "coarse_push",
            platform,
            " Or run the step in pure JAX: Config(mode='reference') / COARSE_JAX_MODE=reference.",
        )
    elif platform not in ("cpu", "gpu", "cuda"):
        raise NotImplementedError(
            f"coarse_jax: no runtime for platform {platform!r}; use mode='reference'."
        )


def cpu_module() -> Any:
    """The CPU extension module (``coarse_jax._coarse_cpu``); ImportError if it is not built."""
    if _coarse_cpu is None:
        raise ImportError(
            f"coarse_jax: the CPU extension coarse_jax._coarse_cpu is not built ({_IMPORT_ERROR}). "
            "Reinstall with `pip install .` (or `make install`)."
        )
    return _coarse_cpu


def cuda_module() -> Any | None:
    """The CUDA extension module (``coarse_jax._coarse_cuda``), or None when it was not built."""
    return _coarse_cuda


def inject_dropped_push(worker: int) -> None:
    """Testing hook: the next push of ``worker`` is lost (its proxy must time out)."""
    cpu_module().inject_dropped_push(worker)


def live_sessions() -> int:
    """Testing hook: sessions the runtime holds now (0 between steps)."""
    return int(cpu_module().live_sessions())
