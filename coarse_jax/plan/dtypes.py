"""The dtypes the proxies synchronize, and the error that names the fix for any other."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

SUPPORTED_DTYPES = (np.dtype("float32"), np.dtype(jax.numpy.bfloat16), np.dtype("float16"))


def _dtype_fix(dt: Any) -> str:
    """The "Fix:" line for a dtype the proxies do not synchronize, fitted to its kind."""
    name = getattr(dt, "name", str(dt))
    if not isinstance(dt, np.dtype):  # jax's extended dtypes: a typed PRNG key
        return (
            f"it is a {name} array, which cannot be summed. Fix: keep keys out of the "
            "synchronized tree (pass them as another argument), or reduce their raw bits, "
            "jax.random.key_data(key), where that is what you mean."
        )
    if dt == np.float64:
        return (
            "the proxies keep float32, bfloat16 and float16 values (float64 comes from "
            "JAX_ENABLE_X64). Fix: cast the tree to float32 for the step, e.g. "
            "jax.tree.map(lambda x: x.astype(jnp.float32), params), or reduce float64 values "
            "with lax.psum(x, 'data') inside the step."
        )
    if jnp.issubdtype(dt, jnp.complexfloating):
        return (
            "the proxies hold real values only. Fix: synchronize the real and imaginary parts "
            "as two float32 leaves (jnp.real(x), jnp.imag(x)) and combine them after."
        )
    if jnp.issubdtype(dt, jnp.floating) and dt.itemsize < 2:  # float8 / float4 (ml_dtypes)
        return (
            "too narrow to sum across workers without losing the result. Fix: keep the "
            "synchronized copy in bfloat16 or float32 and cast to it inside the step, "
            "x.astype(jnp.bfloat16)."
        )
    if not jnp.issubdtype(dt, jnp.inexact):
        return (
            "only float32, bfloat16 and float16 values can be synchronized. Fix: "
            "differentiate/reduce only floating leaves (keep step counters, masks and other "
            "integer or boolean leaves out of the tree, or pass them as other arguments), or "
            "reduce integers with lax.psum(x, 'data') inside the step."
        )
    return (
        "only float32, bfloat16 and float16 values can be synchronized. Fix: cast it to "
        "float32 for the step."
    )


def check_dtype(name: str, dtype: Any, where: str) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError:  # an extended dtype (a PRNG key) numpy does not know
        dt = None
    if dt is None or dt not in SUPPORTED_DTYPES:
        shown = dtype if dt is None else dt
        raise TypeError(
            f"{where}: leaf {name} has dtype {getattr(shown, 'name', shown)}; {_dtype_fix(shown)}"
        )
    return dt
