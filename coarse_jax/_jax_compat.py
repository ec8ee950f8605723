"""Every use of a jax internal (``jax._src``, a private rule table), in one place.

coarse_jax supports jax ``SUPPORTED_JAX`` (pyproject.toml says the same). CI
runs the suite on the oldest (0.10.2, Python 3.11) and the newest (Python
3.12) of that range. Each name below says what it does, why no public API
serves, and the versions it was checked on. Where a public API exists it is
used instead (the gather over hosts is ``lax.all_gather(..., to="invarying")``
since 0.10.2: jax 0.12 removed the private ``all_gather_invariant`` it used).

If a future jax removes or reshapes one of these, importing coarse_jax fails
here with a message naming the supported range, never with a bare
ImportError from deep inside the package.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import re
import threading
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax

# Keep in step with pyproject.toml's dependency on jax and jaxlib.
SUPPORTED_JAX = ">=0.10.2,<0.13"
TESTED_JAX = ("0.10.2", "0.12.0.1")


def _unsupported(what: str, err: BaseException | None = None) -> ImportError:
    found = f" ({type(err).__name__}: {err})" if err is not None else ""
    return ImportError(
        f"coarse_jax supports jax {SUPPORTED_JAX} (tested on {', '.join(TESTED_JAX)}); the "
        f"installed jax {jax.__version__} lacks {what}{found}. Fix: install a jax in that range, "
        f'e.g. pip install "jax{SUPPORTED_JAX}" "jaxlib{SUPPORTED_JAX}".'
    )


try:
    # config.bool_state, config.config_states: checked on 0.10.2, 0.12.0.1.
    from jax._src import config as _config

    # core: checked on 0.10.2, 0.11.2, 0.12.0.1.
    from jax._src import core as _core

    # dispatch.simple_impl: checked on 0.10.2, 0.11.2, 0.12.0.1.
    from jax._src import dispatch as _dispatch

    # distributed.global_state: checked on 0.10.2, 0.12.0.1.
    from jax._src import distributed as _distributed

    # source_info_util.summarize: checked on 0.10.2, 0.12.0.1.
    from jax._src import source_info_util as _source_info

    # ad.primitive_transposes, ad.Zero: checked on 0.10.2, 0.12.0.1.
    from jax._src.interpreters import ad as _ad

    # batching.fancy_primitive_batchers: checked on 0.10.2.
    from jax._src.interpreters import batching as _batching

    # partial_eval.dce_rules: checked on 0.10.2, 0.11.2, 0.12.0.1.
    from jax._src.interpreters import partial_eval as _pe

    # parallel.psum_invariant_p, all_gather_invariant_p: checked on 0.10.2, 0.12.0.1.
    from jax._src.lax import parallel as _parallel
except ImportError as _err:  # pragma: no cover - only on an unsupported jax
    raise _unsupported("a module coarse_jax needs", _err) from _err

for _module, _name in (
    (_config, "bool_state"),
    (_config, "config_states"),
    (_core, "shaped_abstractify"),
    (_core, "standard_vma_rule"),
    (_core, "get_cur_mesh_sharding"),
    (_core, "pvary_p"),
    (_ad, "primitive_transposes"),
    (_ad, "Zero"),
    (_parallel, "psum_invariant_p"),
    (_parallel, "all_gather_invariant_p"),
    (_dispatch, "simple_impl"),
    (_pe, "dce_rules"),
    (_pe, "_default_dce_rule"),
    (_distributed, "global_state"),
    (_source_info, "summarize"),
):
    if not hasattr(_module, _name):  # pragma: no cover - only on an unsupported jax
        raise _unsupported(f"{_module.__name__}.{_name}")

AbstractValue = _core.AbstractValue


def shaped_abstractify(x: Any) -> Any:
    """The aval of ``x`` (a ShapeDtypeStruct, an array or an aval), varying axes kept.

    Why internal: ``jax.typeof`` takes arrays and tracers only, not a
    ShapeDtypeStruct, which is how a custom call's results are declared
    (``jax.ffi.ffi_call`` itself calls this).
    """
    return _core.shaped_abstractify(x)


def standard_vma_rule(name: str, *avals: Any) -> Any:
    """Checks that ``avals`` vary over the same mesh axes, as a primitive's abstract eval must.

    Why internal: a primitive defined outside jax (``jax.extend.core.Primitive``)
    has no public hook for the varying-axes typing that ``shard_map`` checks.
    """
    return _core.standard_vma_rule(name, *avals)


def current_mesh_sharding() -> Any:
    """The abstract mesh's sharding for an aval that has none (inside ``shard_map``).

    Why internal: a custom primitive's results must carry the sharding of the
    ``shard_map`` being traced; ``jax.sharding.get_abstract_mesh()`` gives the
    mesh, not the sharding object an aval holds.
    """
    return _core.get_cur_mesh_sharding()


def simple_impl(primitive: Any) -> None:
    """Gives ``primitive`` eager evaluation by compiling it alone, like jax's own primitives.

    Why internal: ``jax.extend`` exposes ``Primitive`` but not the eager rule.
    """
    _dispatch.simple_impl(primitive)


def _positional_arity(rule: Callable[..., Any]) -> int:
    return len(
        [
            p
            for p in inspect.signature(rule).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    )


# jax 0.10.2 calls a DCE rule as rule(used_outputs, eqn); jax 0.12 as
# rule(used_outputs, live_ins, eqn). The default rule says which. (Typed Any:
# each jax's stubs know only their own signature.)
_DCE_TAKES_LIVE_INS = _positional_arity(_pe._default_dce_rule) == 3
_dce_rules: dict[Any, Any] = _pe.dce_rules


def never_dead(primitive: Any) -> None:
    """Registers a DCE rule that keeps every equation of ``primitive``, used or not.

    Why internal: the public way to keep an equation is a JAX effect, and a
    jitted program with an effect loses jit's C++ dispatch path (see
    coarse_jax/_ffi/primitive.py). ``partial_eval.dce_rules`` is the table jax's
    own primitives use. Its rules' signature changed between 0.10.2
    ``(used_outputs, eqn)`` and 0.12 ``(used_outputs, live_ins, eqn)``: both
    are served.
    """
    if _DCE_TAKES_LIVE_INS:

        def rule(
            used_outputs: list[bool], live_ins: list[bool], eqn: Any
        ) -> tuple[list[bool], Any]:
            del used_outputs, live_ins
            return [True] * len(eqn.invars), eqn

        _dce_rules[primitive] = rule
    else:

        def rule_old(used_outputs: list[bool], eqn: Any) -> tuple[list[bool], Any]:
            del used_outputs
            return [True] * len(eqn.invars), eqn

        _dce_rules[primitive] = rule_old


def distributed_client() -> Any:
    """The ``jax.distributed`` coordination service's client, or None before ``initialize``.

    Why internal: its barrier (``wait_at_barrier``) is the only way to meet
    every process with a timeout before an XLA collective; ``jax.distributed``
    exposes ``initialize`` and ``shutdown`` only. Checked on 0.10.2, 0.12.0.1.
    """
    return _distributed.global_state.client


def jit_cache_size(jitted: Any) -> int | None:
    """How many executables ``jax.jit``'s function ``jitted`` compiled (one per argument
    type and placement it met), or None where this jax does not say.

    Why internal: jit's C++ cache is counted only by the private ``_cache_size``
    (what jax's own tests read); ``jax_log_compiles`` logs text. Checked on 0.10.2,
    0.12.0.1.
    """
    size = getattr(jitted, "_cache_size", None)
    try:
        return int(size()) if callable(size) else None
    except Exception:  # pragma: no cover - a jax that changed it
        return None


# jax's frames hold the axis name being bound under these locals:
# lax.psum/pmean/all_gather(axis_name), core.pvary(axes), axis_index(axis_name).
_AXIS_LOCALS = ("axis_name", "axes", "axis_names")
_UNBOUND_AXIS = re.compile(r"unbound axis name: ([^\s.]+)")


def _tracebacks(err: BaseException) -> Iterator[types.TracebackType]:
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:  # jax keeps the unfiltered trace as a cause
        seen.add(id(e))
        if e.__traceback__ is not None:
            yield e.__traceback__
        e = e.__cause__ or e.__context__


def unbound_axis_name(err: BaseException, known: Sequence[str]) -> str | None:
    """The axis name, not one of ``known``, that ``err`` (raised while tracing) failed on.

    Why internal: an unbound axis name fails deep in jax with a bare ``AssertionError``
    (``core.pvary``) or a ``NameError``, and only jax's own frames hold the name, in
    their locals (``axis_name``, ``axes``). Checked on 0.10.2, 0.12.0.1.
    """
    match = _UNBOUND_AXIS.search(str(err))
    if match and match.group(1) not in known:
        return match.group(1)
    # A name a jax.vmap binds around the failure is bound (its frame holds it as
    # axis_name too): an error there is another error, not an unbound name.
    known = [*known, *_vmap_bound_names(err)]
    for tb in _tracebacks(err):
        t: types.TracebackType | None = tb
        while t is not None:
            frame = t.tb_frame
            if "/jax/" in frame.f_code.co_filename.replace("\\", "/"):
                for key in _AXIS_LOCALS:
                    value = frame.f_locals.get(key)
                    names = [value] if isinstance(value, str) else value
                    if isinstance(names, (tuple, list)):
                        for name in names:
                            if isinstance(name, str) and name not in known:
                                return name
            t = t.tb_next
    return None


def _vmap_bound_names(err: BaseException) -> list[str]:
    """The axis names that ``jax.vmap`` frames (``vmap_f``) in ``err``'s traceback bind."""
    found = []
    for tb in _tracebacks(err):
        t: types.TracebackType | None = tb
        while t is not None:
            frame = t.tb_frame
            path = frame.f_code.co_filename.replace("\\", "/")
            if "/jax/" in path and frame.f_code.co_name.startswith("vmap"):
                name = frame.f_locals.get("axis_name")
                if isinstance(name, str):
                    found.append(name)
            t = t.tb_next
    return found


def user_location(eqn: Any) -> str:
    """Where the user's code made a jaxpr equation: ``"file.py:12 (fn)"``, or ``""``.

    Errors about an equation found by walking a traced step (a coarse call
    inside a ``lax.cond`` only some devices take, `coarse_jax.dispatch.uniform`)
    point at the user's line. The equation's ``source_info`` holds a traceback
    whose user frame only ``source_info_util.summarize`` picks out (it skips
    jax's own frames); no public API reads it. Checked on 0.10.2, 0.12.0.1.
    """
    try:
        return str(_source_info.summarize(eqn.source_info))
    except Exception:
        return ""


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


# --- A loop carry that starts the same on every worker (issue 63) ------------
#
# ``lax.scan``/``fori_loop``/``while_loop`` inside ``shard_map`` require the
# carry's output type to equal its input type, varying axes included. A carry
# that starts as a constant (``jnp.zeros(())``) and adds per-worker values (a
# running loss over micro-batches) starts "the same on every worker" and
# comes out "per worker", so jax fails with "carry input and carry output
# must have equal types ... This might be fixed by applying
# jax.lax.pcast(..., to='varying') to the initial carry", though under
# ``jax.jit`` the same code runs. Inside a coarse step's trace the loops do
# what that message says: a carry whose output varies over mesh axes its
# input does not gets its initial value cast to vary over them (each worker
# starts from the same value, as the program says), in the second pass jax's
# loops already make for weakly typed initial values. The cast is ``pvary``,
# whose transpose inside a coarse step is the workers' mean, so gradients
# through the initial value stay those of the mean loss. A carry whose type
# only settles after more than one such pass (one part of it made varying by
# another part) still fails with jax's message, which names the carry and
# the one-line fix.
#
# Why internal: the loops' second pass is the private
# ``jax._src.lax.control_flow.loops._promote_weak_typed_input``, looked up by
# name at every loop; no public hook sees the carry's output type before the
# check. Checked on 0.10.2; a jax without the name keeps its own loops.

_loops: Any
try:
    from jax._src.lax.control_flow import loops as _loops
except ImportError:  # pragma: no cover - a jax that moved it: its own loops
    _loops = None


def _varying(aval: Any) -> frozenset[Any] | None:
    mat = getattr(aval, "mat", None)
    found = getattr(mat, "varying", None) if mat is not None else getattr(aval, "vma", None)
    return frozenset(found) if found is not None else None


def _promote_carry(promote: Callable[..., Any]) -> Callable[..., Any]:
    def promoted(in_val: Any, in_aval: Any, out_aval: Any) -> tuple[Any, bool]:
        val, changed = promote(in_val, in_aval, out_aval)
        if not in_coarse_trace():
            return val, changed
        was, now = _varying(in_aval), _varying(out_aval)
        if was is None or now is None or not now - was:
            return val, changed
        missing = tuple(a for a in now - was if isinstance(a, str))
        return jax.lax.pcast(val, missing, to="varying"), True

    promoted.__wrapped__ = promote  # type: ignore[attr-defined]
    return promoted


_promote = getattr(_loops, "_promote_weak_typed_input", None)
if _promote is not None and not hasattr(_promote, "__wrapped__"):
    _loops._promote_weak_typed_input = _promote_carry(_promote)
