"""A loop carry that starts the same on every worker, inside a coarse step (installed at
import)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from coarse_jax._jax_compat.mean_gradients import in_coarse_trace

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
