"""The proxy optimizer's stores: `ProxyStore`, the one object of a runtime store, and its
registration, attributes and the ring's extra operands in a traced step.

`coarse.value_and_update` runs `coarse.value_and_grad`'s dataflow with one
change: the proxies' ring gets the params and this step's scalars, and the
pull brings back parameters (`coarse_jax.api.grad.synced_value_and_grad`).
This module names the runtime store each call site updates, so that a
recompiled step (another batch shape, a re-plan) keeps updating the same
master parameters and optimizer state.
"""

from __future__ import annotations

import dataclasses
import itertools
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from coarse_jax import _ffi
from coarse_jax._ffi.store import RuntimeStore
from coarse_jax.api import _inter_host
from coarse_jax.config import Config
from coarse_jax.dispatch import context
from coarse_jax.optim import ProxyOptimizer
from coarse_jax.plan import Plan

_serials = itertools.count(1)


@dataclasses.dataclass(eq=False)
class ProxyStore:
    """One value_and_update site of a step: the one Python object of its runtime store.

    It holds the runtime's store (``runtime``, a `coarse_jax._ffi.store.RuntimeStore`
    handle: the store's calls), says what the store holds (the params'
    structure, shapes and dtypes, the plan, the optimizer) and is the only way
    the API reaches it: through its handle, the conversion of its [slot][leaf]
    f32 bytes to and from the params' trees, and the ring's optimizer operands
    of a traced call. A step's `coarse_jax.api.proxy_state.ProxyState` picks
    a store by the call's index and uses these.
    """

    runtime: RuntimeStore  # the runtime's store: platform, id and name in one handle
    optimizer: ProxyOptimizer
    treedef: Any  # the params' structure
    shapes: list[tuple[int, ...]]  # per params leaf
    dtypes: list[np.dtype]
    plan: Plan
    delayed: bool = False  # value_and_update(delayed=True): a gradient may be pending

    # -- the params' trees -----------------------------------------------------

    def slot_leaves(self, leaves: list[int], values: list[list[bytes]]) -> list[list[np.ndarray]]:
        """An export (plan leaf ids, [slot][leaf] f32 bytes) as [slot][params leaf] arrays
        in the params' flatten order."""
        order = [self.plan.sync_order[s] for s in leaves]  # params leaf of each
        out = []
        for slot in values:
            tree: list[np.ndarray] = [np.empty(0, np.float32)] * len(self.shapes)
            for t, raw in zip(order, slot, strict=True):
                tree[t] = np.frombuffer(raw, np.float32).reshape(self.shapes[t]).copy()
            out.append(tree)
        return out

    def updated_sync_ids(self) -> list[int]:
        """Plan leaf ids (sync order) of the params, as the runtime lists them."""
        n = len(self.shapes)
        return [s for s in range(self.plan.num_proxy_leaves) if self.plan.sync_order[s] < n]

    def read(self, who: str) -> tuple[int, list[list[np.ndarray]]]:
        """(count, [slot][params leaf] f32 arrays), slot 0 the master; ``who`` names the
        caller in the error when the store holds nothing yet."""
        got = self.runtime.export()
        if got is None:
            raise RuntimeError(
                f"{who}: the proxies hold no state yet (no step has finished). Run a step first."
            )
        count, leaves, values = got
        return int(count), self.slot_leaves(leaves, values)

    def write(self, params: Any, count: int, slots: list[Any], who: str) -> None:
        """The next update starts from ``params`` (its master), ``count`` and the optimizer
        state ``slots`` (trees like the params)."""
        leaves, treedef = jax.tree.flatten(params)
        if treedef != self.treedef or [tuple(np.shape(x)) for x in leaves] != self.shapes:
            raise ValueError(
                f"{who}: params must have the structure and shapes the step updates "
                f"({self.treedef}), got {treedef}."
            )
        trees = [leaves, *(jax.tree.leaves(s) for s in slots)]
        ids = self.updated_sync_ids()
        values = []
        for tree in trees:
            if len(tree) != len(leaves):
                raise ValueError(
                    f"{who}: opt_state's moments have {len(tree)} leaves, params have "
                    f"{len(leaves)}."
                )
            flat = [np.asarray(x, np.float32).ravel() for x in tree]
            values.append([flat[self.plan.sync_order[s]].tobytes() for s in ids])
        self.runtime.load(count, ids, values)

    # -- a traced call -----------------------------------------------------------

    def ring_update(
        self, call: _ffi.CallSite, params: list[jax.Array], leaves: list[jax.Array]
    ) -> _ffi.RingUpdate:
        """The ring's optimizer operands of a traced call of this site (``call``, with the
        attributes `register` gave it): this step's count and scalars, and the proxies'
        leaves (the params in place of their gradients, then the pushed loss)."""
        attrs = call.site_attrs
        count = _ffi.opt_count(call, _ffi.who(), attrs)
        scalars = self.optimizer.scalars(count)
        n_params = len(self.shapes)
        ops = [params[t] if t < n_params else leaves[t] for t in self.plan.proxy_leaves]
        return _ffi.RingUpdate(ops, scalars, attrs)


