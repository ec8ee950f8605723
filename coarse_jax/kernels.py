"""The runtime's device kernels as single-device ops: pack, unpack, reduce.

The same custom calls run on CPU (``coarse_jax._coarse_cpu``) and on NVIDIA
GPUs (``coarse_jax._coarse_cuda``, CUDA kernels in ``kernels/``), with the
same arithmetic: values pass through float32, are scaled once, and are
rounded once to the output type; ``reduce`` sums in argument order. So the
results equal the plain-jnp expressions in each docstring bit for bit. They
are what the synchronization runtime does to gradient shards, exposed so a
jitted program can use them and tests can hold them against jnp.

Supported dtypes: float32, bfloat16, float16. Not differentiable (they are
data movement for already-computed gradients); under ``vmap`` they run once
per batch element.

Example:
  >>> import jax, jax.numpy as jnp
  >>> from coarse_jax import kernels
  >>> leaves = [jnp.ones((2, 3), jnp.bfloat16), jnp.arange(4.0)]
  >>> buf = jax.jit(lambda xs: kernels.pack(xs, scale=0.5))(leaves)
  >>> buf.shape, buf.dtype
  ((10,), dtype('float32'))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from coarse_jax import _ffi

SUPPORTED = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
MAX_REDUCE_INPUTS = 8  # kernels::kMaxReduceInputs: the inputs travel in the launch's parameters


def _check_dtype(dtype: Any, what: str) -> jnp.dtype:
    dtype = jnp.dtype(dtype)
    if dtype not in SUPPORTED:
        raise TypeError(
            f"coarse_jax.kernels: {what} has dtype {dtype}; expected float32, bfloat16 or "
            f"float16. Cast it first, e.g. x.astype(jnp.float32)."
        )
    return dtype


def _platform() -> str:
    # Where the op will run: the default device if one is set (jax.default_device),
    # else the default backend. Checked at trace time, so a GPU program without
    # the CUDA extension fails here with the fix, not inside XLA's compiler.
    device = jax.config.jax_default_device  # type: ignore[attr-defined]
    if isinstance(device, str):
        return device
    return device.platform if device is not None else jax.default_backend()


def _call(target: str, results: Any, operands: Sequence[jax.Array], scale: float) -> Any:
    _ffi.check_gpu_target(target, _platform())
    return jax.ffi.ffi_call(target, results, vmap_method="sequential")(
        *operands, scale=np.float32(scale)
    )


def pack(leaves: Sequence[jax.Array], dtype: Any = jnp.float32, scale: float = 1.0) -> jax.Array:
    """Lays ``leaves`` end to end in one 1-D buffer, cast to ``dtype`` and scaled.

    Equals ``jnp.concatenate([(x.astype(f32) * scale).ravel() for x in leaves]).astype(dtype)``.
    One launch on a GPU however many leaves (the runtime packs a bucket of
    small gradients this way before a transfer).

    Args:
      leaves: arrays of any shape, float32/bfloat16/float16 (mixed is fine).
      dtype: element type of the buffer.
      scale: multiplies every element (e.g. ``1/p`` for a mean).

    Returns:
      A 1-D array of ``sum(x.size for x in leaves)`` elements of ``dtype``.

    Raises:
      TypeError: a leaf or ``dtype`` is not one of the supported float types.

    Example:
      >>> from coarse_jax import kernels
      >>> kernels.pack([jnp.ones((2, 2)), jnp.arange(3.0)], scale=2.0).tolist()
      [2.0, 2.0, 2.0, 2.0, 0.0, 2.0, 4.0]
    """
    leaves = [jnp.asarray(x) for x in leaves]
    for i, x in enumerate(leaves):
        _check_dtype(x.dtype, f"leaves[{i}]")
    dtype = _check_dtype(dtype, "dtype")
    total = sum(int(x.size) for x in leaves)
    return _call("coarse_pack", jax.ShapeDtypeStruct((total,), dtype), leaves, scale)


def unpack(buffer: jax.Array, like: Sequence[Any], scale: float = 1.0) -> list[jax.Array]:
    """Cuts a packed ``buffer`` back into arrays shaped and typed like ``like``.

    The inverse of `pack`: leaf ``i`` is
    ``(buffer[o_i:o_i + n_i].astype(f32) * scale).astype(like[i].dtype).reshape(like[i].shape)``.

    Args:
      buffer: 1-D float32/bfloat16/float16 array of ``sum(sizes of like)`` elements.
      like: arrays or ``jax.ShapeDtypeStruct`` giving each output's shape and dtype.
      scale: multiplies every element.

    Returns:
      A list of arrays, one per entry of ``like``.

    Raises:
      TypeError: a dtype is not one of the supported float types.
      ValueError: ``buffer`` is not 1-D or its size is not the sum of the sizes.

    Example:
      >>> from coarse_jax import kernels
      >>> like = [jnp.zeros((2,), jnp.bfloat16), jax.ShapeDtypeStruct((1, 2), jnp.float32)]
      >>> a, b = kernels.unpack(jnp.arange(4.0), like, scale=0.5)
      >>> a.dtype, a.tolist(), b.tolist()
      (dtype(bfloat16), [0.0, 0.5], [[1.0, 1.5]])
    """
    buffer = jnp.asarray(buffer)
    _check_dtype(buffer.dtype, "buffer")
    outs = [
        jax.ShapeDtypeStruct(tuple(x.shape), _check_dtype(x.dtype, f"like[{i}]"))
        for i, x in enumerate(like)
    ]
    total = sum(int(np.prod(o.shape, dtype=np.int64)) for o in outs)
    if buffer.ndim != 1 or buffer.shape[0] != total:
        raise ValueError(
            f"coarse_jax.kernels.unpack: buffer has shape {buffer.shape}, expected ({total},): the "
            f"sum of the sizes in `like`. Pass the `like` list the buffer was packed from."
        )
    return list(_call("coarse_unpack", outs, [buffer], scale))


def reduce(*arrays: jax.Array, scale: float = 1.0) -> jax.Array:
    """``scale * (arrays[0] + arrays[1] + ...)``, summed in float32 in argument order.

    The proxies' and the rings' reduction step (``acc += received``, the 1/p
    of a mean folded into the last step). Equals
    ``(sum(x.astype(f32) for x in arrays) * scale).astype(dtype)``.

    Args:
      *arrays: 1 to 8 arrays of one shape and one supported dtype.
      scale: applied once, after the sum.

    Returns:
      An array of the inputs' shape and dtype.

    Raises:
      TypeError: the dtype is not supported, or the arrays' dtypes differ.
      ValueError: no arrays, more than 8, or their shapes differ.

    Example:
      >>> from coarse_jax import kernels
      >>> kernels.reduce(jnp.ones(3), jnp.arange(3.0), scale=0.5).tolist()   # a mean of 2
      [0.5, 1.0, 1.5]
    """
    if not 1 <= len(arrays) <= MAX_REDUCE_INPUTS:
        raise ValueError(
            f"coarse_jax.kernels.reduce: takes 1 to {MAX_REDUCE_INPUTS} arrays, got {len(arrays)}; "
            "reduce a longer list in groups (the result of one group is an input of the next)."
        )
    arrays = tuple(jnp.asarray(x) for x in arrays)
    first = arrays[0]
    _check_dtype(first.dtype, "arrays[0]")
    for i, x in enumerate(arrays[1:], 1):
        if x.dtype != first.dtype:
            raise TypeError(
                f"coarse_jax.kernels.reduce: arrays[{i}] has dtype {x.dtype}, arrays[0] has "
                f"{first.dtype}; cast them to one dtype."
            )
        if x.shape != first.shape:
            raise ValueError(
                f"coarse_jax.kernels.reduce: arrays[{i}] has shape {x.shape}, arrays[0] has "
                f"{first.shape}; they must match."
            )
    return _call("coarse_reduce", jax.ShapeDtypeStruct(first.shape, first.dtype), arrays, scale)
