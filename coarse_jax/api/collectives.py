"""`coarse.all_reduce`: the mean or sum over the workers of a tree that already exists."""

from __future__ import annotations

from typing import Any

import jax

from coarse_jax import reference
from coarse_jax.api import _latency_route
from coarse_jax.api._phases import finish, push_in_order
from coarse_jax.config import Config
from coarse_jax.dispatch import context


def _check_op(op: str) -> bool:
    if op not in ("mean", "sum"):
        raise ValueError(f"coarse.all_reduce: op must be 'mean' or 'sum', got {op!r}.")
    return op == "mean"


def all_reduce(tree: Any, op: str = "mean", *, config: Config | None = None) -> Any:
    """Mean (or sum) over the workers of every leaf, identical on every device.

    Every worker contributes its values; the proxies sum them in the
    runtime's service.
    Same routes, pieces and rings as `value_and_grad`, without the overlap
    with a backward pass.

    Args:
      tree: pytree of float32/bfloat16/float16 arrays.
      op: "mean" or "sum".
      config: overrides the step's `Config`.

    Returns:
      A tree like ``tree`` holding the reduced values.

    Raises:
      RuntimeError: called outside `coarse.sync`.
      TypeError: a leaf is not a supported float.
      ValueError: ``op`` is neither "mean" nor "sum".

    Example:
      >>> @coarse.sync(mesh)
      ... def step(x):                      # x: 2 rows per worker
      ...     return coarse.all_reduce({"mean": jnp.mean(x), "sum": jnp.sum(x)}, op="sum")
      >>> out = step(jnp.arange(8.0))        # workers hold [0, 1], [2, 3], [4, 5], [6, 7]
      >>> float(out["mean"]), float(out["sum"])
      (14.0, 28.0)
    """
    ctx = context.current("coarse.all_reduce")
    mean = _check_op(op)
    cfg = config or ctx.config
    plan = ctx.plan(jax.eval_shape(lambda t: t, tree), cfg, mean=mean, where="coarse.all_reduce")
    leaves, treedef = jax.tree.flatten(tree)
    if cfg.mode == "reference":
        return reference.all_reduce(tree, ctx.workers, mean)
    if plan.xla:  # the latency route (Config.xla_below_bytes)
        return jax.tree.unflatten(
            treedef,
            _latency_route.all_reduce(
                leaves, ctx.workers, mean, where="coarse.all_reduce", platform=ctx.platform
            ),
        )
    if not leaves:
        return tree
    # A site only for a synchronization that runs (mode="ffi", leaves to reduce).
    call = ctx.call_site(plan, "coarse.all_reduce", pulls_pushed=True)
    last = push_in_order(plan, call, leaves)
    return jax.tree.unflatten(treedef, finish(plan, call, leaves, [last], in_place=False))
