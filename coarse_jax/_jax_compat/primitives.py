"""A primitive defined outside jax given what jax's own primitives have: its abstract
evaluation's typing, eager evaluation, and equations that are never dead."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from coarse_jax._jax_compat.internals import _core, _dispatch, _pe


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
