"""`coarse.all_reduce` (a tree that already exists) and `coarse.on_workers`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from coarse_jax import _ffi, reference
from coarse_jax.api import _context, _nnx
from coarse_jax.api._phases import finish, push_in_order, tier_is_worker, zeros_like_shapes
from coarse_jax.config import Config


def on_workers(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Returns ``fn`` run on the worker tier only; proxies return zeros of the same shapes.

    Outputs vary per device; send them through `coarse.all_reduce` before
    returning them from the step. ``fn`` itself must not synchronize: a
    coarse call inside it would run on the workers alone (every device of the
    mesh takes part in one), so it raises TypeError while tracing. How the
    workers alone run it follows ``Config.worker_compute`` ("all" on CPU:
    every device computes and the proxies' results are replaced by zeros;
    "cond": a ``lax.cond`` on the tier). NNX modules passed as arguments may
    change their state inside, as under ``nnx.cond``.

    Args:
      fn: the function to run on the workers.

    Returns:
      A function with ``fn``'s signature, to call inside a `coarse.sync`
      step.

    Raises:
      RuntimeError: the returned function is called outside `coarse.sync`.
      TypeError: ``fn`` makes a coarse call (`coarse.value_and_grad`,
        `coarse.all_reduce`, ...) while traced.

    Example:
      >>> @coarse.sync(mesh)
      ... def evaluate(w, x):
      ...     pred = coarse.on_workers(lambda w, x: x @ w)(w, x)     # per worker, proxies: 0
      ...     return coarse.all_reduce(jnp.mean(pred))
      >>> float(evaluate(jnp.ones((3,)), jnp.ones((8, 3))))
      3.0
    """

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        ctx = _context.current("coarse.on_workers")
        with _context.workers_only(ctx):  # a coarse call inside fn raises TypeError
            return _run_on_workers(ctx, fn, args, kwargs)

    return wrapped


def _run_on_workers(
    ctx: _context.SyncContext, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Any
) -> Any:
    if ctx.worker_compute(ctx.config) == "all":  # see Config.worker_compute
        out = _ffi.vary(fn(*args, **kwargs))
        return jax.tree.map(lambda v: jnp.where(tier_is_worker(), v, jnp.zeros_like(v)), out)
    modules = _nnx.graph_positions(args)
    if modules:
        return _on_workers_with_modules(fn, modules, args, kwargs)
    shapes = jax.eval_shape(lambda *a: fn(*a, **kwargs), *args)
    return lax.cond(
        tier_is_worker(),
        lambda *a: _ffi.vary(fn(*a, **kwargs)),
        lambda *a: zeros_like_shapes(shapes),
        *args,
    )


def _on_workers_with_modules(
    fn: Callable[..., Any], modules: tuple[int, ...], args: tuple[Any, ...], kwargs: Any
) -> Any:
    """`on_workers` for NNX modules among the arguments, as ``nnx.cond`` does it.

    The modules enter the conditional as their state and are merged inside;
    what ``fn`` changed in them (batch statistics, RNG counts) leaves it and is
    written back (proxies: zeros, which `coarse.sync` then replaces by the
    workers' mean).
    """
    nodes = tuple(args[i] for i in modules)
    graphdef, state = _nnx.split(nodes)
    plain = [a for i, a in enumerate(args) if i not in modules]

    def run(state: Any, *plain: Any) -> Any:
        inner = _nnx.merge(graphdef, state)
        call, rest = list(plain), iter(inner)
        for i in modules:
            call.insert(i, next(rest))
        out = fn(*call, **kwargs)
        return out, _nnx.changed_state(state, inner)

    shapes = jax.eval_shape(run, state, *plain)
    out, changed = lax.cond(
        tier_is_worker(),
        lambda *a: _ffi.vary(run(*a)),
        lambda *a: zeros_like_shapes(shapes),
        state,
        *plain,
    )
    _nnx.update(nodes, changed)
    return out


def _check_op(op: str) -> bool:
    if op not in ("mean", "sum"):
        raise ValueError(f"coarse.all_reduce: op must be 'mean' or 'sum', got {op!r}.")
    return op == "mean"


def all_reduce(tree: Any, op: str = "mean", *, config: Config | None = None) -> Any:
    """Mean (or sum) over the workers of every leaf, identical on every device.

    The values the proxies hold are ignored: only the worker tier contributes.
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
    ctx = _context.current("coarse.all_reduce")
    mean = _check_op(op)
    cfg = config or ctx.config
    plan = ctx.plan(jax.eval_shape(lambda t: t, tree), cfg, mean=mean, where="coarse.all_reduce")
    if cfg.mode == "reference":
        return reference.all_reduce(tree, ctx.workers, mean)
    leaves, treedef = jax.tree.flatten(tree)
    if not leaves:
        return tree
    call = ctx.call_site(plan, "coarse.all_reduce", pulls_pushed=True)
    last = push_in_order(plan, call, leaves)
    return jax.tree.unflatten(treedef, finish(plan, call, leaves, [last], in_place=False))
