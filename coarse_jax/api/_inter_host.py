"""Across hosts: the step after a host's own synchronization, through XLA collectives over "host".

On a ``("host", "tier", "data")`` mesh (several processes, see
`coarse.make_mesh`) the step's program spans the workers of every host
(``("host", "data")``) and the runtime synchronizes each host on its own,
exactly as on one host: push, the proxies' ring (in the runtime's service),
worker ring of the leading layers, pull. Every worker of host h then holds
the host's mean m_h (or sum) of every leaf. This module turns that into the
mean over all workers of all hosts, ``(1/H) * sum_h m_h``, with XLA
collectives among the workers (gloo on CPU, NCCL on GPU); the runtime itself
never talks to another host.

Who sends what across hosts (the hierarchical step):

* The synced leaves, laid end to end, are cut into p equal chunks; worker k
  owns chunk k and sums it over the hosts (an XLA collective over "host" on
  n/p elements per worker, see below).
* Within the host every worker then needs every global chunk. On CPU the
  runtime hands them out (``coarse_host_gather``: each worker offers its
  chunk and writes every chunk straight into its leaves, in their dtypes,
  over the host's results, ffi/runtime/hand_out.h); elsewhere (GPU) an XLA
  ``all_gather`` over "data" does (NCCL within the node), then slices into
  leaves. Either result is typed invariant over the whole mesh, which it is.

With the proxy optimizer (`coarse.value_and_update`) the proxies must update
from the mean over all hosts, so the sum over hosts moves inside their ring:
the workers' ring call runs as two custom calls (`ring_across_hosts`). Proxy
k's job (ffi/runtime/service.cc) reduce-scatters every piece within the host
and hands worker k the chunks it owns (ffi/runtime/param_store.h
ExchangeRanges); worker k's first call returns them to XLA. Proxy k of every
host owns the same chunks, so the sum over "host" among the workers k
(below) lines them up; worker k's second call hands the global chunks back
to proxy k, which runs the optimizer on them (every host applies the same
update to the same master copy) and all-gathers the new parameters within
the host, which the pull hands to the workers. No hand-out is needed. The
hosts also exchange their plan's key: different plans would sum chunks that
do not line up, so the workers refuse that step (and the store keeps its
version).

The sum over hosts: with two hosts a ``psum`` over "host" (a + b equals
b + a exactly, so the result is bitwise the same on every device and run to
run, whatever gloo or NCCL do inside); with more, gather-then-add in host
order 0, 1, ..., H-1, so the order is fixed by this code, not by the
collective library. Gathering receives (H-1)·n/p per worker, more than a
reduce-scatter's 2(H-1)/H·n/p from three hosts on; the trade is
reproducibility.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from coarse_jax import _ffi
from coarse_jax._hooks import HOOKS
from coarse_jax.dispatch import context
from coarse_jax.mesh import DATA, HOST, traced_axes
from coarse_jax.plan import Plan


def spans_hosts() -> bool:
    """Whether the trace runs inside ``shard_map`` over a mesh with the "host" axis."""
    return HOST in traced_axes()


def _vary(x: jax.Array, axes: tuple[str, ...]) -> jax.Array:
    missing = tuple(a for a in axes if a not in jax.typeof(x).mat.varying)
    return lax.pcast(x, missing, to="varying") if missing else x


_EVERYWHERE = (HOST, DATA)


def _sum_over_hosts(mine: jax.Array, hosts: int, mean: bool) -> jax.Array:
    """``mine`` summed (averaged) over "host", in host order: identical on every host."""
    mine = _vary(mine, _EVERYWHERE)
    if hosts == 2:
        # a + b == b + a exactly: a psum is bitwise the same on both hosts and
        # run to run, whatever the library's algorithm; and on gloo it is
        # faster than gathering (ResNet-50 chunks: 167 vs 346 ms).
        total = lax.psum(mine, HOST)
    else:
        gathered = lax.all_gather(mine, HOST, to="invarying")  # (hosts, chunk)
        total = gathered[0]
        for h in range(1, hosts):
            total = total + gathered[h]
    if mean:
        total = total * jnp.float32(1.0 / hosts)
    return total


def _host_sum(leaves: list[jax.Array], chunk: int, hosts: int, mean: bool) -> jax.Array:
    """Chunk ``axis_index("data")`` of ``leaves`` end to end (f32), summed over hosts in host
    order.

    XLA fuses the concatenation into the dynamic slice, so a worker reads its
    chunk without a copy of the whole vector.
    """
    p = lax.axis_size(DATA)
    n = sum(x.size for x in leaves)
    parts = [x.reshape(-1).astype(jnp.float32) for x in leaves]
    padded = jnp.concatenate([*parts, jnp.zeros((p * chunk - n,), jnp.float32)])
    mine = lax.dynamic_slice(padded, (lax.axis_index(DATA) * chunk,), (chunk,))
    return _sum_over_hosts(mine, hosts, mean)


def ring_across_hosts(
    plan: Plan,
    call: _ffi.CallSite,
    me: jax.Array,
    pushed: Sequence[jax.Array],
    update: _ffi.RingUpdate | None,
) -> jax.Array:
    """The proxy ring with the sum over hosts inside it (see the top of this module).

    Returns the ring's token; the pull then brings every worker the global
    result (with ``update``: the new parameters).
    """
    hosts = lax.axis_size(HOST)
    # What each proxy owns after the reduce-scatter: the runtime's ExchangeRanges.
    width = max(1, *_ffi.plan_layout(call.plan_attrs).exchange_nelems)
    token, chunks = _ffi.proxy_ring_to_hosts(call, me, pushed, update, width)
    key = _vary(jnp.int32(_ffi.host_plan_key(call.plan_attrs["plan_key"])), _EVERYWHERE)
    keys = _vary(lax.all_gather(key, HOST, to="invarying"), _EVERYWHERE)
    summed = _vary(_sum_over_hosts(chunks, hosts, plan.mean), _EVERYWHERE)
    return _ffi.proxy_ring_from_hosts(call, me, token, update, summed, keys)


def across_hosts(plan: Plan, call: _ffi.CallSite, leaves: list[jax.Array]) -> list[jax.Array]:
    """Host means (sums) of the synced leaves -> the means (sums) over all hosts.

    ``leaves`` in tree order, as `coarse_jax.api._phases.finish` returns them
    (every worker of a host holds its host's result). Must run inside
    ``shard_map`` over the workers of a ``("host", "tier", "data")`` mesh.
    Returns the leaves in their dtypes, identical on every worker of the mesh.
    """
    hosts = lax.axis_size(HOST)
    p = lax.axis_size(DATA)
    synced = [*plan.proxy_leaves, *plan.leading_leaves]
    group = [leaves[t] for t in synced]
    chunk = math.ceil(sum(x.size for x in group) / p)
    out = list(leaves)
    if chunk == 0:
        return out
    mine = _host_sum(group, chunk, hosts, plan.mean)
    ctx = context.current("coarse.sync across hosts")
    # On CPU the runtime hands out; `coarse_jax.testing.xla_hand_out` takes XLA's
    # all_gather there too, as on GPUs (tests/multihost_script.py runs that path).
    if ctx.mesh.devices.flat[0].platform == "cpu" and not HOOKS.xla_hand_out:
        topo = plan.config.topology
        # Emulated links: the host's network link is charged in the hand-out
        # (coarse.EmulatedTopology inter_host_*; coarse.perf_model.predict_hosts_sync_s).
        inter_host = None if topo is None else {"hosts": np.int64(hosts), **topo.inter_host_attrs()}
        vals = _ffi.host_gather(
            mine,
            group,
            site=call.site,
            timeout_ms=int(call.plan_attrs["timeout_ms"]),
            chunk_size=chunk,
            inter_host=inter_host,
        )
        for t, v in zip(synced, vals, strict=True):
            out[t] = v
        return out
    flat = lax.all_gather(mine, DATA, to="invarying").reshape(-1)  # (p * chunk,)
    off = 0
    for t in synced:
        x = leaves[t]
        out[t] = flat[off : off + x.size].reshape(x.shape).astype(x.dtype)
        off += x.size
    return out
