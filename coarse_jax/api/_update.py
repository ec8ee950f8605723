"""The proxy optimizer's part of a traced step: stores, attributes, the ring's extra operands.

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
from coarse_jax.api import _context, _hosts
from coarse_jax.config import Config
from coarse_jax.optim import ProxyOptimizer
from coarse_jax.plan import Plan

_serials = itertools.count(1)


@dataclasses.dataclass
class Store:
    """One value_and_update site of a step: its runtime store and what it holds."""

    id: int
    name: str
    optimizer: ProxyOptimizer
    treedef: Any  # the params' structure
    shapes: list[tuple[int, ...]]  # per params leaf
    dtypes: list[np.dtype]
    plan: Plan
    platform: str
    delayed: bool = False  # value_and_update(delayed=True): a gradient may be pending

    @property
    def runtime(self) -> RuntimeStore:
        """The runtime's store this site updates (its typed face)."""
        return RuntimeStore(self.id, self.platform)

    def slot_leaves(self, leaves: list[int], values: list[list[bytes]]) -> list[list[np.ndarray]]:
        """The runtime's export (plan leaf ids, [slot][leaf] f32 bytes, as
        `RuntimeStore.export` returns them) as [slot][params leaf] arrays in the params'
        flatten order."""
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


@dataclasses.dataclass(frozen=True)
class Site:
    """A traced value_and_update: its store, call site and attributes."""

    store: Store
    call: _ffi.CallSite
    attrs: dict[str, Any]
    n_params: int

    def ring_update(self, params: list[jax.Array], leaves: list[jax.Array]) -> _ffi.RingUpdate:
        """The ring's optimizer operands: this step's count and scalars, and the proxies'
        leaves (the params in place of their gradients, then the pushed loss)."""
        plan, call = self.store.plan, self.call
        count = _ffi.opt_count(call, _ffi.who(), self.attrs)
        scalars = self.store.optimizer.scalars(count)
        ops = [params[t] if t < self.n_params else leaves[t] for t in plan.proxy_leaves]
        return _ffi.RingUpdate(ops, scalars, self.attrs)


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


def check_delayed(cfg: Config, optimizer: ProxyOptimizer) -> None:
    """Refuses what ``value_and_update(delayed=True)`` does not support, naming the fix."""
    refusals = {
        "mode='reference'": cfg.mode == "reference",
        "clip_norm (the norm of a gradient pending between calls)": bool(optimizer.clip_norm),
        "snapshots (Config.snapshot_every / snapshot_dir: the pending gradient is not saved)": bool(
            cfg.snapshot_every or cfg.snapshot_dir
        ),
        "a mesh across hosts": _hosts.spans_hosts(),
    }
    found = [what for what, bad in refusals.items() if bad]
    if found:
        raise NotImplementedError(
            "coarse.value_and_update(delayed=True) does not support " + "; ".join(found) + ". "
            "Fix: drop delayed=True (the update then runs within each call), or drop those."
        )


def reference_update(
    ctx: _context.SyncContext, optimizer: ProxyOptimizer, params: Any, mean_grads: list[Any]
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
    ctx: _context.SyncContext,
    call: _ffi.CallSite,
    plan: Plan,
    optimizer: ProxyOptimizer,
    params: Any,
    n_params: int,
    delayed: bool = False,
) -> Site:
    """The store of the context's next value_and_update site (the same one every trace)."""
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
        name = f"{ctx.step_name} update {index}"
        platform = ctx.mesh.devices.flat[0].platform
        store = Store(next(_serials), name, optimizer, treedef, shapes, dtypes, plan, platform)
        ctx.stores[index] = store
        # The runtime's copy (master, state, snapshots) lives as long as the
        # step that owns this record.
        weakref.finalize(store, store.runtime.drop)
    store.optimizer, store.plan, store.dtypes = optimizer, plan, dtypes
    store.delayed = delayed
    decay = optimizer.decay_mask(params)
    flags = np.zeros(len(plan.leaves), np.int64)
    for s, t in enumerate(plan.sync_order):
        if t < n_params:
            flags[s] = 1 | (2 if decay[t] else 0)
    attrs = {
        "opt_store": np.int64(store.id),
        "opt_name": store.name,
        "opt_leaf_flags": flags,
        "opt_snapshot_every": np.int64(ctx.config.snapshot_every),
        "opt_check_params": np.int64(ctx.check_params),
        "opt_delayed": np.int64(delayed),
        **optimizer.ffi_attrs(),
    }
    if _hosts.spans_hosts():
        # The proxies sum over the hosts inside their ring (_hosts.ring_across_hosts).
        attrs["across_hosts"] = np.int64(1)
    # Every call of the site carries them: whichever worker call comes first
    # starts the proxies' jobs (ffi/runtime/service.h), which run the optimizer.
    call = dataclasses.replace(call, site_attrs=attrs)
    return Site(store, call, attrs, n_params)
