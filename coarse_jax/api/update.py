"""`coarse.value_and_update`: the proxies as parameter storage.

The workers compute the loss and push gradients from inside the backward
pass exactly as in `coarse.value_and_grad`; each proxy reduce-scatters,
applies the optimizer to the chunk it owns with its 1/p share of the f32
master parameters and optimizer state (runtime memory, no XLA buffer), and
the all-gather carries the updated parameters, which the workers pull and
cast to the params' dtype. The workers hold no optimizer state.

`SyncedStep.optimizer_state` / `master_params` / `load_optimizer_state` /
`reset_optimizer` read and write what the proxies hold (`coarse_jax.api.proxy_state`,
through each call's `coarse_jax.api._stores.ProxyStore`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from coarse_jax.api import _filter
from coarse_jax.api.grad import synced_value_and_grad
from coarse_jax.config import Config
from coarse_jax.dispatch import nnx
from coarse_jax.optim import ProxyOptimizer


def value_and_update(
    fun: Callable[..., Any],
    optimizer: ProxyOptimizer,
    *,
    has_aux: bool = False,
    config: Config | None = None,
    delayed: bool = False,
) -> Callable[..., Any]:
    """Loss and updated params, the optimizer run by the proxies. Inside `coarse.sync`.

    Replaces ``jax.value_and_grad`` + ``lax.pmean`` + ``optax`` update: the
    returned function takes ``(params, *args)`` like ``fun`` and returns
    ``(loss, new_params)`` (``((loss, aux), new_params)`` with ``has_aux``),
    ``loss`` the mean over the workers, ``new_params`` in the params' own
    dtypes (bf16 params get an f32 master on the proxies).

    An Equinox Module as params: the proxies hold its floating-point array
    leaves; the rest (functions, flags, integer arrays) stays on the workers,
    and ``new_params`` is the whole Module.

    State lives on the proxies, per call site of the step: the first call
    seeds the master from the params it gets. Every later call must get the
    params the step returned; other params raise an error naming the first
    differing tensor (use `SyncedStep.load_optimizer_state` or
    `SyncedStep.reset_optimizer` to continue from other params). A step that
    fails (a timeout, Ctrl-C, the params check) leaves the proxies at the
    previous version. Every parameter goes through the proxies
    (``Config.leading_bytes`` is ignored here: the leading layers' optimizer
    state would otherwise live on the workers). ``mode="reference"`` runs the
    optimizer's optax twin in pure JAX, its state threaded through the step.

    Args:
      fun: the loss function; differentiated with respect to its first argument.
      optimizer: a `coarse.optim` optimizer (sgd, adam, adamw).
      has_aux: ``fun`` returns ``(loss, aux)``; aux is each worker's own, as in
        `coarse.value_and_grad`.
      config: overrides the step's `Config`.
      delayed: ZeRO-Offload's one-step delayed parameter update. A call's
        gradients are applied at the start of the next call, on the proxies,
        while that call's forward and backward run; each call returns the
        params updated with the previous call's gradients (the first call
        returns the params it got; the last call's gradients stay pending
        until another call). The gradients are one step stale: call
        t's were computed at the params call t - 1 got. It hides the
        optimizer (host proxies' above all) behind the next step's compute.
        Off by default. Not with ``clip_norm``, snapshots,
        ``mode="reference"`` or across hosts; `SyncedStep.optimizer_state`
        is the state after the last applied update (the one pending gradient
        is not part of optax's state).

    Returns:
      A function of ``(params, *args)`` returning ``(loss, new_params)``, or
      ``((loss, aux), new_params)`` with ``has_aux``.

    Raises:
      TypeError: ``optimizer`` is not a `coarse.optim` optimizer (an optax
        transformation runs on the workers: use `coarse.value_and_grad`), or
        the function was called without params.
      NotImplementedError: the params are an NNX module (split it with
        ``nnx.split`` and pass the params' pytree); ``delayed`` with what it
        does not support.
      RuntimeError: called outside `coarse.sync`; at run time, params that
        are not the ones the step returned last time (the error names the
        first differing tensor).

    Example:
      >>> def loss_fn(params, batch):
      ...     return jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2)
      >>> opt = coarse.optim.adamw(1e-3, weight_decay=0.01)
      >>> @coarse.sync(mesh)
      ... def train_step(params, batch):
      ...     loss, params = coarse.value_and_update(loss_fn, opt)(params, batch)
      ...     return params, loss
      >>> params = {"w": jnp.zeros((3, 1))}
      >>> batch = {"x": jnp.ones((8, 3)), "y": jnp.ones((8, 1))}
      >>> for _ in range(2):
      ...     params, loss = train_step(params, batch)
      >>> float(loss) < 1.0, params["w"].dtype
      (True, dtype('float32'))
    """
    if not isinstance(optimizer, ProxyOptimizer):
        raise TypeError(
            "coarse.value_and_update: optimizer must be a coarse.optim optimizer "
            f"(coarse.optim.sgd / adam / adamw), got {type(optimizer).__name__}. An optax "
            "transformation runs on the workers: use coarse.value_and_grad with it instead."
        )

    @functools.wraps(fun)
    def vu(*args: Any, **kwargs: Any) -> Any:
        if not args:
            raise TypeError("coarse.value_and_update: the function needs the params first.")
        if nnx.is_graph_node(args[0]):
            raise NotImplementedError(
                "coarse.value_and_update takes params as a pytree, not an NNX module. Fix: "
                "graphdef, params, rest = nnx.split(model, nnx.Param, ...), differentiate a "
                "function of params that merges them, and nnx.update the model with the new "
                "params."
            )
        rest = None
        if _filter.needs_filter(args[0]):
            # An Equinox Module: the proxies hold its floating array leaves; the
            # rest (functions, flags, integer arrays) stays here, as it came.
            diff, rest = _filter.partition(args[0])
            whole = fun

            def fun_of_diff(d: Any, *a: Any, **k: Any) -> Any:
                return whole(_filter.combine(d, rest), *a, **k)

            args = (diff, *args[1:])
        out, new_params = synced_value_and_grad(
            fun if rest is None else fun_of_diff,
            args,
            kwargs,
            nums=(0,),
            single=True,
            has_aux=has_aux,
            config=config,
            update=optimizer,
            delayed=delayed,
        )
        return out, (new_params if rest is None else _filter.combine(new_params, rest))

    return vu


def to_jax(tree_leaves: list[np.ndarray], treedef: Any) -> Any:
    return jax.tree.unflatten(treedef, [jnp.asarray(x) for x in tree_leaves])
