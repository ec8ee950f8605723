"""`custom_call`: an XLA FFI custom call that XLA may not move, and JAX dispatches fast.

Every coarse custom call has a side effect XLA must respect: it meets the
other devices in the runtime, so XLA may never drop, merge, duplicate or
hoist it out of a loop (a loop-invariant ``coarse_opt_count`` would be
hoisted, say). ``jax.ffi.ffi_call(..., has_side_effect=True)`` says so to
XLA, but also gives the jaxpr an effect, and a jitted program with an
effect never takes jit's C++ dispatch path: every call of a `coarse.sync`
step then went through Python dispatch and runtime tokens, about 300 us
per call on this project's 2-core CPU (a 1 KiB all_reduce took 580 us
against psum's 200 us; without the effect, 257 us against 132 us).

This primitive is ``ffi_call`` without the JAX effect: the HLO custom call
keeps ``has_side_effect=true`` (XLA's guarantee), the jaxpr has no effect.
Two things the effect did are done here instead: JAX never drops the call
as dead code (a rule below keeps it even when its results are unused: the
session's last call must run on every device, whatever the step returns),
and ``jax.vmap`` of it is refused with a message (a synchronization has no
batched form), as is differentiating it (it has no derivative: gradients come
from ``coarse.value_and_grad``, whose custom_vjp never differentiates a call).
A failed call fails the outputs that depend on it, as before.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from coarse_jax import _jax_compat

_CUSTOM_CALL_API_VERSION = 4  # typed FFI (what jax.ffi.ffi_call emits)

custom_call_p = Primitive("coarse_custom_call")
custom_call_p.multiple_results = True
_jax_compat.simple_impl(custom_call_p)


def _digest_into(digest: Any, value: Any) -> None:
    if isinstance(value, Mapping):  # a group of typed attributes (ffi/xla/call_attrs.h)
        digest.update(b"{")
        for key in sorted(value):
            digest.update(key.encode())
            _digest_into(digest, value[key])
        digest.update(b"}")
        return
    raw = value.encode() if isinstance(value, str) else np.asarray(value)
    if isinstance(raw, np.ndarray):
        digest.update(str(raw.dtype).encode())
        digest.update(str(raw.shape).encode())
        raw = raw.tobytes()
    digest.update(raw)


class _Attributes:
    """The call's attributes (numpy arrays, strings, scalars, and dicts of them), hashable by
    value.

    Primitive parameters must hash; the plan's attributes hold arrays, so the
    digest of their bytes (types and shapes included) stands for them.
    """

    def __init__(self, attrs: Mapping[str, Any]) -> None:
        self.attrs = dict(attrs)
        digest = hashlib.blake2b(digest_size=16)
        _digest_into(digest, self.attrs)
        self._key = digest.digest()

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Attributes) and other._key == self._key


def _abstract_eval(
    *avals_in: _jax_compat.AbstractValue, result_avals: tuple[Any, ...], **_: Any
) -> tuple[Any, ...]:
    _jax_compat.standard_vma_rule("coarse_custom_call", *avals_in)
    return tuple(
        r.update(
            sharding=_jax_compat.current_mesh_sharding() if r.sharding.mesh.empty else r.sharding
        )
        for r in result_avals
    )


custom_call_p.def_abstract_eval(_abstract_eval)


def _lowering(
    ctx: mlir.LoweringRuleContext,
    *operands: Any,
    target: str,
    aliases: tuple[tuple[int, int], ...],
    attributes: _Attributes,
    result_avals: tuple[Any, ...],
) -> Sequence[Any]:
    del result_avals  # the rule reads them from ctx
    rule = jax.ffi.ffi_lowering(
        target,
        has_side_effect=True,
        operand_output_aliases=dict(aliases),
        api_version=_CUSTOM_CALL_API_VERSION,
    )
    return rule(ctx, *operands, **attributes.attrs)


mlir.register_lowering(custom_call_p, _lowering)


# Every device must run every call of a session, used or not: a dropped last
# call would leave the session open on every device.
_jax_compat.never_dead(custom_call_p)


def _vmap_error(target: str) -> TypeError:
    return TypeError(
        f"coarse_jax: {target} was traced under jax.vmap. A coarse synchronization is one "
        "collective over the mesh's devices and has no batched form (each batch element would "
        "need its own rendezvous of all devices). Fix: vmap the per-example computation inside "
        "the loss and call coarse.value_and_grad / coarse.all_reduce once on the result."
    )


def _refuse_vmap(args: Any, dims: Any, *, target: str, **_: Any) -> Any:
    raise _vmap_error(target)


batching.primitive_batchers[custom_call_p] = _refuse_vmap


def _differentiation_error(target: str) -> TypeError:
    return TypeError(
        f"coarse_jax: {target} was differentiated (jax.grad, jax.jvp or jax.vjp reached a "
        "coarse synchronization). A coarse call is a collective over the mesh's devices with "
        "no derivative of its own: differentiating through it (jax.grad of a coarse.sync "
        "step, or of a value that went through coarse.all_reduce) is not supported. Fix: take "
        "gradients inside the step with coarse.value_and_grad (or coarse.value_and_update), "
        "which differentiates your loss and synchronizes the gradients; for a metric, pass "
        "jax.lax.stop_gradient(x) to coarse.all_reduce."
    )


def _refuse_jvp(primals: Any, tangents: Any, *, target: str, **_: Any) -> Any:
    # JAX calls this only when some tangent is non-zero: a stop_gradient'ed
    # operand, or the pushes inside coarse.value_and_grad's custom_vjp, never
    # get here.
    raise _differentiation_error(target)


ad.primitive_jvps[custom_call_p] = _refuse_jvp


def custom_call(
    target: str,
    results: Sequence[Any],
    aliases: Mapping[int, int] | None = None,
) -> Any:
    """Like ``jax.ffi.ffi_call(target, results, has_side_effect=True, ...)``, with no JAX effect.

    Returns a function of the operands and the attributes (keyword arguments:
    numpy arrays, strings, numpy scalars, dicts of them: an FFI dictionary
    attribute, which C++ binds as a struct) that returns a list of results.
    ``results``: ShapeDtypeStructs or avals (``jax.typeof(x)`` keeps a
    varying type); ``aliases``: operand index -> result index.
    """
    result_avals = tuple(
        _jax_compat.shaped_abstractify(r).update(dtype=np.dtype(r.dtype)) for r in results
    )
    pairs = tuple(sorted((aliases or {}).items()))
    return functools.partial(_bind, target, result_avals, pairs)


def _bind(
    target: str,
    result_avals: tuple[Any, ...],
    aliases: tuple[tuple[int, int], ...],
    *operands: jax.Array,
    **attrs: Any,
) -> list[jax.Array]:
    out = custom_call_p.bind(
        *operands,
        target=target,
        aliases=aliases,
        attributes=_Attributes(attrs),
        result_avals=result_avals,
    )
    return list(out)


# The latency route's marker (`coarse_jax.api._latency_route`): the identity on a
# tree that XLA, not the proxies, reduces (one psum). It lowers to nothing and
# makes the route behave as the proxies' calls do, whatever the tree's size:
# jax.vmap and differentiation are refused with the same messages, and
# `coarse_jax.dispatch.uniform` finds it under a per-device predicate.
route_p = Primitive("coarse_latency_route")
route_p.multiple_results = True
_jax_compat.simple_impl(route_p)


def _route_abstract_eval(*avals_in: Any, target: str) -> tuple[Any, ...]:
    _jax_compat.standard_vma_rule("coarse_latency_route", *avals_in)
    return avals_in


route_p.def_abstract_eval(_route_abstract_eval)
mlir.register_lowering(route_p, lambda ctx, *xs, target: list(xs))
batching.primitive_batchers[route_p] = _refuse_vmap
ad.primitive_jvps[route_p] = _refuse_jvp


def route_marker(leaves: Sequence[jax.Array], target: str) -> list[jax.Array]:
    """``leaves`` unchanged, marked as the latency route of ``target`` ("coarse.all_reduce")."""
    return list(route_p.bind(*leaves, target=target))


def route_join(leaves: Sequence[jax.Array]) -> jax.Array:
    """``leaves`` (float32, bfloat16, float16) widened to f32 and laid end to end in one
    f32 vector, by one CPU custom call (``coarse_route_join``, ffi/cpu/route_split.cc),
    typed as the first leaf varies."""
    like = jax.typeof(leaves[0])
    n = sum(int(x.size) for x in leaves)
    (flat,) = custom_call(
        "coarse_route_join", [like.update(shape=(n,), dtype=np.dtype(np.float32))]
    )(*leaves)
    return flat


def route_split(total: jax.Array, leaves: Sequence[Any]) -> list[jax.Array]:
    """``total`` (f32, the latency route's reduced vector) cut into arrays of ``leaves``'
    shapes and dtypes, in order (narrowed to nearest even), by one CPU custom call
    (``coarse_route_split``, ffi/cpu/route_split.cc), typed as ``total`` varies."""
    like = jax.typeof(total)
    results = [like.update(shape=tuple(x.shape), dtype=np.dtype(x.dtype)) for x in leaves]
    return custom_call("coarse_route_split", results)(total)
