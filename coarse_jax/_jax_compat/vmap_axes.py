"""Collectives over a ``jax.vmap`` axis inside a coarse step (installed at import)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from coarse_jax._jax_compat.internals import _batching, _core, _parallel
from coarse_jax._jax_compat.mean_gradients import in_coarse_trace

# --- Collectives over a jax.vmap axis inside a coarse step (issue 63) ---------
#
# Inside ``shard_map`` (which checks varying-manual-axes types, as a coarse
# step's does) jax casts a collective's operand to vary over the axes it
# reduces (``pvary``) before it binds the collective. For an axis that
# ``jax.vmap(..., axis_name=...)`` binds (``eqx.nn.BatchNorm`` under
# ``jax.vmap(model, axis_name="batch")``), jax 0.10.2 fails that cast with a bare
# ``AssertionError`` (``core.pvary``: the name is no mesh axis), though under
# ``jax.jit`` the same code runs. A vmap axis is not a mesh axis: a value
# varies over it by being batched, which the varying-axes types do not track,
# so the cast has nothing to do for it. Inside a coarse step's trace the cast
# leaves out such names (bound in jax's axis environment, not in the mesh).
# Then ``psum_invariant``'s batching rule turns the vmap axis into a
# positional one, which the same primitive's type check refuses: inside a
# coarse step's trace the sum over the vmap axis is ``lax.reduce_sum`` over
# the batch dimension instead (it keeps the value's varying axes, so the
# backward pass types too), and the mesh axes left, if any, are summed by
# ``psum_invariant`` as before. pmean, and eqx.nn.BatchNorm's statistics, are
# that sum divided by the axis size.
# A name nothing binds is left in: jax fails as before and `coarse.sync`
# refuses it (`coarse_jax.dispatch.axis_names`); `unbound_axis_name` does not
# take a name a jax.vmap frame binds for an unbound one.
#
# Why internal: ``lax.psum``/``pmean``/``all_gather`` call ``core.pvary``
# through the name ``jax._src.lax.parallel.pvary``, and a primitive's batching
# rule lives in ``batching.fancy_primitive_batchers``; neither has a public hook.
# Checked on 0.10.2 (where it fails); a jax whose collectives no longer cast
# through that name simply never calls the wrapper.


def _vmap_only_axes(axes: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """(axes to keep, vmap axes to leave out) of a ``pvary`` inside a coarse step."""
    mesh_axes = set(getattr(jax.sharding.get_abstract_mesh(), "axis_names", ()) or ())
    get_env = getattr(_core, "get_axis_env", None)  # a jax without it: nothing left out
    env = get_env() if get_env is not None else None
    exists = getattr(env, "axis_exists", lambda _: False)
    keep, vmapped = [], []
    for a in axes:
        if isinstance(a, str) and a not in mesh_axes and exists(a):
            vmapped.append(a)
        else:
            keep.append(a)
    return keep, vmapped


def _pvary_without_vmap_axes(pvary: Callable[..., Any]) -> Callable[..., Any]:
    def cast(x: Any, axis_name: Any) -> Any:
        if not in_coarse_trace() or not axis_name:
            return pvary(x, axis_name)
        axes = axis_name if isinstance(axis_name, tuple) else (axis_name,)
        keep, vmapped = _vmap_only_axes(axes)
        if not vmapped:
            return pvary(x, axis_name)
        return pvary(x, tuple(keep)) if keep else x

    cast.__wrapped__ = pvary  # type: ignore[attr-defined]
    return cast


def _psum_over_vmap_axis_first(rule: Callable[..., Any]) -> Callable[..., Any]:
    """``psum_invariant``'s batching rule, summing over the vmap axis as ``lax.reduce_sum``
    over the batch dimension (which keeps the value's varying axes), then over the mesh
    axes left. jax 0.10.2's own rule binds ``psum_invariant`` with the vmap axis turned
    positional, which its type check refuses; ``psum_p`` (``check_vma=False``'s psum)
    takes it but forgets the varying axes, so the backward pass's types break."""

    def batched(axis_data: Any, vals_in: Any, dims_in: Any, **params: Any) -> Any:
        axes = tuple(params.get("axes", ()))
        name = getattr(axis_data, "name", None)
        if not in_coarse_trace() or name not in axes or set(params) != {"axes"}:
            return rule(axis_data, vals_in, dims_in, **params)
        (v,), (d,) = vals_in, dims_in
        v = v * axis_data.size if d is None else jax.lax.reduce_sum(v, (d,))
        rest = tuple(a for a in axes if a != name)
        return (_parallel.psum_invariant_p.bind(v, axes=rest) if rest else v), None

    batched.__wrapped__ = rule  # type: ignore[attr-defined]
    return batched


if hasattr(_parallel, "pvary") and not hasattr(_parallel.pvary, "__wrapped__"):
    _parallel.pvary = _pvary_without_vmap_axes(_parallel.pvary)
_batchers: dict[Any, Any] = getattr(_batching, "fancy_primitive_batchers", {})
_psum_batcher = _batchers.get(_parallel.psum_invariant_p)
if _psum_batcher is not None and not hasattr(_psum_batcher, "__wrapped__"):
    _batchers[_parallel.psum_invariant_p] = _psum_over_vmap_axis_first(_psum_batcher)
