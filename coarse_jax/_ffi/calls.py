"""One wrapper per synchronization custom call: begin, push, proxy ring, worker ring, pull.

Every call takes the int32[2] (tier, data index) of the calling device first,
then leaves, and a `CallSite` naming the plan, the site and the devices.
Inside ``shard_map`` all operands are cast to vary over the mesh axes (the
handlers behave per device); results are typed the way the runtime makes
them: push/proxy-ring outputs vary per device, worker-ring and pull outputs
are identical on every worker, so they are typed invariant and
may leave ``shard_map`` with ``out_specs=P()``.

This layer knows nothing of `coarse.sync`: the caller passes what the
handlers need (`CallSite`), so the wrappers also run outside a mesh (one
device's worker calls, its proxy in the runtime's service, in tests) with
``CallSite(axes=())``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from coarse_jax._ffi.primitive import custom_call
from coarse_jax.mesh import (
    DATA,
    HOST,
    PROGRAM_AXES,
    MeshLike,
    num_proxies,
    proxies_on,
    proxy_devices,
    workers_mesh,
)


@dataclasses.dataclass(frozen=True, eq=False)
class CallSite:
    """Where a custom call belongs: which plan, which sync of the program, which devices.

    Attributes:
      plan_attrs: the plan's FFI attributes (``Plan.ffi_attrs()``): its key and layout.
      site: which synchronization of the program; the runtime keys its
        rendezvous by (execution, site), so two syncs of one program never meet.
      ordinals: int64[p + q], the platform's device number of every mesh device,
        workers first (`device_ordinals`); the CUDA handlers find the caller by it.
      axes: the program's mesh axes operands are cast to vary over (the
        workers' "data"); ``()`` outside ``shard_map``.
      push_in_place: the proxies read the pushes straight from the workers'
        buffers (the fused push, ffi/runtime/phases.h PushesInPlace): the
        pull then takes every pushed leaf as an operand, which keeps the
        buffers alive and unwritten until it runs. Only where devices share
        memory and links are not emulated (`coarse_jax.dispatch.context`).
      site_attrs: attributes every call of the site carries besides the
        plan's: the first worker call of a session starts the proxies' jobs
        from them (ffi/runtime/service.h), whichever call that is. In a
        `coarse.value_and_update`, the optimizer and its store.

    Every call also carries ``push_in_place`` (it must agree).
    """

    plan_attrs: Mapping[str, Any]
    site: int
    ordinals: np.ndarray
    axes: tuple[str, ...] = PROGRAM_AXES
    push_in_place: bool = False
    site_attrs: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class Bucket(Protocol):
    """The part of a plan bucket a push needs (`coarse_jax.plan.BucketPlan` has it)."""

    @property
    def first_leaf(self) -> int: ...

    @property
    def first_piece(self) -> int: ...

    @property
    def num_pieces(self) -> int: ...


def _vary(x: jax.Array, axes: tuple[str, ...] = PROGRAM_AXES) -> jax.Array:
    missing = tuple(a for a in axes if a not in jax.typeof(x).mat.varying)
    return lax.pcast(x, missing, to="varying") if missing else x


def vary(tree: Any, axes: tuple[str, ...] = PROGRAM_AXES) -> Any:
    """Casts every leaf of ``tree`` to vary over ``axes`` (the program's "data" by default).

    Across hosts (a "host" axis in the mesh) also over "host": a parameter
    differentiated per worker must vary there too, or the vjp would add an
    implicit psum over hosts.
    """
    if HOST in jax.sharding.get_abstract_mesh().axis_names and HOST not in axes:
        axes = (HOST, *axes)
    return jax.tree.map(lambda x: _vary(x, axes), tree)


def who() -> jax.Array:
    """The calling device's (tier, data index), as the handlers read it (inside ``shard_map``).

    Always a worker's (tier 0): the program spans the workers only.
    """
    data = lax.axis_index(DATA).astype(jnp.int32)
    return _vary(jnp.stack([jnp.zeros_like(data), data]))


def token() -> jax.Array:
    """A fresh ordering token, inside ``shard_map`` (f32 scalar: it may be a cotangent)."""
    return _vary(jnp.zeros((), jnp.float32))


def device_ordinals(mesh: MeshLike) -> np.ndarray:
    """The platform's device number of every mesh device, worker i at i, proxy k at p + k (k < q).

    The CUDA handlers learn which device calls them from the GPU ordinal XLA
    runs them on (the (tier, data) operand lives in GPU memory), and place
    the runtime's buffers on the right GPUs; the CPU handlers name the
    streams backend's device streams by it. A proxy in host memory
    (``make_mesh(..., proxies_on="host")``) is no device: proxy k's ordinal
    is ``-1 - k`` (ffi/runtime/storage.h, IsHostOrdinal).
    """
    # A shared proxy (COARSE k:1) counts once, as proxy j (proxy_devices).
    devices = [*workers_mesh(mesh).devices.flat, *proxy_devices(mesh)]
    ordinals = [d.local_hardware_id if d.local_hardware_id is not None else d.id for d in devices]
    if proxies_on(mesh) == "host":
        ordinals += [-1 - k for k in range(num_proxies(mesh))]
    return np.array(ordinals, dtype=np.int64)


def _result(x: jax.Array, varying: bool) -> Any:
    # A varying result takes the (varied) operand's own type, which carries
    # the mesh; an invariant one is a plain ShapeDtypeStruct.
    return jax.typeof(x) if varying else jax.ShapeDtypeStruct(x.shape, x.dtype)


# The typed attributes of the sync calls, the one place Python writes them;
# ffi/xla/call_attrs.h reads them (XLA checks names and types: a set that
# differs from the C++ binding fails the call). Every call carries "call"
# (plan, optimizer, site, ordinals, push_in_place, across_hosts, last);
# a push and the proxy ring add their own. What a call may lack is passed
# empty, so the set is fixed: no emulated links, empty topology tables; no
# optimizer (a value_and_grad's sync), store -1.
_TABLES = tuple(f"{t}_{m}" for t in ("wp", "pp", "ww") for m in ("s_per_byte", "latency_s"))
_PLAN_INTS = ("plan_key", "workers", "timeout_ms", "num_proxy_leaves", "leading_nbytes")
_PLAN_ARRAYS = (
    *("piece_nelems", "piece_nbytes", "piece_dest", "segments", "leaf_nelems", "piece_push"),
)
_PLAN_KEYS = {*_PLAN_INTS, *_PLAN_ARRAYS, "proxies", "mean", "leaf_names", "trace"}
_OPT_FLOATS = (
    *("b1", "b2", "eps", "one_minus_b1", "one_minus_b2"),
    *("weight_decay", "momentum", "clip_norm"),
)


def _plan_attrs(plan: Mapping[str, Any]) -> dict[str, Any]:
    """``Plan.ffi_attrs()`` (flat) as the typed ``plan`` group (PlanAttrs, ffi/xla/call_attrs.h)."""
    unknown = sorted(k for k in plan if k not in _PLAN_KEYS and not k.startswith("emu_"))
    if unknown:
        raise ValueError(f"coarse_jax: plan attributes {unknown} have no place in the call")
    out: dict[str, Any] = {k: np.int64(plan[k]) for k in _PLAN_INTS}
    out |= {k: np.asarray(plan[k], np.int64).reshape(-1) for k in _PLAN_ARRAYS}
    out["proxies"] = np.int64(plan.get("proxies", plan["workers"]))
    out["mean"] = np.bool_(plan["mean"])
    out["leaf_names"] = str(plan["leaf_names"])
    out["trace"] = np.bool_(plan.get("trace", 0))
    topology: dict[str, Any] = {
        t: np.asarray(plan.get("emu_" + t, ()), np.float64).reshape(-1) for t in _TABLES
    }
    topology["virtual_clock"] = np.bool_(plan.get("emu_virtual", 0))
    topology["host_proxies"] = np.bool_(plan.get("emu_host_proxies", 0))
    out["topology"] = topology
    return out


def _optimizer_attrs(opt: Mapping[str, Any]) -> dict[str, Any]:
    """A value_and_update's ``opt_*`` attributes (coarse_jax/optim.py and the store's) as the
    typed ``optimizer`` group (OptimizerAttrs, ffi/xla/call_attrs.h); none: store -1."""
    if "opt_store" not in opt:
        out: dict[str, Any] = {"store": np.int64(-1), "name": "", "kind": np.int64(0)}
        out |= {k: np.float64(0.0) for k in _OPT_FLOATS}
        out |= {"nesterov": np.bool_(False), "leaf_flags": np.zeros((0,), np.int64)}
        out |= {"snapshot_every": np.int64(0), "check_params": np.bool_(True)}
        return out | {"delayed": np.bool_(False)}
    out = {"store": np.int64(opt["opt_store"]), "name": str(opt["opt_name"])}
    out["kind"] = np.int64(opt["opt_kind"])
    out |= {k: np.float64(opt["opt_" + k]) for k in _OPT_FLOATS}
    out["nesterov"] = np.bool_(opt["opt_nesterov"])
    out["leaf_flags"] = np.asarray(opt["opt_leaf_flags"], np.int64).reshape(-1)
    out["snapshot_every"] = np.int64(opt["opt_snapshot_every"])
    out["check_params"] = np.bool_(opt.get("opt_check_params", 1))
    return out | {"delayed": np.bool_(opt.get("opt_delayed", 0))}


def _call_attrs(
    call: CallSite, last: bool, optimizer: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The ``call`` group every sync call carries (CallAttrs, ffi/xla/call_attrs.h)."""
    opt = call.site_attrs if optimizer is None else optimizer
    return {
        "plan": _plan_attrs(call.plan_attrs),
        "optimizer": _optimizer_attrs(opt),
        "site": np.int64(call.site),
        "ordinals": np.asarray(call.ordinals, np.int64).reshape(-1),
        "push_in_place": np.bool_(call.push_in_place),
        "across_hosts": np.bool_(call.site_attrs.get("across_hosts", 0)),
        "last": np.bool_(last),
    }


