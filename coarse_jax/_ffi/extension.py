"""The compiled extensions: loading, registration of their FFI targets, platform checks.

``coarse_jax._coarse_cpu`` always builds. ``_coarse_cuda`` comes from a build
from source that found nvcc (``coarse_jax._coarse_cuda``) or from the CUDA
wheel (``coarse_jax_cuda13._coarse_cuda``, ``pip install "coarse_jax[cuda13]"``).
Each exposes ``registrations()`` (target name -> capsule), registered here for
"cpu" and "CUDA" under the same names, plus a few host functions
(virtual-clock spans, testing hooks). Importing either needs no GPU and no
driver; `has_cuda_support` says whether CUDA can run.
"""

from __future__ import annotations

import atexit
import importlib
import signal
import threading
from typing import Any

import jax
import numpy as np

from coarse_jax._ffi.cuda_support import CudaSupport, probe
from coarse_jax._version import __version__

try:  # CPython's C module under `signal`: see _python_sigint_handler
    _signal: Any = importlib.import_module("_signal")
except ImportError:  # pragma: no cover - another Python
    _signal = None

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
    _coarse_cpu.backend()  # raises on a COARSE_JAX_BACKEND it does not know
    for _name, _capsule in _coarse_cpu.registrations().items():
        jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")

# Where _coarse_cuda came from, and why the CUDA wheel's failed to import.
_CUDA_MODULE: str | None = None
_CUDA_IMPORT_ERROR: str | None = None


def _import_cuda_extension() -> Any:
    """The CUDA module from a source build, else from the CUDA wheel, else None."""
    global _CUDA_MODULE, _CUDA_IMPORT_ERROR
    try:  # built from source with nvcc (COARSE_JAX_ENABLE_CUDA=AUTO found one, or ON)
        module = importlib.import_module("coarse_jax._coarse_cuda")
    except ImportError:
        pass
    else:
        _CUDA_MODULE = "coarse_jax._coarse_cuda"
        return module
    try:
        wheel = importlib.import_module("coarse_jax_cuda13")
    except ImportError:  # no CUDA wheel: the CPU extension only
        return None
    try:
        wheel.preload_cuda_runtime()  # NVIDIA's libcudart.so.13, wherever its wheel lies
        module = importlib.import_module("coarse_jax_cuda13._coarse_cuda")
    except (ImportError, OSError) as err:
        _CUDA_IMPORT_ERROR = str(err)
        return None
    if getattr(wheel, "__version__", None) != __version__:
        _CUDA_IMPORT_ERROR = (
            f"coarse-jax-cuda13 {getattr(wheel, '__version__', '?')} beside coarse_jax "
            f"{__version__}; the two must be the same version"
        )
        return None
    _CUDA_MODULE = "coarse_jax_cuda13._coarse_cuda"
    return module


_cuda_extension = _import_cuda_extension()
if _cuda_extension is not None:
    _coarse_cuda = _cuda_extension
    # Registering for "CUDA" needs no GPU: a jaxlib without the CUDA plugin
    # keeps the targets until a plugin appears, and a GPU-less host never asks.
    for _name, _capsule in _coarse_cuda.registrations().items():
        jax.ffi.register_ffi_target(_name, _capsule, platform="CUDA")
    # One SIGINT hook per process (ffi/runtime/interrupt.h): the CPU module's,
    # which the CUDA module's waits read.
    if _coarse_cpu is not None:
        _coarse_cuda.use_interrupt_state(_coarse_cpu.interrupt_state())


def _set_exiting() -> None:
    # After a Ctrl-C, a step XLA ran after the SIGINT could otherwise hold the
    # exit for up to timeout_s (ffi/runtime/interrupt.h SetExiting). Registered
    # at import, so it runs after the snapshot writers' flush (registered
    # later; atexit runs last-in first-out) and before jax's own clean-up.
    for module in (_coarse_cpu, _coarse_cuda):
        if module is not None:
            module.set_exiting()


atexit.register(_set_exiting)

# Custom calls the CUDA extension implements (coarse_probe, the profiler's
# transfers, is CPU-only).
CUDA_TARGETS = frozenset(_coarse_cuda.registrations()) if _coarse_cuda is not None else frozenset()


