"""`coarse.value_and_grad`: gradients pushed to the proxies from inside the backward pass."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from coarse_jax import _ffi, reference
from coarse_jax.api import _filter, _latency_route, _stores
from coarse_jax.api._phases import finish
from coarse_jax.config import Config
from coarse_jax.dispatch import context
from coarse_jax.dispatch import nnx as _nnx
from coarse_jax.optim import ProxyOptimizer
from coarse_jax.plan import BucketPlan, check_dtype


def _push_hook(call: _ffi.CallSite, bucket: BucketPlan, keep: bool = True) -> Callable[..., Any]:
    """Identity on (token, *bucket parameters) whose backward pushes their gradients.

    The token's cotangent arrives from the previous push in plan order and
    leaves as this push's token, so the backward pass issues pushes in the
    order the proxies walk them, each as soon as its gradients exist.
    ``keep=False`` (`coarse.value_and_update`, which needs no gradients back):
    the push takes the gradients without passing them through and the hook
    returns zeros, so each gradient buffer is free once pushed; the token
    chain alone orders what follows.
    """

    @jax.custom_vjp
    def hook(tok: jax.Array, *xs: jax.Array) -> tuple[jax.Array, ...]:
        return (tok, *xs)

    def fwd(tok: jax.Array, *xs: jax.Array) -> tuple[tuple[jax.Array, ...], None]:
        return (tok, *xs), None

    def bwd(_: None, cts: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        # The push's outputs (aliased to its inputs) are the "gradients" the
        # vjp returns, so the pull depends on every push.
        after, *grads = cts
        pushed, tok = _ffi.push(call, _ffi.who(), after, grads, bucket, passthrough=keep)
        if not keep:  # nothing reads them: XLA folds the zeros away
            pushed = [jnp.zeros_like(g) for g in grads]
        return (tok, *pushed)

    hook.defvjp(fwd, bwd)
    return hook


def value_and_grad(
    fun: Callable[..., Any],
    argnums: int | Sequence[int] | Any = 0,
    has_aux: bool = False,
    *,
    config: Config | None = None,
) -> Callable[..., Any]:
    """`jax.value_and_grad`, synchronized the COARSE way. Replaces value_and_grad + pmean.

    Computed on the workers only. Each bucket of gradients is pushed to its
    proxy from inside the backward pass as soon as it exists; proxies
    ring-reduce while the backward pass goes on; the leading layers are
    reduced among the workers; everyone pulls. Returns the mean loss and the
    mean gradients over the workers, identical on every worker.

    ``aux`` (``has_aux=True``) is each worker's own value, as
    `jax.value_and_grad` gives it inside ``shard_map``: reduce what should
    leave the step with `coarse.all_reduce` (e.g. accuracy from per-worker
    logits), or return per-example values through
    ``coarse.sync(..., batch_outputs=...)``.

    An Equinox Module (or a tree holding a leaf that is neither an array nor a
    Python number) is differentiated as ``eqx.filter_value_and_grad`` does: its
    floating-point array leaves, the gradients ``None`` at every other leaf.

    Args:
      fun: the loss function, as for `jax.value_and_grad`.
      argnums: which positional argument(s) to differentiate; for an NNX module also
        ``nnx.DiffState(argnum, filter)`` (its variables matching ``filter``).
      has_aux: ``fun`` returns ``(loss, aux)``.
      config: overrides the step's `Config`.

    Returns:
      A function returning ``(loss, grads)`` or ``((loss, aux), grads)``.

    Raises:
      RuntimeError: called outside `coarse.sync`.
      TypeError: a differentiated leaf is not float32/bfloat16/float16, or the loss is not
        a float scalar.

    Example:
      >>> def loss_fn(params, batch):
      ...     pred = batch["x"] @ params["w"]
      ...     return jnp.mean((pred - batch["y"]) ** 2), pred
      >>> @coarse.sync(mesh)
      ... def step(params, batch):
      ...     (loss, pred), grads = coarse.value_and_grad(loss_fn, has_aux=True)(params, batch)
      ...     return loss, grads, coarse.all_reduce(jnp.mean(pred))  # pred is per worker
      >>> loss, grads, mean_pred = step({"w": jnp.ones((3, 1))}, {"x": jnp.ones((8, 3)),
      ...                                                       "y": jnp.zeros((8, 1))})
      >>> float(loss), grads["w"].ravel().tolist(), float(mean_pred)
      (9.0, [6.0, 6.0, 6.0], 3.0)
    """
    given_argnums = argnums
    # nnx.DiffState(argnum, filter): differentiate that module's variables
    # matching the filter, as nnx.value_and_grad does.
    diff_filter = _nnx.diff_filter(argnums)
    if diff_filter is not None:
        argnums = _nnx.diff_argnum(argnums)
    single = isinstance(argnums, int)
    nums: tuple[int, ...] = (argnums,) if isinstance(argnums, int) else tuple(argnums)

    @functools.wraps(fun)
    def vg(*args: Any, **kwargs: Any) -> Any:
        others = _nnx.other_nodes(args, kwargs, nums)
        if others is not None:  # an nnx.Rngs (or module) the loss uses but is not differentiated
            return _with_nodes_passed(fun, given_argnums, has_aux, config, others, args, kwargs)
        modules = [i for i in nums if _nnx.is_graph_node(args[i])]
        if modules:
            if not single:
                raise NotImplementedError(
                    "coarse.value_and_grad: an NNX module is differentiated with an int argnums "
                    f"naming it (its nnx.Param state), got argnums={argnums!r}. Fix: "
                    "differentiate one module, or pass plain pytrees for a tuple of argnums."
                )
            return _module_value_and_grad(fun, nums[0], diff_filter, has_aux, config, args, kwargs)
        return vg_pytrees(*args, **kwargs)

    def vg_pytrees(*args: Any, **kwargs: Any) -> Any:
        filtered = [i for i in nums if _filter.needs_filter(args[i])]
        if filtered:  # an Equinox Module: its floating array leaves, as eqx differentiates
            parts = {i: _filter.partition(args[i]) for i in filtered}

            def on_diff(*a: Any, **k: Any) -> Any:
                whole = [
                    _filter.combine(x, parts[i][1]) if i in parts else x for i, x in enumerate(a)
                ]
                return fun(*whole, **k)

            diff_args = tuple(parts[i][0] if i in parts else x for i, x in enumerate(args))
            return synced_value_and_grad(
                on_diff, diff_args, kwargs, nums=nums, single=single, has_aux=has_aux, config=config
            )
        return synced_value_and_grad(
            fun, args, kwargs, nums=nums, single=single, has_aux=has_aux, config=config
        )

    return vg


def _with_nodes_passed(
    fun: Callable[..., Any],
    argnums: Any,
    has_aux: bool,
    config: Config | None,
    others: _nnx.OtherNodes,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """``coarse.value_and_grad(fun)(*args, **kwargs)`` with the NNX objects ``others`` names
    (not differentiated: the ``nnx.Rngs`` flax's MNIST passes to its loss, say) passed
    into the loss as their state.

    As ``nnx.value_and_grad`` does: the loss runs inside a trace of its own, where
    flax refuses to mutate an object made outside it (``TraceContextError: Cannot
    mutate RngCount from a different trace level``). Each object is merged afresh
    inside the loss from its state; what the loss changed (an RNG count that
    advanced, a metric) leaves as aux and is written back into the caller's object.
    """
    args2, kwargs2 = others.without(args, kwargs)

    def with_state(*a_and_state: Any, **k: Any) -> Any:
        *a, state = a_and_state
        nodes = _nnx.merge(others.graphdef, state)
        call_args, call_kwargs = others.put(a, k, nodes)
        out = fun(*call_args, **call_kwargs)
        loss, aux = out if has_aux else (out, None)
        return loss, (aux, _nnx.changed_state(state, nodes))

    inner = value_and_grad(with_state, argnums=argnums, has_aux=True, config=config)
    (loss, (aux, carried)), grads = inner(*args2, others.state, **kwargs2)
    _nnx.update(others.nodes, carried)
    return ((loss, aux) if has_aux else loss), grads


def _module_value_and_grad(
    fun: Callable[..., Any],
    m: int,
    diff_filter: Any,
    has_aux: bool,
    config: Config | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """``nnx.value_and_grad``'s contract for the module at position ``m``.

    The module is split into its ``nnx.Param`` state (differentiated; the
    gradients come back as an ``nnx.State``) and the rest; inside the loss
    it is merged again, and whatever the loss changed in the rest (batch
    statistics, RNG counts) leaves as aux (each worker's own) and is written
    back into the module; `coarse.sync` then averages it over the workers.
    """
    module = args[m]
    graphdef, params, rest = _nnx.diff_split(module, diff_filter)

    def pure(params: Any, rest: Any, *others: Any) -> Any:
        inner = _nnx.merge(graphdef, params, rest)
        call = [*others[:m], inner, *others[m:]]
        out = fun(*call, **kwargs)
        loss, aux = out if has_aux else (out, None)
        return loss, (aux, _nnx.changed_state(rest, inner))

    others = [a for i, a in enumerate(args) if i != m]
    wrapped = value_and_grad(pure, argnums=0, has_aux=True, config=config)
    (loss, (aux, carried)), grads = wrapped(params, rest, *others)
    _nnx.update(module, carried)
    return ((loss, aux) if has_aux else loss), grads


def _output_shape(
    fun: Callable[..., Any], nums: tuple[int, ...], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``fun``'s output shapes, tracing what ``jax.value_and_grad`` would: the differentiated
    arguments and every array; other leaves of the other arguments (a Python flag under
    ``if train:``, a string) reach ``fun`` as they are."""
    flat, tree = jax.tree.flatten((args, kwargs))
    diff = [i in nums for i, a in enumerate(args) for _ in jax.tree.leaves(a)]
    diff += [False] * (len(flat) - len(diff))  # the keyword arguments' leaves
    traced = [
        d or isinstance(x, (jax.Array, np.ndarray, np.generic))
        for x, d in zip(flat, diff, strict=True)
    ]

    def call(*arrays: Any) -> Any:
        it = iter(arrays)
        a, k = jax.tree.unflatten(
            tree, [next(it) if t else x for x, t in zip(flat, traced, strict=True)]
        )
        return fun(*a, **k)

    return jax.eval_shape(call, *[x for x, t in zip(flat, traced, strict=True) if t])


@dataclasses.dataclass(frozen=True)
class _Sync:
    """One traced value_and_grad / value_and_update: the call and what both paths share."""

    ctx: context.SyncContext
    fun: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    update: ProxyOptimizer | None  # value_and_update's optimizer
    where: str
    cfg: Config
    plan: Any  # the sync's Plan: gradient leaves (flatten order), then the loss
    n_grad: int
    grads_def: Any  # the gradients' tree structure
    aux_def: Any  # aux's tree structure (None without aux)
    nums: tuple[int, ...]
    has_aux: bool
    call: _ffi.CallSite | None = None  # the ffi path's call site (the optimizer's attributes too)
    store: _stores.ProxyStore | None = None  # the ffi path's value_and_update store


def _vjp(
    sync: _Sync,
    *,
    wrap: Callable[[list[jax.Array], jax.Array | None], tuple[list[jax.Array], Any]] | None = None,
    first_token: bool = False,
) -> tuple[Any, Any, Any]:
    """(loss, vjp function, aux) of ``fun`` at the differentiated arguments, on one worker.

    ``wrap(leaves, token)``, the ffi path's push hooks: given the
    differentiated leaves (flatten order) and the token chain's start, returns
    the leaves to differentiate through and the chain's end, which is tied to
    the loss (adds 0) so its cotangent exists. ``first_token``: the token is
    differentiated too (`coarse.value_and_update`, whose gradients are not
    returned: its cotangent, the last push's token, orders what follows).
    """
    fun, args, kwargs = sync.fun, sync.args, sync.kwargs
    diff = [_ffi.vary(args[i]) for i in sync.nums]  # varying: no implicit psum in the vjp
    diff_leaves, diff_def = jax.tree.flatten(tuple(diff))

    def f(*all_args: jax.Array) -> Any:
        first_tok, leaves = (
            (all_args[0], list(all_args[1:])) if first_token else (None, list(all_args))
        )
        tok = None
        if wrap is not None:
            leaves, tok = wrap(leaves, first_tok)
        fun_args = list(args)
        for i, v in zip(sync.nums, jax.tree.unflatten(diff_def, leaves), strict=True):
            fun_args[i] = v
        out = fun(*fun_args, **kwargs)
        if tok is None:
            return out
        if sync.has_aux:
            return out[0] + 0.0 * tok.astype(out[0].dtype), out[1]
        return out + 0.0 * tok.astype(out.dtype)

    primals = [_ffi.token(), *diff_leaves] if first_token else diff_leaves
    if sync.has_aux:
        loss, vjp_fn, aux = jax.vjp(f, *primals, has_aux=True)
        return loss, vjp_fn, aux
    loss, vjp_fn = jax.vjp(f, *primals)
    return loss, vjp_fn, None


def _result(sync: _Sync, leaves: list[jax.Array], aux: Any) -> Any:
    """``(loss, grads)`` or ``((loss, aux), grads)`` from the synced leaves."""
    grads = jax.tree.unflatten(sync.grads_def, leaves[: sync.n_grad])
    (loss,) = leaves[sync.n_grad :]
    if sync.has_aux:
        return (loss, aux), grads
    return loss, grads


def _reference(sync: _Sync) -> Any:
    """mode="reference", or the latency route (`Plan.xla`): the same values through
    pure JAX collectives (and optax); the route reduces the tree as one psum."""
    ctx, update = sync.ctx, sync.update
    loss, vjp_fn, aux = _vjp(sync)
    grads = list(vjp_fn(jnp.ones_like(loss)))
    leaves = _ffi.vary([*grads, loss])
    if update is not None:  # the mean in f32, as the proxies keep it
        leaves = [x.astype(jnp.float32) if t < sync.n_grad else x for t, x in enumerate(leaves)]
    if sync.cfg.mode == "reference":
        leaves = reference.all_reduce(leaves, ctx.workers)
    else:
        leaves = _latency_route.all_reduce(
            leaves, ctx.workers, where=sync.where, platform=ctx.platform
        )
    if update is not None:
        leaves[: sync.n_grad] = _stores.reference_update(
            ctx, update, sync.args[0], leaves[: sync.n_grad]
        )
    return _result(sync, leaves, aux)


def _ffi_sync(sync: _Sync) -> Any:
    """mode="ffi": each bucket pushed from inside the backward pass, the proxies' ring
    (with the optimizer for `coarse.value_and_update`), the pull."""
    plan, n_grad, call, store = sync.plan, sync.n_grad, sync.call, sync.store
    assert call is not None
    # value_and_update: the gradients are not returned, only pushed; the
    # chain's first token is differentiated too, so its cotangent (the last
    # push's token) comes out of the vjp and orders the ring after the pushes.
    lean = store is not None

    def hooks(leaves: list[jax.Array], first_tok: jax.Array | None) -> tuple[list[jax.Array], Any]:
        # Chained in reverse plan order here, so that in the backward pass
        # the token runs in plan order.
        tok = first_tok if first_tok is not None else _ffi.token()
        for b in reversed(plan.buckets):
            ids = plan.bucket_leaves(b)
            if ids[0] < n_grad:
                hook = _push_hook(call, b, keep=not lean)
                tok, *hooked = hook(tok, *[leaves[t] for t in ids])
                for t, v in zip(ids, hooked, strict=True):
                    leaves[t] = v
        return leaves, tok

    # The sync's first call, ahead of the forward pass: the proxies' jobs
    # start while it runs, ready before the first push (`coarse_jax._ffi.begin`).
    # Without proxy leaves there are no jobs to start.
    me = _ffi.who()
    begin = _ffi.begin(call, me) if plan.num_proxy_leaves > 0 else None
    loss, vjp_fn, aux = _vjp(sync, wrap=hooks, first_token=lean)
    # The loss is known after the forward pass: push it now (it comes first
    # in plan order), passing it through so its push cannot be dropped; the
    # backward pass's pushes follow it in the token chain through the seed.
    head = [loss]
    tok = begin if begin is not None else _ffi.token()
    for b in plan.buckets:
        ids = plan.bucket_leaves(b)
        if ids[0] >= n_grad:
            pushed, tok = _ffi.push(
                call, me, tok, [head[t - n_grad] for t in ids], b, passthrough=True
            )
            for t, v in zip(ids, pushed, strict=True):
                head[t - n_grad] = v
    seed = jnp.ones_like(loss) + 0.0 * tok.astype(loss.dtype)
    grads = list(vjp_fn(seed))
    update = None
    if store is not None:
        # The pushes' last token stands for the gradients. The pull writes the
        # new params over the old ones (donated, or copied by XLA): nothing the
        # size of the gradients stays alive.
        last_push, *head_leaves = _ffi.vary([grads[0], *head])
        params = list(jax.tree.leaves(sync.args[0]))
        leaves, pushed = params + head_leaves, [last_push]
        update = store.ring_update(call, params, leaves)
    else:
        leaves = _ffi.vary(grads + head)
        # The pushed values (pass-through outputs) order the rest after the pushes.
        pushed = [leaves[t] for t in plan.proxy_leaves]
    leaves = finish(plan, call, leaves, pushed, in_place=True, update=update)
    if store is not None:  # which step inputs and outputs these are (dispatch/params_check.py)
        sync.ctx.update_io.append((store.runtime.id, params, leaves[: sync.n_grad]))
    return _result(sync, leaves, _ffi.vary(aux) if aux is not None else None)


def synced_value_and_grad(
    fun: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    nums: tuple[int, ...],
    single: bool,
    has_aux: bool,
    config: Config | None,
    update: ProxyOptimizer | None = None,
    delayed: bool = False,
) -> Any:
    """`value_and_grad` of pytree arguments; with ``update``, `coarse.value_and_update`'s.

    With ``update`` (``nums == (0,)``) the proxies turn the mean gradients
    into new parameters (`coarse_jax.api.update`) and what comes back in
    place of the gradients is the updated params, in the params' dtypes.
    It checks the differentiated leaves and the loss and plans the sync;
    then the ffi path (`_ffi_sync`) or the reference path (`_reference`)
    runs it, both through the same forward/backward (`_vjp`).
    """
    where = "coarse.value_and_update" if update is not None else "coarse.value_and_grad"
    ctx = context.current(where)
    cfg = config or ctx.config
    if update is not None:
        cfg = _stores.check_config(cfg)
        if delayed:
            _stores.check_delayed(cfg, update, ctx.snapshot_every)
    for i in nums:
        for path, leaf in jax.tree_util.tree_flatten_with_path(args[i])[0]:
            check_dtype(
                f"{jax.tree_util.keystr(path) or '<root>'} of argument {i}",
                jnp.result_type(leaf),
                where,
            )
    out_shape = _output_shape(fun, nums, args, kwargs)
    loss_shape, aux_shape = out_shape if has_aux else (out_shape, None)
    if getattr(loss_shape, "shape", None) != () or not jnp.issubdtype(
        loss_shape.dtype, jnp.floating
    ):
        raise TypeError(f"{where}: fun must return a float scalar loss, got {loss_shape}.")
    diff_shapes = tuple(jax.eval_shape(lambda x: x, args[i]) for i in nums)
    grads_shape = diff_shapes[0] if single else diff_shapes
    # Sync tree: gradients first in flatten order (so the leading split
    # takes the first layers), then the loss (pushed first: the sync
    # order is the reverse). Group 1 keeps the loss out of gradient
    # pieces. Aux is not synchronized: each worker keeps its own.
    shapes = (grads_shape, loss_shape)
    groups = (jax.tree.map(lambda _: 0, grads_shape), 1)
    names = [
        ("params" if update is not None else "grads") + jax.tree_util.keystr(path)
        for path, _ in jax.tree_util.tree_flatten_with_path(grads_shape)[0]
    ] + ["loss"]
    plan = ctx.plan(shapes, cfg, groups=groups, names=names, where=where)
    n_grad = len(jax.tree.leaves(grads_shape))
    call = store = None
    ffi = cfg.mode == "ffi" and not plan.xla  # plan.xla: Config.xla_below_bytes
    if ffi:
        call = ctx.call_site(plan, where, pulls_pushed=update is None)
        if update is not None:
            # call: with the optimizer's attributes, on every call of the site
            store, call = _stores.register(ctx, call, plan, update, args[0], n_grad, delayed)
    sync = _Sync(
        ctx=ctx,
        fun=fun,
        args=args,
        kwargs=kwargs,
        update=update,
        where=where,
        cfg=cfg,
        plan=plan,
        n_grad=n_grad,
        grads_def=jax.tree.structure(grads_shape),
        aux_def=jax.tree.structure(aux_shape),
        nums=nums,
        has_aux=has_aux,
        call=call,
        store=store,
    )
    run = _ffi_sync if ffi else _reference
    return run(sync)
