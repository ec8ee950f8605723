"""Leaves of a step's arguments and outputs that are not arrays: compiled in, as eqx.filter_jit.

An Equinox Module holds more than arrays: ``eqx.nn.MLP`` its activation
function, Equinox's CNN-on-MNIST example a ``list`` of layers that mixes
``jax.nn.relu`` and ``eqx.nn.Lambda``, ``eqx.nn.Dropout`` its ``p`` and
``inference`` flag. ``eqx.filter_jit`` traces the array leaves and compiles
the rest in, keyed by their hash. `coarse.sync` does the same with every
argument it passes into its program (the batch too) and with what the step
returns: `hold` wraps each such leaf in a `Held` pytree node that has no
children and keeps the value as its static data, so the tree jax traces has
arrays only; the value becomes part of the tree's structure, hence of the
program's cache key (`coarse_jax.dispatch.arguments.CallBinding`) and of jit's,
exactly as eqx.filter_jit's static part is. `release` unwraps them.

Which leaves are traced:

* arrays (``jax.Array``, tracers, numpy arrays and scalars): always;
* Python numbers (``bool``, ``int``, ``float``, ``complex``): traced, as
  ``jax.jit`` traces them (a learning rate passed as ``0.1`` does not
  recompile when it changes), except inside an Equinox Module, where
  ``eqx.filter_jit`` compiles them in (``Dropout(p=0.5, inference=False)``:
  ``if inference:`` needs a Python bool);
* everything else (functions, strings, other objects): compiled in. Each must
  be hashable (jit compares and hashes the tree's structure); one that is not
  is a TypeError naming the argument and the leaf's path.
"""

from __future__ import annotations

import sys
from typing import Any

import jax
import numpy as np

_SCALARS = (bool, int, float, complex)
_ARRAYS = (jax.Array, np.ndarray, np.generic)


@jax.tree_util.register_pytree_node_class
class Held:
    """A leaf compiled into the program: no children, the value is the node's static data."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def tree_flatten(self) -> tuple[tuple[()], Any]:
        return (), self.value

    @classmethod
    def tree_unflatten(cls, value: Any, children: Any) -> Held:
        del children
        return cls(value)

    def __repr__(self) -> str:
        return f"Held({self.value!r})"


def is_array(x: Any) -> bool:
    """What ``eqx.is_array`` traces: jax arrays (tracers too) and numpy arrays and scalars."""
    return isinstance(x, _ARRAYS)


def is_module(x: Any) -> bool:
    """Whether ``x`` is an Equinox Module (False without equinox imported: none can exist)."""
    eqx = sys.modules.get("equinox")
    return eqx is not None and isinstance(x, eqx.Module)


def _traced(x: Any, in_module: bool) -> bool:
    return is_array(x) or (not in_module and isinstance(x, _SCALARS))


def needs_hold(tree: Any) -> bool:
    """Whether `hold` would change ``tree`` (cheap when every leaf is an array)."""
    leaves = jax.tree.leaves(tree)
    for x in leaves:  # the common case, every leaf an array: one pass, no calls
        if not isinstance(x, _ARRAYS):
            break
    else:
        return False
    if not all(isinstance(x, _ARRAYS + _SCALARS) for x in leaves):
        return True
    return any(is_module(x) for x in jax.tree.leaves(tree, is_leaf=is_module))


def hold(tree: Any, what: str, step: str) -> Any:
    """``tree`` with every leaf that is not traced (module docstring) wrapped in `Held`.

    ``what`` names the argument or output in an error (``argument 0 (model)``).
    Raises TypeError for a leaf that cannot be hashed, naming its path.
    """
    if not needs_hold(tree):
        return tree

    def held(path: Any, x: Any, in_module: bool, prefix: str) -> Any:
        if _traced(x, in_module):
            return x
        try:
            hash(x)
        except TypeError:
            where = prefix + jax.tree_util.keystr(path)
            raise TypeError(
                f"coarse.sync({step}): {what} has a leaf at {where or '<root>'} that is not an "
                f"array, {type(x).__name__} {_short(x)}, and it cannot be hashed, so it cannot "
                "be compiled into the step as eqx.filter_jit compiles a Module's non-array "
                "leaves (functions, strings, flags). Fix: make it hashable (a tuple, not a "
                "list; a frozen dataclass), mark its field eqx.field(static=True), or hold "
                "its numbers as an array (jnp.asarray)."
            ) from None
        return Held(x)

    def outer(path: Any, x: Any) -> Any:
        prefix = jax.tree_util.keystr(path)
        if is_module(x):
            return jax.tree_util.tree_map_with_path(lambda p, y: held(p, y, True, prefix), x)
        return held((), x, False, prefix)

    return jax.tree_util.tree_map_with_path(outer, tree, is_leaf=is_module)


def release(tree: Any) -> Any:
    """``tree`` with every `Held` node replaced by its value (what `hold` wrapped)."""
    if not any(isinstance(x, Held) for x in jax.tree.leaves(tree, is_leaf=_is_held)):
        return tree
    return jax.tree.map(lambda x: x.value if isinstance(x, Held) else x, tree, is_leaf=_is_held)


def _is_held(x: Any) -> bool:
    return isinstance(x, Held)


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."