def has_cuda_support() -> CudaSupport:
    """Whether coarse_jax can run on NVIDIA GPUs here, and if not, why.

    Three things must hold, checked in order: the CUDA extension is installed
    (``pip install "coarse_jax[cuda13]"``, or a build from source that found
    nvcc); NVIDIA's driver (``libcuda.so.1``, CUDA 13: 580 or newer) loads;
    and it sees a GPU. The extension holds the GPU runtime of ``coarse.sync``
    (push, rings, pull over peer copies) and the kernels of
    `coarse_jax.kernels`. Whether jax itself runs on the GPU is jax's business
    (``jax.devices("gpu")``, ``pip install "jax[cuda13]"``).

    Returns:
      A `CudaSupport`, true when all three hold; its ``reason`` starts with
      ``"ready"``, ``"not installed"``, ``"no driver"`` or ``"no GPU"`` and
      says what to do. Without the extension a step on GPU devices fails at
      trace time with the fix in the message.

    Example:
      >>> import coarse_jax as coarse
      >>> support = coarse.has_cuda_support()
      >>> bool(support) == support.available
      True
      >>> str(support).split(":")[0] in ("ready", "not installed", "no driver", "no GPU")
      True
    """
    return probe(_CUDA_MODULE, _CUDA_IMPORT_ERROR)


def virtual_sync_seconds() -> list[float]:
    """Simulated seconds of each synchronization run on a virtual-clock topology.

    One entry per finished synchronization (a `coarse.sync` step's
    `value_and_grad` / `all_reduce` each count one) with
    ``Config(topology=coarse.EmulatedTopology(..., clock="virtual"))``, in completion
    order, since the previous call; each call returns and forgets them. A
    synchronization's time is its latest device's simulated clock when it
    ends, counted from 0 when it starts.

    Returns:
      Seconds per synchronization, oldest first; empty when none ran on a
      virtual clock (or the CPU extension is missing).

    Example:
      >>> topo = coarse.EmulatedTopology.preset("v100", 4, clock="virtual")
      >>> step = coarse.sync(lambda x: coarse.all_reduce(x), mesh=mesh,
      ...                    config=coarse.Config(topology=topo))
      >>> _ = jax.block_until_ready(step(jnp.ones((8, 256))))
      >>> [round(s * 1e6, 1) for s in coarse.diagnostics.virtual_sync_seconds()]  # microseconds
      [...]
      >>> coarse.diagnostics.virtual_sync_seconds()  # taken: now empty
      []
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
    if _coarse_cuda is None:
        raise RuntimeError(
            f"coarse_jax: {target} is asked to run on a GPU, but coarse_jax was built without its "
            f"CUDA extension ({probe(_CUDA_MODULE, _CUDA_IMPORT_ERROR).reason}). "
            "Install the CUDA wheel beside it: `pip install --find-links dist "
            "'coarse_jax[cuda13]'` (Python 3.12+), or rebuild from source on a host with nvcc "
            "(or after `pip install coarse_jax[cuda]`): "
            f"`COARSE_JAX_ENABLE_CUDA=ON pip install --no-build-isolation .`.{fallback}"
        )
    if target not in CUDA_TARGETS:
        raise NotImplementedError(
            f"coarse_jax: {target} has no CUDA implementation (built for CUDA: "
            f"{', '.join(sorted(CUDA_TARGETS))}).{fallback}"
        )


def check_platform(mesh: Any) -> None:
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
    """The CUDA extension module (from a source build or the CUDA wheel), or None without one."""
    return _coarse_cuda


def runtime_module(platform: str) -> Any:
    """The extension module whose runtime runs ``platform``'s handlers (and holds its state)."""
    if platform == "cpu":
        return cpu_module()
    if _coarse_cuda is None:
        raise ImportError(
            f"coarse_jax: no runtime for platform {platform!r} (the CUDA extension is not built)."
        )
    return _coarse_cuda


def inject_stale_flags() -> None:
    """Testing hook: the next session reuses its storage set's previous ready value.

    A deliberate bug in state kept across sessions (a use counter not
    advanced): on the streams backend, a proxy in host memory then finds a
    ready flag already at this session's value and refuses the step, naming
    the piece, instead of letting a pull copy what an earlier session left.
    Consumed by the next session created, whatever its mesh.
    """
    cpu_module().inject_stale_flags()


