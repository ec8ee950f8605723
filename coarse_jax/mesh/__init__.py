"""The coarse mesh: the workers, which users place arrays on, and a record of their proxies.

``coarse.make_mesh(workers=p)`` returns a jax ``Mesh`` of the p workers with
axes ``("tier", "data")`` of shape ``(1, p)`` (``("host", "tier", "data")``
across processes). It is the mesh jax's and flax's sharding guides expect:
``NamedSharding(mesh, P())`` replicates over the workers and
``NamedSharding(mesh, P("data"))`` splits a batch over them, with no copy on a
proxy. "tier" (size 1) stays nameable: inside a step ``lax.axis_index("tier")``
is 0 and ``lax.psum(x, "tier")`` is ``x``.

The proxies run no XLA program (their part of a step is the runtime's
service), so they need no place in a jax mesh. Where they are (jax devices,
or host memory), how many (q), and which workers each serves is a `Proxies`
record that `make_mesh` keeps beside the mesh it returns (`proxies_of`); the
same for device and host proxies. Whoever wants the full two-tier device
mesh, proxies on tier 1, asks for it: `two_tier_mesh`. `coarse.sync` still
takes such a mesh (and code written for it, with state placed on both tiers,
still runs; its outputs then follow onto both tiers, `coarse.sync` says at
what cost).

jax keeps one ``Mesh`` object per devices and axis names, so one set of
workers has one record at a time: a later `make_mesh` of the same workers
with other proxies replaces it, and warns (`ProxiesReplaced`). A step keeps
the proxies it was decorated with (`Tiers`, fixed by `check_mesh`).
"""

from coarse_jax.mesh.make import make_mesh
from coarse_jax.mesh.tiers import (
    AXES,
    DATA,
    HOST,
    HOST_AXES,
    PROGRAM_AXES,
    PROGRAM_HOST_AXES,
    PROXIES_ON,
    TIER,
    LegacyPlacement,
    MeshLike,
    Proxies,
    ProxiesReplaced,
    Tiers,
    batch_axes,
    check_mesh,
    has_hosts,
    local_mesh,
    local_proxy,
    local_tiers,
    num_proxies,
    platform,
    proxies_of,
    proxies_on,
    proxy_devices,
    traced_axes,
    two_tier_mesh,
    workers_mesh,
)

__all__ = [
    "AXES",
    "DATA",
    "HOST",
    "HOST_AXES",
    "PROGRAM_AXES",
    "PROGRAM_HOST_AXES",
    "PROXIES_ON",
    "TIER",
    "LegacyPlacement",
    "MeshLike",
    "Proxies",
    "ProxiesReplaced",
    "Tiers",
    "batch_axes",
    "check_mesh",
    "has_hosts",
    "local_mesh",
    "local_proxy",
    "local_tiers",
    "make_mesh",
    "num_proxies",
    "platform",
    "proxies_of",
    "proxies_on",
    "proxy_devices",
    "traced_axes",
    "two_tier_mesh",
    "workers_mesh",
]