def site_of(attrs: Mapping[str, Any]) -> int:
    """The call site a coarse custom call's attributes name: a sync call's ``call`` group,
    else its own ``site`` (``coarse_host_gather``); -1 where none (a kernel op)."""
    group = attrs.get("call")
    return int(group["site"]) if isinstance(group, Mapping) else int(attrs.get("site", -1))


def _call(
    target: str,
    call: CallSite,
    results: Sequence[Any],
    operands: Sequence[jax.Array],
    aliases: dict[int, int],
    last: bool,
    optimizer: Mapping[str, Any] | None = None,
    **attrs: Any,
) -> Any:
    # Side effect for XLA, no JAX effect: jit's fast dispatch (`custom_call`),
    # which also refuses jax.vmap. Its operands must vary over the same axes
    # (across hosts some vary over "host" too).
    axes = set().union(*(jax.typeof(x).mat.varying for x in operands))
    operands = [_vary(x, tuple(sorted(axes))) for x in operands]
    ffi = custom_call(target, results, aliases)
    return ffi(*operands, call=_call_attrs(call, last, optimizer), **attrs)


def _aliases(n: int, first_operand: int, alias: bool) -> dict[int, int]:
    # Writing into a dead temporary (the gradients) saves XLA allocating and
    # faulting in fresh output buffers every step.
    return {first_operand + i: i for i in range(n)} if alias else {}


