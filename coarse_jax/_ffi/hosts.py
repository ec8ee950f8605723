"""The custom call of the inter-host step: ``coarse_host_gather`` (CPU only).

After the XLA collective over "host" (`coarse_jax.api._hosts`), each of a
host's 2p devices holds one chunk of the global result: proxy k chunk k of
the proxy leaves end to end, worker k chunk k of the leading leaves. This
call gives every device of the host every chunk through the process's shared
memory and writes them straight into the synced leaves, in their dtypes
(ffi/host_gather.cc, ffi/runtime/hand_out.h): one pass over the tree per
device, where an XLA all_gather within the host would go through gloo's
sockets on CPU and then need slicing into leaves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from coarse_jax._ffi.primitive import custom_call
from coarse_jax.mesh import DATA, HOST, TIER


def _vary(x: jax.Array) -> jax.Array:
    missing = tuple(a for a in (HOST, TIER, DATA) if a not in jax.typeof(x).mat.varying)
    return lax.pcast(x, missing, to="varying") if missing else x


def host_gather(
    chunk: jax.Array,
    proxy_leaves: Sequence[jax.Array],
    leading_leaves: Sequence[jax.Array],
    *,
    site: int,
    timeout_ms: int,
    proxy_chunk: int,
    worker_chunk: int,
    inter_host: Mapping[str, Any] | None = None,
) -> tuple[list[jax.Array], list[jax.Array]]:
    """Every device's f32 ``chunk`` -> the global values of the synced leaves, on every device.

    Inside ``shard_map`` over a ``("host", "tier", "data")`` mesh. Of device
    (tier t, data k)'s chunk the first ``worker_chunk`` (t = 0: elements
    ``[k * worker_chunk, ...)`` of the leading leaves end to end) or
    ``proxy_chunk`` (t = 1: of the proxy leaves) elements count. The leaves
    give the results' shapes and dtypes and are aliased to them (they are
    the host's results, dead afterwards). Results are identical on every
    device of the mesh and typed so: every host gathers the same global
    chunks.

    Args:
      chunk: f32[width], this device's chunk.
      proxy_leaves: the proxy leaves, in plan order.
      leading_leaves: the leading leaves, in plan order.
      site: the synchronization's call site (the rendezvous key, with the run).
      timeout_ms: how long a device waits for the others of its host.
      proxy_chunk: elements of a proxy's chunk that count.
      worker_chunk: elements of a worker's chunk that count.
      inter_host: on emulated links, the inter-host link's attributes
        (``hosts`` and `coarse.Topology.inter_host_attrs`): after the hand-out
        every device waits for the host's network link (ffi/host_gather.cc).

    Returns:
      ``(proxy leaves, leading leaves)`` holding the global values.
    """
    p = lax.axis_size(DATA)
    me = _vary(jnp.stack([lax.axis_index(TIER), lax.axis_index(DATA)]).astype(jnp.int32))
    leaves = [_vary(x) for x in (*proxy_leaves, *leading_leaves)]
    call = custom_call(
        "coarse_host_gather",
        [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves],
        {2 + i: i for i in range(len(leaves))},
    )
    out = call(
        me,
        _vary(chunk),
        *leaves,
        workers=np.int64(p),
        site=np.int64(site),
        timeout_ms=np.int64(timeout_ms),
        proxy_leaves=np.int64(len(proxy_leaves)),
        proxy_chunk=np.int64(proxy_chunk),
        worker_chunk=np.int64(worker_chunk),
        **dict(inter_host or {}),
    )
    return list(out[: len(proxy_leaves)]), list(out[len(proxy_leaves) :])
