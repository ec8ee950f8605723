"""The custom call of the inter-host step: ``coarse_host_gather`` (CPU only).

After the XLA collective over "host" (`coarse_jax.api._hosts`), each of a
host's 2p devices holds one chunk of the global result; this call gives
every device of the host all chunks through the process's shared memory
(ffi/host_gather.cc, ffi/runtime/hand_out.h), instead of an XLA all_gather
within the host, which on CPU would go through gloo's sockets.
"""

from __future__ import annotations

import jax
import numpy as np
from jax import lax

from coarse_jax.mesh import DATA, HOST, TIER


def host_gather(
    chunk: jax.Array, site: int, timeout_ms: int, proxy_chunk: int, worker_chunk: int
) -> tuple[jax.Array, jax.Array]:
    """Every device's f32 ``chunk`` -> (the proxies' chunks, the workers' chunks), end to end.

    Inside ``shard_map`` over a ``("host", "tier", "data")`` mesh. Of device
    (tier t, data k)'s chunk the first ``worker_chunk`` (t = 0) or
    ``proxy_chunk`` (t = 1) elements count. Results are identical on every
    device of the host and typed so; the caller makes sure they are across
    hosts too (they are: every host gathers the same global chunks).

    Args:
      chunk: f32[width], varying over the mesh.
      site: the synchronization's call site (the runtime's rendezvous key).
      timeout_ms: how long a device waits for the others of its host.
      proxy_chunk: elements of a proxy's chunk that count.
      worker_chunk: elements of a worker's chunk that count.

    Returns:
      ``(f32[p * proxy_chunk], f32[p * worker_chunk])``.
    """
    p = lax.axis_size(DATA)
    me = jax.numpy.stack([lax.axis_index(TIER), lax.axis_index(DATA)]).astype(jax.numpy.int32)
    missing = tuple(a for a in (HOST, TIER, DATA) if a not in jax.typeof(me).mat.varying)
    me = lax.pcast(me, missing, to="varying") if missing else me
    call = jax.ffi.ffi_call(
        "coarse_host_gather",
        (
            jax.ShapeDtypeStruct((p * proxy_chunk,), jax.numpy.float32),
            jax.ShapeDtypeStruct((p * worker_chunk,), jax.numpy.float32),
        ),
        has_side_effect=True,
        vmap_method="broadcast_all",
    )
    proxies, workers = call(
        me,
        chunk,
        workers=np.int64(p),
        site=np.int64(site),
        timeout_ms=np.int64(timeout_ms),
        proxy_chunk=np.int64(proxy_chunk),
        worker_chunk=np.int64(worker_chunk),
    )
    return proxies, workers