def begin(call: CallSite, me: jax.Array) -> jax.Array:
    """Opens this device's part of the sync at the head of its computation; returns a token.

    The call joins the sync's session in the runtime and, the first time a
    worker does, starts the proxies' jobs (ffi/xla/begin.cc); it also waits
    for the storage's previous user. Emitted before a forward pass, all of
    that overlaps the forward instead of waiting behind the sync's first
    push. Hand the token to the first push (its ``after``): no push can
    then start the jobs. Its only operand is ``me``, so XLA may run it from
    the program's start: XLA:CPU's concurrent executor can run it once ``me``
    is computed, beside the forward (a sequential program runs it where XLA's
    schedule puts it, still before the push); on a GPU XLA calls the handler on the
    host as it enqueues the program, ahead of the forward's kernels. No data
    dependency holds the forward back for it: an optimization barrier would
    be the only free one, and XLA:CPU removes those.
    """
    tok = jax.typeof(me).update(shape=(), dtype=jnp.dtype(jnp.float32))  # varies like me
    (out,) = _call("coarse_begin", call, [tok], [me], {}, last=False)
    return out


def push(
    call: CallSite,
    me: jax.Array,
    after: jax.Array,
    leaves: Sequence[jax.Array],
    bucket: Bucket,
    passthrough: bool,
) -> tuple[list[jax.Array], jax.Array]:
    """Hands one bucket to the routed proxies, after the push that made ``after``.

    Returns ``(leaves, token)``. ``passthrough``: the leaves come back
    (aliased), for the backward hooks, whose cotangent outputs must be the
    gradients; otherwise ``[]``: aliasing a still-live operand (a step
    argument, say) would make XLA copy it first.
    """
    leaves = [_vary(x, call.axes) for x in leaves]
    after = _vary(after, call.axes)
    out = _call(
        "coarse_push",
        call,
        [*([_result(x, True) for x in leaves] if passthrough else []), _result(after, True)],
        [me, after, *leaves],
        # The token result in the previous token's buffer: nothing to write.
        {**_aliases(len(leaves), 2, passthrough), 1: len(leaves) if passthrough else 0},
        last=False,
        first_leaf=np.int64(bucket.first_leaf),
        first_piece=np.int64(bucket.first_piece),
        num_pieces=np.int64(bucket.num_pieces),
        passthrough=np.bool_(passthrough),
    )
    return list(out[:-1]), out[-1]


