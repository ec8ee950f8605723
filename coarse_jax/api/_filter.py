"""What `coarse.value_and_grad` / `value_and_update` differentiate in a tree with non-arrays.

``eqx.filter_value_and_grad`` differentiates the floating-point array leaves
of its first argument and passes every other leaf (an activation function,
an integer array, a flag) through unchanged; the gradients come back as the
same tree with ``None`` where a leaf was not differentiated, which
``eqx.apply_updates`` and ``optax`` (given ``eqx.filter(model, eqx.is_array)``)
take. The coarse calls do the same for a differentiated argument that is or
holds an Equinox Module, or holds a leaf that is neither an array nor a Python
number (a plain pytree of arrays is differentiated whole, as before: a
non-float leaf there is refused, naming it). `coarse.value_and_update` then
keeps the floating leaves on the proxies and returns the whole tree, the
other leaves as they came.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from coarse_jax.dispatch import static_leaves


def needs_filter(tree: Any) -> bool:
    """Whether ``tree`` is differentiated as ``eqx.filter_value_and_grad`` would (above)."""
    leaves = jax.tree.leaves(tree, is_leaf=static_leaves.is_module)
    if any(static_leaves.is_module(x) for x in leaves):
        return True
    return not all(
        static_leaves.is_array(x) or isinstance(x, (bool, int, float, complex))
        for x in jax.tree.leaves(tree)
    )


def _differentiated(x: Any) -> bool:
    return static_leaves.is_array(x) and jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def partition(tree: Any) -> tuple[Any, Any]:
    """(the floating array leaves, ``None`` elsewhere; every other leaf, ``None`` elsewhere),
    as ``eqx.partition(tree, eqx.is_inexact_array)``."""
    diff = jax.tree.map(lambda x: x if _differentiated(x) else None, tree)
    rest = jax.tree.map(lambda x: None if _differentiated(x) else x, tree)
    return diff, rest


def combine(diff: Any, rest: Any) -> Any:
    """The tree `partition` split, from its two parts (``eqx.combine``)."""
    return jax.tree.map(lambda d, r: r if d is None else d, diff, rest, is_leaf=lambda x: x is None)
