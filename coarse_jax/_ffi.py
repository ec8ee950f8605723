"""Bindings: registers the C++ handlers and wraps each custom call.

Every call takes the int32[2] (tier, data index) of the calling device first,
then leaves; all operands are cast to vary over both mesh axes (the
handlers behave per device). Results are typed the way the runtime makes
them: push/proxy-ring outputs vary per device, worker-ring and pull outputs
are identical on every device of the mesh, so they are typed invariant and
may leave ``shard_map`` with ``out_specs=P()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from coarse_jax.mesh import AXES, DATA, TIER
from coarse_jax.plan import BucketPlan, Plan

try:
    from coarse_jax import _coarse_cpu
except ImportError as _err:  # pragma: no cover - only without a build
    _coarse_cpu = None
    _IMPORT_ERROR: Exception | None = _err
else:
    _IMPORT_ERROR = None
    for _name, _capsule in _coarse_cpu.registrations().items():
        jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")

try:
    from coarse_jax import _coarse_cuda  # type: ignore[attr-defined]
except ImportError:  # built without nvcc (COARSE_JAX_ENABLE_CUDA=AUTO found none, or OFF)
    _coarse_cuda = None
else:
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
            "coarse_push", platform,
            " Or run the step in pure JAX: Config(mode='reference') / COARSE_JAX_MODE=reference.",
        )
    elif platform not in ("cpu", "gpu", "cuda"):
        raise NotImplementedError(f"coarse_jax: no runtime for platform {platform!r}; use mode='reference'.")


def _vary(x: jax.Array) -> jax.Array:
    missing = tuple(a for a in AXES if a not in jax.typeof(x).mat.varying)
    return lax.pcast(x, missing, to="varying") if missing else x


def vary(tree: Any) -> Any:
    """Casts every leaf of ``tree`` to vary over both mesh axes."""
    return jax.tree.map(_vary, tree)


def who() -> jax.Array:
    """The calling device's (tier, data index), as the handlers read it."""
    return _vary(jnp.stack([lax.axis_index(TIER), lax.axis_index(DATA)]).astype(jnp.int32))


def _result(x: jax.Array, varying: bool) -> Any:
    # A varying result takes the (varied) operand's own type, which carries
    # the mesh; an invariant one is a plain ShapeDtypeStruct.
    return jax.typeof(x) if varying else jax.ShapeDtypeStruct(x.shape, x.dtype)


def device_ordinals(mesh: jax.sharding.Mesh) -> np.ndarray:
    """The platform's device number of every mesh device, worker i at i, proxy k at p + k.

    The CUDA handlers learn which device calls them from the GPU ordinal XLA
    runs them on (the (tier, data) operand lives in GPU memory), and place
    the runtime's buffers on the right GPUs; CPU handlers ignore it.
    """
    devices = np.asarray(mesh.devices).reshape(2, -1)  # (tier, data): workers first
    return np.array(
        [d.local_hardware_id if d.local_hardware_id is not None else d.id for d in devices.flat],
        dtype=np.int64,
    )


def _current_ordinals() -> np.ndarray:
    from coarse_jax.api import _current  # api imports this module

    return device_ordinals(_current("coarse_jax").mesh)


def _call(target: str, results: Sequence[Any], operands: Sequence[jax.Array],
          aliases: dict[int, int], plan: Plan, site: int, **attrs: Any) -> Any:
    # vmap: "broadcast_all" hands the handlers batched buffers, which fail the
    # plan's element-count check with an error; vmapping a collective over
    # the mesh has no meaning here.
    return jax.ffi.ffi_call(
        target,
        tuple(results),
        has_side_effect=True,
        vmap_method="broadcast_all",
        input_output_aliases=aliases,
    )(*operands, **plan.ffi_attrs(), site=site, ordinals=_current_ordinals(), **attrs)


def token() -> jax.Array:
    """A fresh ordering token (float32 scalar: it may travel as a cotangent)."""
    return _vary(jnp.zeros((), jnp.float32))


def push(me: jax.Array, after: jax.Array, leaves: Sequence[jax.Array], plan: Plan,
         bucket: BucketPlan, site: int, passthrough: bool) -> tuple[list[jax.Array], jax.Array]:
    """Hands one bucket to the routed proxies, after the push that made ``after``.

    Returns ``(leaves, token)``. ``passthrough``: the leaves come back
    (aliased), for the backward hooks, whose cotangent outputs must be the
    gradients; otherwise ``[]``: aliasing a still-live operand (a step
    argument, say) would make XLA copy it first.
    """
    leaves = [_vary(x) for x in leaves]
    after = _vary(after)
    out = _call(
        "coarse_push",
        [*([_result(x, True) for x in leaves] if passthrough else []), _result(after, True)],
        [me, after, *leaves],
        {i + 2: i for i in range(len(leaves))} if passthrough else {},
        plan,
        site,
        first_leaf=bucket.first_leaf,
        first_piece=bucket.first_piece,
        num_pieces=bucket.num_pieces,
        passthrough=int(passthrough),
        last=0,
    )
    return list(out[:-1]), out[-1]


def proxy_ring(me: jax.Array, deps: Sequence[jax.Array], plan: Plan, site: int, last: bool) -> jax.Array:
    """Proxies reduce every piece; returns a token that orders what follows.

    ``deps`` (push outputs) only order this call after this device's pushes.
    """
    (token,) = _call(
        "coarse_proxy_ring", [_result(me, True)], [me, *map(_vary, deps)], {}, plan, site,
        last=int(last),
    )
    return token


def _aliases(n: int, first_operand: int, alias: bool) -> dict[int, int]:
    # Writing into a dead temporary (the gradients) saves XLA allocating and
    # faulting in fresh output buffers every step.
    return {first_operand + i: i for i in range(n)} if alias else {}


def worker_ring(me: jax.Array, token: jax.Array, leaves: Sequence[jax.Array], plan: Plan,
                site: int, last: bool, alias: bool) -> tuple[list[jax.Array], jax.Array]:
    """Workers reduce the leading leaves and hand them to their proxies."""
    leaves = [_vary(x) for x in leaves]
    out = _call(
        "coarse_worker_ring",
        [*(_result(x, False) for x in leaves), _result(me, True)],
        [me, token, *leaves],
        _aliases(len(leaves), 2, alias),
        plan,
        site,
        last=int(last),
    )
    return list(out[:-1]), out[-1]


def pull(me: jax.Array, token: jax.Array, leaves: Sequence[jax.Array], plan: Plan, site: int,
         alias: bool) -> list[jax.Array]:
    """Every device writes the reduced proxy leaves; ends the step.

    ``leaves`` give the result shapes; they are operands only when aliased.
    """
    leaves = [_vary(x) for x in leaves]
    out = _call(
        "coarse_pull",
        [_result(x, False) for x in leaves],
        [me, token, *(leaves if alias else [])],
        _aliases(len(leaves), 2, alias),
        plan,
        site,
        last=1,
    )
    return list(out)


def inject_dropped_push(worker: int) -> None:
    """Testing hook: the next push of ``worker`` is lost (its proxy must time out)."""
    _coarse_cpu.inject_dropped_push(worker)


def live_sessions() -> int:
    """Testing hook: sessions the runtime holds now (0 between steps)."""
    return _coarse_cpu.live_sessions()