def set_faults(mask: int) -> int:
    """Testing hook: the deliberate faults the CPU runtime runs with from now on.

    A mask (ffi/runtime/faults.h): 1, a push wakes its proxies and a proxy its
    pulls once per piece; 2, global-norm clipping synchronizes the host once
    per owned range. Returns the previous mask. See
    ``coarse_jax.testing.deliberate_faults``.
    """
    return int(cpu_module().set_faults(int(mask)))


def inject_dropped_push(worker: int) -> None:
    """Testing hook: the next session loses the first push of ``worker``.

    Arms only the next synchronization session the CPU runtime creates (the
    first ``coarse.value_and_grad`` / ``coarse.all_reduce`` of the next step,
    or of the next loop iteration): its proxy must time out with an error
    naming the missing push, not hang. That session consumes the hook even
    when its mesh has no worker ``worker`` (then nothing is dropped), so it
    never stays armed for a later mesh or step.
    """
    cpu_module().inject_dropped_push(worker)


def _python_sigint_handler() -> Any:
    """Python's SIGINT handler, as ``signal.getsignal`` gives it, in about a tenth of its time.

    ``signal.getsignal`` wraps the handler in an enum lookup that raises and
    catches a ValueError for every handler that is a function (about 9 us,
    a sixth of a small step's Python time); the C module's own ``getsignal``
    returns it as it is. Where the C module is missing (another Python), the
    public function.
    """
    raw = getattr(_signal, "getsignal", None) if _signal is not None else None
    return raw(signal.SIGINT) if raw is not None else signal.getsignal(signal.SIGINT)


def arm_interrupt_hook() -> bool:
    """Makes Ctrl-C stop a step that waits in the runtime; cheap, call before each dispatch.

    The runtime's waits run on XLA's threads while Python's main thread is
    blocked in C++, so Python's SIGINT handler only runs once the step
    returns: without this, a step stalled on a missing push would notice
    Ctrl-C only when ``Config.timeout_s`` expires. The extension chains a
    SIGINT hook to the current handler (one ``sigaction`` query when already
    installed, re-installed if Python replaced the handler since); a waiting
    device that sees a SIGINT abandons the step with an error saying it was
    interrupted, once Python's main thread has taken the SIGINT (raised its
    KeyboardInterrupt), or after 1 s if it cannot. So the KeyboardInterrupt
    always comes first: the abandoned step's JaxRuntimeError never leaves the
    loop before it (ffi/runtime/interrupt.h).

    Only while Python's SIGINT handler is the default one
    (``signal.default_int_handler``, which raises KeyboardInterrupt): a
    program that installed its own handler (to stop after the current step,
    say) sees the step finish as before.

    Returns:
      Whether the hook is installed (False without the CPU extension, or
      where the process has no usable SIGINT).

    Example:
      >>> from coarse_jax import _ffi
      >>> _ffi.arm_interrupt_hook()  # doctest: +SKIP
      True
    """
    if _coarse_cpu is None:
        return False
    try:
        aborts = _python_sigint_handler() is signal.default_int_handler
    except (ValueError, AttributeError):  # pragma: no cover - no SIGINT on this platform
        return False
    if threading.current_thread() is threading.main_thread():
        # Between steps Python has taken every SIGINT (a pending one raises
        # KeyboardInterrupt here): the steps they abandon may stop at once.
        _coarse_cpu.take_interrupts()
    armed = bool(_coarse_cpu.arm_interrupt_hook(aborts))
    if _coarse_cuda is not None:
        _coarse_cuda.arm_interrupt_hook(aborts)  # reads the CPU module's state: no second hook
    return armed


_LIMITS = ("spare_storage_bytes", "spare_plans", "cached_plans")


