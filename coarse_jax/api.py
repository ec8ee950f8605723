"""The public API: `sync`, `value_and_grad`, `all_reduce`, `on_workers`."""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from coarse_jax import _ffi, reference
from coarse_jax.config import Config
from coarse_jax.mesh import DATA, TIER, check_mesh
from coarse_jax.plan import Plan, check_dtype
from coarse_jax.plan import plan as make_plan

# ----------------------------------------------------------------------------- context


@dataclasses.dataclass
class _SyncContext:
    """What a traced `coarse.sync` step knows: its mesh, config and call sites."""

    mesh: Mesh
    config: Config
    next_site: int = 0
    # (tree, keyword arguments) of every plan built with the step's own
    # Config: re-profiling re-plans them to see whether anything changed.
    plans: list[tuple[Any, dict[str, Any]]] = dataclasses.field(default_factory=list)

    @property
    def workers(self) -> int:
        return self.mesh.shape[DATA]

    def plan(self, tree: Any, cfg: Config, **kwargs: Any) -> Plan:
        if cfg is self.config:
            self.plans.append((tree, kwargs))
        return make_plan(tree, self.workers, cfg, **kwargs)

    def new_site(self) -> int:
        # Each synchronization in one program gets its own site: the runtime
        # keys its rendezvous by (execution, site).
        site = self.next_site
        self.next_site += 1
        return site


_local = threading.local()


def _stack() -> list[_SyncContext]:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def _current(where: str) -> _SyncContext:
    if not _stack():
        raise RuntimeError(
            f"{where} was called outside a coarse.sync step: it synchronizes over the "
            "'tier' and 'data' axes of a coarse mesh, which only exist inside it. Fix: decorate "
            "the train step with @coarse.sync(mesh) and call it from there."
        )
    return _stack()[-1]


# ----------------------------------------------------------------------------- sync


def _signature(tree: Any) -> tuple[Any, tuple[tuple[tuple[int, ...], str], ...]]:
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((tuple(jnp.shape(x)), str(jnp.result_type(x))) for x in leaves)


