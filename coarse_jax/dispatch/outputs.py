"""What a `coarse.sync` step may return: values the same on every device, or per-example ones.

Outputs leave ``shard_map`` replicated, so each must be identical on every
device of the mesh; a per-worker value (aux, logits, a metric computed on the
worker's shard) gets an error in coarse's words naming the output and the
fix, instead of JAX's message about ``check_vma``. Outputs named by
``batch_outputs`` are per-example instead: the workers' values are
concatenated along axis 0 (global logits, say).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from coarse_jax import _ffi
from coarse_jax.mesh import PROGRAM_HOST_AXES, TIER


def split(out: Any, batch_outputs: Sequence[int], step: str) -> tuple[Any, tuple[Any, ...]]:
    """(replicated part, per-example part): positions ``batch_outputs`` of a tuple output."""
    if not batch_outputs:
        return out, ()
    if not isinstance(out, tuple):
        raise TypeError(
            f"coarse.sync({step}): batch_outputs={tuple(batch_outputs)} names positions of a "
            f"tuple output, but the step returned {type(out).__name__}. Fix: return a tuple, "
            "e.g. (state, loss, logits), and name the per-example positions."
        )
    n = len(out)
    for i in batch_outputs:
        if not 0 <= i < n:
            raise ValueError(
                f"coarse.sync({step}): batch_outputs names output {i}, but the step returned "
                f"{n} outputs."
            )
    replicated = tuple(None if i in batch_outputs else o for i, o in enumerate(out))
    return replicated, tuple(_per_example(out[i]) for i in batch_outputs)


def join(replicated: Any, per_example: tuple[Any, ...], batch_outputs: Sequence[int]) -> Any:
    if not batch_outputs:
        return replicated
    out = list(replicated)
    for i, v in zip(batch_outputs, per_example, strict=True):
        out[i] = v
    return tuple(out)


def _collapse_tier(x: Any) -> Any:
    if not isinstance(x, jax.Array) or TIER not in jax.typeof(x).mat.varying:
        return x
    # "tier" has size 1 in the workers' program: the sum over it is the value
    # itself, and it tells jax that the value no longer varies over "tier".
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        impl = jax.random.key_impl(x)
        return jax.random.wrap_key_data(lax.psum(jax.random.key_data(x), TIER), impl=impl)
    if x.dtype == jnp.bool_:
        return lax.psum(x.astype(jnp.int8), TIER).astype(jnp.bool_)
    return lax.psum(x, TIER)


def collapse_tier(tree: Any) -> Any:
    """``tree`` with every leaf that varies over "tier" made invariant over it (same values).

    The workers' program binds "tier" with size 1 (`coarse_jax.mesh.workers_mesh`), so a
    value computed from ``lax.axis_index("tier")`` is the same on every worker's one tier
    index; jax still types it as varying over "tier", which an output may not.
    """
    return jax.tree.map(_collapse_tier, tree)


def _per_example(tree: Any) -> Any:
    # Each worker's own rows, varying over "data" (the program spans the workers only).
    return jax.tree.map(lambda x: _ffi.vary(jnp.asarray(x)), tree)


def check_replicated(out: Any, step: str, batch_outputs: Sequence[int]) -> None:
    """Raises naming the first output that differs per device, with the fix."""
    for path, x in jax.tree_util.tree_flatten_with_path(out)[0]:
        if not isinstance(x, jax.Array):
            continue
        axes = [a for a in PROGRAM_HOST_AXES if a in jax.typeof(x).mat.varying]
        if not axes:
            continue
        where = jax.tree_util.keystr(path) or "(the whole output)"
        position = path[0].idx if path and hasattr(path[0], "idx") else None
        example = f"batch_outputs=({position},)" if position is not None else "batch_outputs=(i,)"
        raise TypeError(
            f"coarse.sync({step}): output {where} differs per device (it varies over "
            f"{' and '.join(repr(a) for a in axes)}), but a step's outputs must be the same on "
            "every device. Fix: reduce it inside the step with coarse.all_reduce(...) (a "
            "metric, say), or, for per-example values such as logits, return it through "
            f"coarse.sync(..., {example}), which concatenates the workers' values along axis 0."
        )