@dataclasses.dataclass(frozen=True)
class RingUpdate:
    """What the proxies need to run the optimizer in their ring (`coarse.value_and_update`).

    Attributes:
      params: the step's params, one per proxy leaf in sync order (the loss's
        place holds the loss: it is not updated).
      scalars: f32[3] (learning rate, 1 - b1^t, 1 - b2^t) of this step.
      attrs: the optimizer's and its store's attributes (``opt_*``, ffi/xla/call_attrs.h
        OptimizerAttrs).
    """

    params: Sequence[jax.Array]
    scalars: jax.Array
    attrs: Mapping[str, Any]


def _ring_operands(
    call: CallSite, me: jax.Array, deps: Sequence[jax.Array], update: RingUpdate | None
) -> tuple[list[jax.Array], dict[str, Any]]:
    # The ring's own attributes: num_deps (operands before the params) and,
    # with an update, its optimizer (the site's).
    operands = [me, *(_vary(d, call.axes) for d in deps)]
    attrs: dict[str, Any] = {"num_deps": np.int64(len(deps))}
    if update is not None:
        attrs["optimizer"] = update.attrs
        operands += [_vary(x, call.axes) for x in (*update.params, update.scalars)]
    return operands, attrs


def proxy_ring(
    call: CallSite,
    me: jax.Array,
    deps: Sequence[jax.Array],
    last: bool,
    update: RingUpdate | None = None,
) -> jax.Array:
    """Proxies reduce every piece; returns a token that orders what follows.

    ``deps`` (push outputs) only order this call after this device's pushes.
    With ``update`` the proxies turn the mean gradients of the parameter
    pieces into new parameters between reduce-scatter and all-gather.
    """
    operands, attrs = _ring_operands(call, me, deps, update)
    (ring_token,) = _call(
        "coarse_proxy_ring",
        call,
        [_result(me, True)],
        operands,
        {},
        last=last,
        hosts_stage=np.int64(0),
        **attrs,
    )
    return ring_token