def sync(
    fn: Callable[..., Any] | Mesh | None = None,
    mesh: Mesh | None = None,
    *,
    config: Config | None = None,
    batch_argnums: int | Sequence[int] | None = None,
) -> Any:
    """Runs a train step as one SPMD program over the two-tier mesh.

    ``jit(shard_map(fn))``: arguments other than the batch are replicated on all
    devices, the batch's leading axis is split over "data" (each worker and its
    proxy see the same shard), outputs are replicated. Inside, use
    `coarse.value_and_grad` / `coarse.all_reduce` / `coarse.on_workers`.

    The first call fixes the structure and shapes of the non-batch arguments
    (the plan is compiled for them); a later call with a different structure
    raises instead of silently re-planning. The batch may change shape
    (that recompiles, as ``jax.jit`` does). With ``Config(reprofile_every=N)``
    the links are profiled again every N calls and the step re-planned,
    recompiling only if routes, threshold or shard size changed. The returned
    step has ``step.config()`` (the Config in use) and ``step.stats()``.

    Args:
      fn: the step; or the mesh, for ``@coarse.sync(mesh)``.
      mesh: a mesh from `coarse.make_mesh`.
      config: default `Config` for the coarse calls inside.
      batch_argnums: which positional arguments are sharded over "data";
        default: the last one.

    Returns:
      The compiled step (or a decorator).

    Raises:
      TypeError/ValueError: the mesh is not a coarse mesh, or arguments changed.

    Example:
      >>> @coarse.sync(mesh)
      ... def train_step(state, batch):
      ...     loss, grads = coarse.value_and_grad(loss_fn)(state.params, batch)
      ...     return state.apply_gradients(grads=grads), loss
    """
    if isinstance(fn, Mesh) and mesh is None:
        fn, mesh = None, fn
    if fn is None:
        return lambda f: sync(f, mesh=mesh, config=config, batch_argnums=batch_argnums)
    mesh = check_mesh(mesh, "coarse.sync")
    step_name = getattr(fn, "__name__", "step")
    # The config can change when re-profiling re-plans; a compiled program is
    # kept per config, so an unchanged plan never recompiles.
    state: dict[str, Any] = {"config": config or Config(), "calls": 0, "reprofiles": 0}
    compiled: dict[tuple[int, tuple[int, ...], Config], Callable[..., Any]] = {}
    seen: dict[int, Any] = {}

    plans: list[tuple[Any, dict[str, Any]]] = []  # what the traces planned

    def make_body(cfg: Config) -> Callable[..., Any]:
        def body(*args: Any) -> Any:
            ctx = _SyncContext(mesh, cfg, plans=plans)
            _stack().append(ctx)
            try:
                return fn(*args)
            finally:
                _stack().pop()

        return body

    def plan_keys(cfg: Config) -> list[int]:
        return [make_plan(t, mesh.shape[DATA], cfg, **kw).ffi_attrs()["plan_key"] for t, kw in plans]

    def maybe_reprofile() -> None:
        cfg = state["config"]
        state["calls"] += 1
        if not cfg.reprofile_every or state["calls"] % cfg.reprofile_every:
            return
        from coarse_jax.profiler import profile

        old = cfg.profile
        topology = (
            dataclasses.replace(cfg.topology, time_scale=old.time_scale) if cfg.topology else None
        )
        fresh = profile(mesh, topology=topology, sizes=old.sizes, reps=3)
        kept = {
            f.name: getattr(cfg, f.name)
            for f in dataclasses.fields(cfg)
            if f.name not in ("routes", "latency_threshold_bytes", "shard_bytes", "profile")
        }
        new = Config.from_profile(fresh, **kept)
        state["reprofiles"] += 1
        # Switch (and recompile) only if some plan of this step changes: a
        # threshold that moved between two piece sizes routes nothing else.
        if plan_keys(new) != plan_keys(cfg):
            plans.clear()
            state["config"] = new

    @functools.wraps(fn)
    def step(*args: Any) -> Any:
        n = len(args)
        if n == 0:
            raise TypeError(f"coarse.sync({step_name}): the step needs at least a batch argument.")
        if batch_argnums is None:
            bnums: tuple[int, ...] = (n - 1,)
        else:
            raw = (batch_argnums,) if isinstance(batch_argnums, int) else tuple(batch_argnums)
            bnums = tuple(b % n for b in raw)
        p = mesh.shape[DATA]
        for i, arg in enumerate(args):
            if i in bnums:
                for x in jax.tree.leaves(arg):
                    if jnp.ndim(x) == 0 or jnp.shape(x)[0] % p:
                        raise ValueError(
                            f"coarse.sync({step_name}): batch argument {i} must have a leading "
                            f"axis divisible by the {p} workers, got a leaf of shape "
                            f"{jnp.shape(x)}. Fix: use a global batch size that is a multiple "
                            f"of {p}."
                        )
                continue
            sig = _signature(arg)
            if i not in seen:
                seen[i] = sig
            elif seen[i] != sig:
                raise ValueError(
                    f"coarse.sync({step_name}): argument {i} changed structure or shapes between "
                    f"calls; the step was planned and compiled for {seen[i][0]} with leaves "
                    f"{seen[i][1][:4]}{'...' if len(seen[i][1]) > 4 else ''}, got {sig[0]} with "
                    f"{sig[1][:4]}{'...' if len(sig[1]) > 4 else ''}. Fix: keep the state's "
                    "structure fixed during training, or decorate a new function with "
                    "coarse.sync for the new tree."
                )
        cfg = state["config"]
        key = (n, bnums, cfg)
        if key not in compiled:
            if cfg.mode == "ffi":
                _ffi.check_platform(mesh)
            in_specs = tuple(P(DATA) if i in bnums else P() for i in range(n))
            compiled[key] = jax.jit(
                jax.shard_map(make_body(cfg), mesh=mesh, in_specs=in_specs, out_specs=P())
            )
        out = compiled[key](*args)
        maybe_reprofile()
        return out

    step.mesh = mesh  # type: ignore[attr-defined]
    step.config = lambda: state["config"]  # type: ignore[attr-defined]
    step.stats = lambda: {  # type: ignore[attr-defined]
        "calls": state["calls"],
        "reprofiles": state["reprofiles"],
        "compiled": len(compiled),
    }
    return step


