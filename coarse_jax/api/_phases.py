"""A synchronization's custom calls in the order one step runs them, as traced ops.

Shared by `coarse.all_reduce` and `coarse.value_and_grad`: pushes chained in
plan order, then the proxy ring, the worker ring of the leading layers and the
pull. Which device does what is decided at run time by the handlers (every
device runs every call); this module only fixes the data dependencies.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from coarse_jax import _ffi
from coarse_jax.api import _inter_host
from coarse_jax.plan import Plan


def push_in_order(plan: Plan, call: _ffi.CallSite, leaves: list[jax.Array]) -> jax.Array:
    """Pushes every bucket of ``leaves`` (tree order) chained in plan order; the last token."""
    me, tok = _ffi.who(), _ffi.token()
    for b in plan.buckets:
        _, tok = _ffi.push(
            call, me, tok, [leaves[t] for t in plan.bucket_leaves(b)], b, passthrough=False
        )
    return tok


def finish(
    plan: Plan,
    call: _ffi.CallSite,
    leaves: list[jax.Array],
    pushed: Sequence[jax.Array],
    in_place: bool,
    update: _ffi.RingUpdate | None = None,
) -> list[jax.Array]:
    """Proxy ring, worker ring and pull, after this device's pushes (``pushed``).

    ``leaves`` in tree order. ``in_place``: the leaves are dead temporaries
    (gradients) the results may overwrite. ``update``: the proxies run the
    optimizer in their ring (`coarse.value_and_update`), and the pull brings
    back parameters. On a mesh across hosts the host's results then go
    through the inter-host step (`coarse_jax.api._inter_host`); with ``update``
    the sum over hosts happens inside the proxies' ring instead, before the
    optimizer (`_inter_host.ring_across_hosts`).
    """
    hosts = _inter_host.spans_hosts()
    me = _ffi.who()
    out = list(leaves)
    has_proxy = plan.num_proxy_leaves > 0
    has_lead = len(plan.leading_leaves) > 0
    proxy_vals = [leaves[t] for t in plan.proxy_leaves]
    token = None
    if has_proxy:
        if hosts and update is not None:
            token = _inter_host.ring_across_hosts(plan, call, me, pushed, update)
        else:
            token = _ffi.proxy_ring(call, me, pushed, last=False, update=update)
    if has_lead:
        if token is None:
            token = _ffi.vary(jnp.zeros((), jnp.int32))
        lead_vals = [leaves[t] for t in plan.leading_leaves]
        reduced, token = _ffi.worker_ring(
            call, me, token, lead_vals, last=not has_proxy, alias=in_place
        )
        for t, v in zip(plan.leading_leaves, reduced, strict=True):
            out[t] = v
    if has_proxy:
        assert token is not None
        pulled = _ffi.pull(call, me, token, proxy_vals, alias=in_place)
        for t, v in zip(plan.proxy_leaves, pulled, strict=True):
            out[t] = v
    if hosts and update is None:
        out = _inter_host.across_hosts(plan, call, out)
    return out