def _check_limit(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(
            f"coarse.diagnostics.set_memory_limits: {name} expected an int >= 0 or None (leave it "
            f"unchanged), got {type(value).__name__} {value!r}. Fix: pass e.g. "
            f"{name}={_EXAMPLE_LIMITS[name]}."
        )
    if int(value) < 0:
        raise ValueError(
            f"coarse.diagnostics.set_memory_limits: {name} expected an int >= 0, got {value!r}. "
            f"Fix: pass 0 to keep nothing, or e.g. {name}={_EXAMPLE_LIMITS[name]}."
        )
    return int(value)


_EXAMPLE_LIMITS = {"spare_storage_bytes": "256 << 20", "spare_plans": "4", "cached_plans": "64"}


def _modules() -> list[Any]:
    return [m for m in (_coarse_cpu, _coarse_cuda) if m is not None]


def summed_counters(getter: str) -> dict[str, int]:
    """``module.<getter>()`` (a dict of counts) summed over the loaded runtimes (the
    CPU one loaded first): wake-ups, stream operations."""
    cpu_module()
    total: dict[str, int] = {}
    for module in _modules():
        for k, v in getattr(module, getter)().items():
            total[k] = total.get(k, 0) + int(v)
    return total


def set_memory_limits(
    spare_storage_bytes: int | None = None,
    spare_plans: int | None = None,
    cached_plans: int | None = None,
) -> dict[str, int]:
    """Bounds what the runtime keeps between steps; returns the limits in force.

    Between steps the runtime keeps two things per plan (one plan per
    synchronization layout: tree structure, shapes, dtypes, workers, config):

    * *spare storage*: the proxies' f32 buffers and the workers' scratch of a
      finished step, so the next step of that plan allocates nothing (host
      memory on CPU, GPU memory on CUDA). Sets of the ``spare_plans`` most
      recently used plans are kept, at most ``spare_storage_bytes`` in all,
      except that the most recently used plan's sets are always kept whatever
      their size (so one plan larger than the limit still reuses its storage;
      ``spare_plans=0`` keeps nothing). At most two sets per plan.
    * *parsed plans*: the ``cached_plans`` most recently used; an evicted
      plan is parsed again from the program's attributes when next used.

    A process that runs many distinct plans (a sweep, a benchmark suite, a
    notebook re-jitting steps) stays within these bounds. The limits apply at
    once (what exceeds them is freed) to the CPU runtime and, when built, the
    CUDA one, each separately.

    Args:
      spare_storage_bytes: bytes of spare storage kept (default 512 MiB);
        None leaves it unchanged.
      spare_plans: distinct plans whose spare storage is kept (default 4);
        0 frees storage after every step. None leaves it unchanged.
      cached_plans: parsed plans kept (default 64). None leaves it unchanged.

    Returns:
      ``{"spare_storage_bytes": ..., "spare_plans": ..., "cached_plans": ...}``,
      the limits now in force.

    Raises:
      TypeError: a limit is not an int (bool is refused too).
      ValueError: a limit is negative.
      ImportError: the CPU extension is not built.

    Example:
      >>> import coarse_jax as coarse
      >>> coarse.diagnostics.set_memory_limits(spare_storage_bytes=256 << 20, spare_plans=2)
      {'spare_storage_bytes': 268435456, 'spare_plans': 2, 'cached_plans': 64}
      >>> coarse.diagnostics.set_memory_limits()  # just reads them
      {'spare_storage_bytes': 268435456, 'spare_plans': 2, 'cached_plans': 64}
    """
    values = {
        name: _check_limit(name, v)
        for name, v in zip(_LIMITS, (spare_storage_bytes, spare_plans, cached_plans), strict=True)
    }
    cpu_module()
    result: dict[str, int] = {}
    for module in _modules():
        result = {k: int(v) for k, v in module.set_memory_limits(**values).items()}
    return result


def runtime_stats() -> dict[str, int]:
    """What the runtime holds between (and during) steps, summed over the CPU and CUDA runtimes.

    Returns:
      A dict of ints:

      * ``spare_storage_bytes``, ``spare_sets``, ``spare_plans``: spare
        storage kept for later steps, its sets and their distinct plans
        (bounded by `set_memory_limits`);
      * ``cached_plans``: parsed plans cached;
      * ``live_sessions``: synchronizations in progress (0 between steps);
      * ``runs_remembered``, ``step_counters``: the runtime's bookkeeping of
        executions (loop iterations) and per-plan step numbers, both bounded.

    Raises:
      ImportError: the CPU extension is not built.

    Example:
      >>> import coarse_jax as coarse
      >>> coarse.diagnostics.runtime_stats()  # doctest: +SKIP
      {'spare_storage_bytes': 8388656, 'spare_sets': 1, 'spare_plans': 1, 'cached_plans': 3,
       'live_sessions': 0, 'runs_remembered': 12, 'step_counters': 3}
    """
    cpu_module()
    total: dict[str, int] = {}
    for module in _modules():
        for k, v in module.memory_stats().items():
            total[k] = total.get(k, 0) + int(v)
    return total


def live_sessions() -> int:
    """Testing hook: sessions the runtime holds now (0 between steps)."""
    return int(cpu_module().live_sessions())
