"""Gradients inside a coarse step: the workers' mean loss (`mean_gradients`, `in_coarse_trace`)."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax

from coarse_jax._jax_compat.internals import _ad, _config, _core, _parallel

# --- Gradients inside a coarse step: the workers' mean loss (issue 50) -------
#
# Inside ``shard_map`` jax differentiates an argument that is the same on every
# worker (the params) through the implicit ``pvary`` that meets it with the
# per-worker batch; that cast transposes to a ``psum``, so ``jax.grad`` returns
# the workers' *sum* of gradients. Code written for ``jax.jit`` expects the
# gradient of the global batch's mean loss, and code written for ``jax.pmap``
# means each worker's own gradient, which it then averages with ``lax.pmean``:
# both would silently get p times the mean. Inside a coarse step's trace the
# three casts that move a value between "the same on every worker" and "per
# worker" over the batch axes transpose mean-normalized instead: ``pvary`` to a
# mean (the sum of each share / n), ``psum`` and ``all_gather(to="invarying")``
# to n times their usual cast. Along any path from a per-worker loss to a shared argument there
# is one more invariant-to-varying cast than the reverse, so ``jax.grad`` gives
# the gradient of the workers' *mean* loss; for a loss that is already the same
# on every worker, or a path that never meets per-worker values, nothing
# changes; gradients of per-worker values are pmap's. A kept ``lax.pmean``
# (or ``lax.psum(...) / p``, flax's ``DynamicScale(axis_name)``, optax's
# ``sam(batch_axis_name)``) of that mean is the mean, as under pmap.
#
# Why internal: jax has no public hook for how a collective transposes. The
# wrappers are installed once and act only while `mean_gradients` is open on
# this thread: outside a coarse step's trace (another thread's jit, the user's
# own shard_map) every rule is jax's own. jax caches traces and transposes (an
# inner ``jax.jit``, ``jnp.matmul`` among them, is traced and transposed once
# per key); the switch is also a jax config state in jax's trace context and jit
# key, so an entry made inside a coarse step is never reused outside it, nor
# one made outside inside (tests/test_pmap_idioms.py runs both orders).

_MEAN_GRADIENTS_NAME = "coarse_jax_mean_gradients"
if _MEAN_GRADIENTS_NAME in _config.config_states:  # importlib.reload: the one defined
    _MEAN_GRADIENTS = _config.config_states[_MEAN_GRADIENTS_NAME]
else:
    _MEAN_GRADIENTS = _config.bool_state(
        name=_MEAN_GRADIENTS_NAME,
        default=False,
        help="Set by coarse_jax while it traces a step: jax.grad there differentiates the "
        "workers' mean loss. Not a user setting (coarse_jax turns it off at import).",
        include_in_jit_key=True,
        include_in_trace_context=True,
    )
# bool_state reads COARSE_JAX_MEAN_GRADIENTS from the environment: only a coarse
# step may turn it on.
jax.config.update(_MEAN_GRADIENTS_NAME, False)

_mean_axes = threading.local()


def _current_sizes() -> Mapping[str, int]:
    stack = getattr(_mean_axes, "stack", None)
    return stack[-1] if stack and _MEAN_GRADIENTS.value else {}


@contextlib.contextmanager
def mean_gradients(sizes: Mapping[str, int]) -> Iterator[None]:
    """While it is open on this thread, ``jax.grad`` averages over the axes ``sizes`` names.

    ``sizes``: the batch axes of a coarse step's program and their sizes
    (``{"data": p}``, with ``"host"`` across hosts). See the comment above.
    """
    stack = getattr(_mean_axes, "stack", None)
    if stack is None:
        stack = _mean_axes.stack = []
    stack.append(dict(sizes))
    try:
        with _MEAN_GRADIENTS(True):
            yield
    finally:
        stack.pop()


def _scale(ct: Any, n: int, divide: bool) -> Any:
    if ct is None or isinstance(ct, _ad.Zero) or n == 1:
        return ct
    dtype = getattr(ct, "dtype", None)
    if dtype is None or not jax.numpy.issubdtype(dtype, jax.numpy.inexact):
        return ct
    return ct / n if divide else ct * n


def _mean_normalized(rule: Callable[..., Any], axes_param: str, divide: bool) -> Callable[..., Any]:
    def scaled(cotangent: Any, *args: Any, **params: Any) -> Any:
        sizes = _current_sizes()
        if not sizes:
            return rule(cotangent, *args, **params)
        axes = params[axes_param]
        axes = axes if isinstance(axes, (tuple, list)) else (axes,)
        n = math.prod(sizes.get(a, 1) for a in axes if isinstance(a, str))
        if divide:
            # The workers' shares are summed in float32 at least and divided
            # before the sum, as a pmap program casts half-precision gradients up
            # before its pmean: p float16 gradients must not overflow where their
            # mean would not. Then back to the cotangent's own dtype.
            dtype = getattr(cotangent, "dtype", None)
            if n == 1 or dtype is None or jax.numpy.dtype(dtype).itemsize >= 4:
                return rule(_scale(cotangent, n, divide=True), *args, **params)
            wide = _scale(cotangent.astype(jax.numpy.float32), n, divide=True)
            return [ct if ct is None else ct.astype(dtype) for ct in rule(wide, *args, **params)]
        return [_scale(ct, n, divide=False) for ct in rule(cotangent, *args, **params)]

    scaled.__wrapped__ = rule  # type: ignore[attr-defined]
    return scaled


for _prim, _axes_param, _divide in (
    (_core.pvary_p, "axes", True),  # invariant -> per worker: its transpose sums; mean instead
    (_parallel.psum_invariant_p, "axes", False),  # per worker -> invariant: n x its cast
    (_parallel.all_gather_invariant_p, "axis_name", False),
):
    _rule = _ad.primitive_transposes[_prim]
    if not hasattr(_rule, "__wrapped__"):  # importlib.reload keeps one wrapper
        _ad.primitive_transposes[_prim] = _mean_normalized(_rule, _axes_param, _divide)


def in_coarse_trace() -> bool:
    """Whether this thread is tracing a coarse step's body (`mean_gradients` is open)."""
    return bool(_current_sizes())
