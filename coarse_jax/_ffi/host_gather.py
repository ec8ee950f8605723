"""The custom call of the inter-host step: ``coarse_host_gather`` (CPU only).

After the XLA collective over "host" (`coarse_jax.api._inter_host`), each of a
host's p workers holds one chunk of the global result: worker k chunk k of
the synced leaves end to end. This call gives every worker of the host every
chunk through the process's shared
memory and writes them straight into the synced leaves, in their dtypes
(ffi/xla/host_gather.cc, ffi/runtime/hand_out.h): one pass over the tree per
worker, where an XLA all_gather within the host would go through gloo's
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
from coarse_jax.mesh import DATA, HOST


def _vary(x: jax.Array) -> jax.Array:
    missing = tuple(a for a in (HOST, DATA) if a not in jax.typeof(x).mat.varying)
    return lax.pcast(x, missing, to="varying") if missing else x


def host_gather(
    chunk: jax.Array,
    leaves: Sequence[jax.Array],
    *,
    site: int,
    timeout_ms: int,
    chunk_size: int,
    inter_host: Mapping[str, Any] | None = None,
) -> list[jax.Array]:
    """Every worker's f32 ``chunk`` -> the global values of the synced leaves, on every worker.

    Inside ``shard_map`` over the workers of a ``("host", "tier", "data")``
    mesh. Of worker k's chunk the first ``chunk_size`` elements count:
    elements ``[k * chunk_size, ...)`` of ``leaves`` end to end. The leaves
    give the results' shapes and dtypes and are aliased to them (they are
    the host's results, dead afterwards). Results are identical on every
    worker of the mesh and typed so: every host gathers the same global
    chunks.

    Args:
      chunk: f32[width], this worker's chunk.
      leaves: the synced leaves, in the order the chunks lay them end to end.
      site: the synchronization's call site (the rendezvous key, with the run).
      timeout_ms: how long a worker waits for the others of its host.
      chunk_size: elements of a chunk that count.
      inter_host: on emulated links, the inter-host link's attributes
        (``hosts`` and `coarse.EmulatedTopology.inter_host_attrs`): after the hand-out
        every worker waits for the host's network link (ffi/xla/host_gather.cc).

    Returns:
      The leaves holding the global values.
    """
    p = lax.axis_size(DATA)
    me = _vary(jnp.stack([jnp.int32(0), lax.axis_index(DATA)]).astype(jnp.int32))
    ins = [_vary(x) for x in leaves]
    call = custom_call(
        "coarse_host_gather",
        [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in ins],
        {2 + i: i for i in range(len(ins))},
    )
    # Typed attributes (ffi/xla/host_gather.h HostGatherAttrs): a fixed set,
    # the link's members unread unless emulated.
    ih = dict(inter_host or {})
    link = {
        "emulated": np.bool_(inter_host is not None),
        "hosts": np.int64(ih.get("hosts", 1)),
        "s_per_byte": np.float64(ih.get("emu_host_s_per_byte", 0.0)),
        "latency_s": np.float64(ih.get("emu_host_latency_s", 0.0)),
        "virtual_clock": np.bool_(ih.get("emu_virtual", 0)),
    }
    out = call(
        me,
        _vary(chunk),
        *ins,
        workers=np.int64(p),
        site=np.int64(site),
        timeout_ms=np.int64(timeout_ms),
        chunk=np.int64(chunk_size),
        link=link,
    )
    return list(out)