def check_config(cfg: Config) -> Config:
    """The Config a value_and_update runs with (every parameter through the proxies)."""
    # The leading layers are not reduced among the workers: their optimizer
    # state would have to live on the workers, which is what the proxies are
    # there to avoid. Every parameter goes through the proxies.
    if cfg.leading_bytes != 0:
        cfg = dataclasses.replace(cfg, leading_bytes=0)
    # Nor by XLA: the proxies hold the optimizer (Config.xla_below_bytes).
    if cfg.xla_below_bytes != 0:
        cfg = dataclasses.replace(cfg, xla_below_bytes=0)
    return cfg


def check_delayed(cfg: Config, optimizer: ProxyOptimizer, snapshot_every: int) -> None:
    """Refuses what ``value_and_update(delayed=True)`` does not support, naming the fix."""
    refusals = {
        "mode='reference'": cfg.mode == "reference",
        "clip_norm (the norm of a gradient pending between calls)": bool(optimizer.clip_norm),
        "snapshots (coarse.sync(snapshots=...): the pending gradient is not saved)": bool(
            snapshot_every
        ),
        "a mesh across hosts": _inter_host.spans_hosts(),
    }
    found = [what for what, bad in refusals.items() if bad]
    if found:
        raise NotImplementedError(
            "coarse.value_and_update(delayed=True) does not support " + "; ".join(found) + ". "
            "Fix: drop delayed=True (the update then runs within each call), or drop those."
        )


def reference_update(
    ctx: context.SyncContext, optimizer: ProxyOptimizer, params: Any, mean_grads: list[Any]
) -> list[Any]:
    """mode="reference": the same update in pure JAX (the optimizer's optax twin).

    The f32 master and the optax state are step state threaded through the
    program by `coarse.sync` (``ctx.ref_in`` / ``ctx.ref_out``, by the call's
    position in the step), not runtime memory: the first call seeds them from
    the params, as the proxies do. Returns the new params leaves in the
    params' dtypes.
    """
    index = ctx.next_update
    ctx.next_update += 1
    ctx.ref_optimizers[index] = optimizer
    tx = optimizer.optax()
    leaves, treedef = jax.tree.flatten(params)
    held = ctx.ref_in.get(index)
    if held is None:
        master = jax.tree.unflatten(treedef, [jnp.asarray(x, jnp.float32) for x in leaves])
        opt_state = tx.init(master)
    else:
        master, opt_state = held
    grads = jax.tree.unflatten(treedef, list(mean_grads))
    updates, opt_state = tx.update(grads, opt_state, master)
    master = optax.apply_updates(master, updates)
    ctx.ref_out[index] = (master, opt_state)
    return [m.astype(x.dtype) for m, x in zip(jax.tree.leaves(master), leaves, strict=True)]


def register(
    ctx: context.SyncContext,
    call: _ffi.CallSite,
    plan: Plan,
    optimizer: ProxyOptimizer,
    params: Any,
    n_params: int,
    delayed: bool = False,
) -> tuple[ProxyStore, _ffi.CallSite]:
    """The store of the context's next value_and_update site (the same one every trace),
    and ``call`` with the site's attributes, which every call of the site carries."""
    index = ctx.next_update
    ctx.next_update += 1
    leaves, treedef = jax.tree.flatten(params)
    shapes = [tuple(np.shape(x)) for x in leaves]
    dtypes = [np.dtype(x.dtype) for x in leaves]
    store = ctx.stores.get(index)
    if store is not None and (store.treedef, store.shapes) != (treedef, shapes):
        raise ValueError(
            f"coarse.value_and_update: call {index} of this step got params of another "
            f"structure than before ({store.treedef} {store.shapes[:3]}..., now {treedef} "
            f"{shapes[:3]}...); the proxies hold the master copy of the first. Fix: keep the "
            "params' structure fixed, or use a new coarse.sync step for the new params."
        )
    if store is None:
        runtime = RuntimeStore(
            ctx.mesh.devices.flat[0].platform, next(_serials), f"{ctx.step_name} update {index}"
        )
        store = ProxyStore(runtime, optimizer, treedef, shapes, dtypes, plan)
        ctx.stores[index] = store
        # The runtime's copy (master, state, snapshots) lives as long as the
        # step that owns this record.
        weakref.finalize(store, runtime.drop)
    store.optimizer, store.plan, store.dtypes = optimizer, plan, dtypes
    store.delayed = delayed
    decay = optimizer.decay_mask(params)
    flags = np.zeros(len(plan.leaves), np.int64)
    for s, t in enumerate(plan.sync_order):
        if t < n_params:
            flags[s] = 1 | (2 if decay[t] else 0)
    attrs = {
        "opt_store": np.int64(store.runtime.id),
        "opt_name": store.runtime.name,
        "opt_leaf_flags": flags,
        "opt_snapshot_every": np.int64(ctx.snapshot_every),
        "opt_check_params": np.int64(ctx.check_params),
        "opt_delayed": np.int64(delayed),
        **optimizer.ffi_attrs(),
    }
    if _inter_host.spans_hosts():
        # The proxies sum over the hosts inside their ring (_inter_host.ring_across_hosts).
        attrs["across_hosts"] = np.int64(1)
    # Every call of the site carries them: whichever worker call comes first
    # starts the proxies' jobs (ffi/runtime/service.h), which run the optimizer.
    call = dataclasses.replace(call, site_attrs=attrs)
    return store, call