# ----------------------------------------------------------------------------- helpers


def _tier_is_worker() -> jax.Array:
    return lax.axis_index(TIER) == 0


def _zeros_like_shapes(shapes: Any) -> Any:
    return _ffi.vary(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes))


def on_workers(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Returns ``fn`` run on the worker tier only; proxies return zeros of the same shapes.

    Outputs vary per device; send them through `coarse.all_reduce` before
    returning them from the step.

    Example:
      >>> logits = coarse.on_workers(model.apply)(params, batch["x"])
    """

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        ctx = _current("coarse.on_workers")
        if ctx.config.worker_compute == "all":  # see Config.worker_compute
            out = _ffi.vary(fn(*args, **kwargs))
            return jax.tree.map(lambda v: jnp.where(_tier_is_worker(), v, jnp.zeros_like(v)), out)
        shapes = jax.eval_shape(lambda *a: fn(*a, **kwargs), *args)
        return lax.cond(
            _tier_is_worker(),
            lambda *a: _ffi.vary(fn(*a, **kwargs)),
            lambda *a: _zeros_like_shapes(shapes),
            *args,
        )

    return wrapped


def _finish(plan: Plan, site: int, leaves: list[jax.Array], pushed: Sequence[jax.Array],
            in_place: bool) -> list[jax.Array]:
    """Proxy ring, worker ring and pull, after this device's pushes (``pushed``).

    ``leaves`` in tree order. ``in_place``: the leaves are dead temporaries
    (gradients) the results may overwrite.
    """
    me = _ffi.who()
    out = list(leaves)
    has_proxy = plan.num_proxy_leaves > 0
    has_lead = len(plan.leading_leaves) > 0
    proxy_vals = [leaves[t] for t in plan.proxy_leaves]
    token = None
    if has_proxy:
        token = _ffi.proxy_ring(me, pushed, plan, site, last=False)
    if has_lead:
        if token is None:
            token = _ffi.vary(jnp.zeros((), jnp.int32))
        lead_vals = [leaves[t] for t in plan.leading_leaves]
        reduced, token = _ffi.worker_ring(
            me, token, lead_vals, plan, site, last=not has_proxy, alias=in_place
        )
        for t, v in zip(plan.leading_leaves, reduced):
            out[t] = v
    if has_proxy:
        for t, v in zip(plan.proxy_leaves, _ffi.pull(me, token, proxy_vals, plan, site, alias=in_place)):
            out[t] = v
    return out


def _bucket_leaves(plan: Plan, bucket: Any) -> list[int]:
    """Tree indices of a bucket's leaves, in the order the push takes them."""
    return [plan.sync_order[s] for s in range(bucket.first_leaf, bucket.first_leaf + bucket.num_leaves)]


def _push_in_order(plan: Plan, site: int, leaves: list[jax.Array]) -> jax.Array:
    """Pushes every bucket of ``leaves`` (tree order), chained in plan order; returns the last token."""
    me, tok = _ffi.who(), _ffi.token()
    for b in plan.buckets:
        _, tok = _ffi.push(me, tok, [leaves[t] for t in _bucket_leaves(plan, b)], plan, b, site,
                           passthrough=False)
    return tok


def _check_op(op: str) -> bool:
    if op not in ("mean", "sum"):
        raise ValueError(f"coarse.all_reduce: op must be 'mean' or 'sum', got {op!r}.")
    return op == "mean"


# ----------------------------------------------------------------------------- all_reduce


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

    Example:
      >>> metrics = coarse.all_reduce({"accuracy": acc})
    """
    ctx = _current("coarse.all_reduce")
    mean = _check_op(op)
    cfg = config or ctx.config
    plan = ctx.plan(jax.eval_shape(lambda t: t, tree), cfg, mean=mean, where="coarse.all_reduce")
    if cfg.mode == "reference":
        return reference.all_reduce(tree, ctx.workers, mean)
    leaves, treedef = jax.tree.flatten(tree)
    if not leaves:
        return tree
    site = ctx.new_site()
    last = _push_in_order(plan, site, leaves)
    return jax.tree.unflatten(treedef, _finish(plan, site, leaves, [last], in_place=False))


# ----------------------------------------------------------------------------- value_and_grad


def _push_hook(plan: Plan, bucket: Any, site: int) -> Callable[..., Any]:
    """Identity on (token, *bucket parameters) whose backward pushes their gradients.

    The token's cotangent arrives from the previous push in plan order and
    leaves as this push's token, so the backward pass issues pushes in the
    order the proxies walk them, each as soon as its gradients exist.
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
        pushed, tok = _ffi.push(_ffi.who(), after, grads, plan, bucket, site, passthrough=True)
        return (tok, *pushed)

    hook.defvjp(fwd, bwd)
    return hook


def value_and_grad(
    fun: Callable[..., Any],
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    *,
    config: Config | None = None,
) -> Callable[..., Any]:
    """`jax.value_and_grad`, synchronized the COARSE way. Replaces value_and_grad + pmean.

    Computed on the workers only. Each bucket of gradients is pushed to its
    proxy from inside the backward pass as soon as it exists; proxies
    ring-reduce while the backward pass goes on; the leading layers are
    reduced among the workers; everyone pulls. Returns the mean loss and the
    mean gradients over the workers (``has_aux``: the aux tree, also averaged,
    must hold floats), identical on every device of the mesh.

    Args:
      fun: the loss function, as for `jax.value_and_grad`.
      argnums: which positional argument(s) to differentiate.
      has_aux: ``fun`` returns ``(loss, aux)``.
      config: overrides the step's `Config`.

    Returns:
      A function returning ``(loss, grads)`` or ``((loss, aux), grads)``.

    Raises:
      RuntimeError: called outside `coarse.sync`.
      TypeError: a differentiated leaf is not float32/bfloat16/float16, or the loss is not a float scalar.

    Example:
      >>> loss, grads = coarse.value_and_grad(loss_fn)(params, batch)
    """
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)

    @functools.wraps(fun)
    def vg(*args: Any, **kwargs: Any) -> Any:
        ctx = _current("coarse.value_and_grad")
        cfg = config or ctx.config
        for i in nums:
            for path, leaf in jax.tree_util.tree_flatten_with_path(args[i])[0]:
                check_dtype(f"{jax.tree_util.keystr(path) or '<root>'} of argument {i}",
                            jnp.result_type(leaf), "coarse.value_and_grad")
        out_shape = jax.eval_shape(lambda *a: fun(*a, **kwargs), *args)
        loss_shape, aux_shape = out_shape if has_aux else (out_shape, None)
        if getattr(loss_shape, "shape", None) != () or not jnp.issubdtype(loss_shape.dtype, jnp.floating):
            raise TypeError(
                f"coarse.value_and_grad: fun must return a float scalar loss, got {loss_shape}."
            )
        diff_shapes = tuple(jax.eval_shape(lambda x: x, args[i]) for i in nums)
        grads_shape = diff_shapes[0] if single else diff_shapes
        # Sync tree: gradients first in flatten order (so the leading split
        # takes the first layers), then aux and loss (pushed first: the sync
        # order is the reverse). Group 1 keeps loss/aux out of gradient pieces.
        shapes = (grads_shape, aux_shape, loss_shape)
        groups = (jax.tree.map(lambda _: 0, grads_shape), jax.tree.map(lambda _: 1, aux_shape), 1)
        names = [
            prefix + (jax.tree_util.keystr(path) if prefix != "loss" else "")
            for prefix, part in (("grads", grads_shape), ("aux", aux_shape), ("loss", loss_shape))
            for path, _ in jax.tree_util.tree_flatten_with_path(part)[0]
        ]
        plan = ctx.plan(shapes, cfg, groups=groups, names=names, where="coarse.value_and_grad")
        n_grad = len(jax.tree.leaves(grads_shape))
        site = ctx.new_site() if cfg.mode == "ffi" else -1

        def on_worker(*a: Any) -> Any:
            a = list(a)
            diff = [_ffi.vary(a[i]) for i in nums]  # varying: no implicit psum in the vjp
            diff_leaves, diff_def = jax.tree.flatten(tuple(diff))

            def f(*leaves: jax.Array) -> Any:
                leaves = list(leaves)
                tok = None
                if cfg.mode == "ffi":
                    # Hooks chained in reverse plan order here, so that in the
                    # backward pass the token runs in plan order.
                    tok = _ffi.token()
                    for b in reversed(plan.buckets):
                        ids = _bucket_leaves(plan, b)
                        if ids[0] < n_grad:
                            tok, *hooked = _push_hook(plan, b, site)(tok, *[leaves[t] for t in ids])
                            for t, v in zip(ids, hooked):
                                leaves[t] = v
                call = list(a)
                for i, v in zip(nums, jax.tree.unflatten(diff_def, leaves)):
                    call[i] = v
                out = fun(*call, **kwargs)
                if tok is None:
                    return out
                # Tie the chain's end to the loss (adds 0) so its cotangent,
                # the backward pass's first push, exists.
                if has_aux:
                    return out[0] + 0.0 * tok.astype(out[0].dtype), out[1]
                return out + 0.0 * tok.astype(out.dtype)

            if has_aux:
                loss, vjp_fn, aux = jax.vjp(f, *diff_leaves, has_aux=True)
            else:
                (loss, vjp_fn), aux = jax.vjp(f, *diff_leaves), None
            head = list(jax.tree.leaves((aux, loss)))
            seed = jnp.ones_like(loss)
            if cfg.mode == "ffi":
                # The loss (and aux) are known after the forward pass: push
                # now (they come first in plan order), passing them through so
                # their push cannot be dropped; the backward pass's pushes
                # follow them in the token chain through the seed.
                me, tok = _ffi.who(), _ffi.token()
                for b in plan.buckets:
                    ids = _bucket_leaves(plan, b)
                    if ids[0] >= n_grad:
                        pushed, tok = _ffi.push(me, tok, [head[t - n_grad] for t in ids], plan, b,
                                                site, passthrough=True)
                        for t, v in zip(ids, pushed):
                            head[t - n_grad] = v
                seed = seed + 0.0 * tok.astype(seed.dtype)
            grads = list(vjp_fn(seed))
            return _ffi.vary(grads + head)

        def on_proxy(*a: Any) -> Any:
            return _zeros_like_shapes(
                [jax.ShapeDtypeStruct(leaf.shape, leaf.dtype) for leaf in plan.leaves]
            )

        if cfg.worker_compute == "cond":
            leaves = lax.cond(_tier_is_worker(), on_worker, on_proxy, *args)
        else:  # "all": proxies compute too; their pushes are no-ops, pulls overwrite the rest
            leaves = on_worker(*args)
        if cfg.mode == "reference":
            leaves = reference.all_reduce(leaves, ctx.workers)
        else:
            # The pushed values (pass-through outputs) order the rest after the pushes.
            pushed = [leaves[t] for t in plan.proxy_leaves]
            leaves = _finish(plan, site, leaves, pushed, in_place=True)
        grads_l, head = leaves[:n_grad], leaves[n_grad:]
        grads = jax.tree.unflatten(jax.tree.structure(grads_shape), grads_l)
        aux, loss = jax.tree.unflatten(jax.tree.structure((aux_shape, loss_shape)), head)
        return ((loss, aux) if has_aux else loss), grads

    return vg