def proxy_ring_to_hosts(
    call: CallSite,
    me: jax.Array,
    deps: Sequence[jax.Array],
    update: RingUpdate | None,
    width: int,
) -> tuple[jax.Array, jax.Array]:
    """Across hosts, the ring's first half: every piece reduce-scattered within the host.

    Returns ``(token, chunks)``: f32[width], the chunks this proxy owns laid
    end to end (ffi/runtime/param_store.h ExchangeRanges), zero-padded;
    zeros on a worker. Sum them over the hosts and hand them to
    `proxy_ring_from_hosts`.
    """
    operands, attrs = _ring_operands(call, me, deps, update)
    chunks = jax.typeof(me).update(shape=(width,), dtype=jnp.dtype(jnp.float32))  # varies like me
    token, out = _call(
        "coarse_proxy_ring",
        call,
        [_result(me, True), chunks],
        operands,
        {},
        last=False,
        hosts_stage=np.int64(1),
        **attrs,
    )
    return token, out


def proxy_ring_from_hosts(
    call: CallSite,
    me: jax.Array,
    after: jax.Array,
    update: RingUpdate | None,
    chunks: jax.Array,
    plan_keys: jax.Array,
) -> jax.Array:
    """Across hosts, the ring's second half: the global ``chunks`` back in, update, all-gather.

    ``plan_keys``: int32[hosts], every host's `host_plan_key`; a proxy refuses
    to go on if they differ (the chunks would not line up).
    """
    operands, attrs = _ring_operands(call, me, [after], update)
    operands += [_vary(chunks, call.axes), _vary(plan_keys, call.axes)]
    (ring_token,) = _call(
        "coarse_proxy_ring",
        call,
        [_result(me, True)],
        operands,
        {},
        last=False,
        hosts_stage=np.int64(2),
        **attrs,
    )
    return ring_token


def opt_count(call: CallSite, me: jax.Array, attrs: Mapping[str, Any]) -> jax.Array:
    """The optimizer's step count on the proxies (updates committed so far; 0 on workers).

    A proxy's call waits until the previous update of the store has closed
    on every device (ffi/runtime/param_store.h), so a step inside a loop sees
    the count its previous iteration committed.
    """
    count = _vary(jnp.zeros((), jnp.int32), call.axes)
    (out,) = _call(
        "coarse_opt_count",
        call,
        [_result(count, True)],
        [me],
        {},
        last=False,
        optimizer=attrs,
    )
    return out


def worker_ring(
    call: CallSite,
    me: jax.Array,
    after: jax.Array,
    leaves: Sequence[jax.Array],
    last: bool,
    alias: bool,
) -> tuple[list[jax.Array], jax.Array]:
    """Workers reduce the leading leaves and hand them to their proxies."""
    leaves = [_vary(x, call.axes) for x in leaves]
    out = _call(
        "coarse_worker_ring",
        call,
        [*(_result(x, False) for x in leaves), _result(me, True)],
        [me, after, *leaves],
        _aliases(len(leaves), 2, alias),
        last=last,
    )
    return list(out[:-1]), out[-1]


def pull(
    call: CallSite, me: jax.Array, after: jax.Array, leaves: Sequence[jax.Array], alias: bool
) -> list[jax.Array]:
    """Every device writes the reduced proxy leaves; ends the step.

    ``leaves`` give the result shapes; they are operands when aliased, and
    with ``call.push_in_place`` (they are the pushed leaves the proxies read).
    """
    leaves = [_vary(x, call.axes) for x in leaves]
    held = alias or call.push_in_place
    out = _call(
        "coarse_pull",
        call,
        [_result(x, False) for x in leaves],
        [me, after, *(leaves if held else [])],
        _aliases(len(leaves), 2, alias),
        last=True,
    )
    return list(out)
