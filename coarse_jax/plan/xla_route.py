"""The latency route: which trees XLA reduces itself (``Config.xla_below_bytes``).

The paper's answer for the latency-bound end is size routing: small tensors
take the path with the lowest latency. A plan has one path more than the
paper's proxies: the workers' own collective inside the step's XLA program
(a ``psum`` over "data"), which needs no runtime thread to wake. Whether it
is the lowest-latency path depends on the mesh, so ``"auto"`` (the default)
is decided here, at trace time, from the mesh the step runs on:

* CPU workers in one process, no emulated links: XLA's collective is a
  shared-memory reduction. Measured on the project's 2-core CPU host
  (docs/guides/performance.md, "The latency route"), it took 1.17-1.23x
  ``lax.psum``'s time at one leaf of 1 KiB to 1 MiB, against 1.26-2.12x
  through the proxies, and a tree of 32 leaves of 1 KiB took 0.78 ms through
  the proxies against 2.9 ms as one psum per leaf (one psum for the whole
  tree, as `coarse_jax.api._latency_route` does, is one collective). So a tree
  up to ``Config.latency_threshold_bytes`` (the size under which pieces go
  to a latency proxy; measured by `Config.from_profile`) goes through XLA.
  Above it the two paths measured within noise of each other (4-64 MiB),
  and the proxies also overlap the backward pass and hold the optimizer.
* GPU workers: the proxies (0, never). XLA's collective there is NCCL's,
  never measured against the proxies on this project's GPUs yet.
* Across hosts (a "host" axis): the proxies. A sync across two processes
  took 0.41x ``psum``'s time through them (gloo's collective is slow).
* Emulated links (``Config.topology``): the proxies; the emulation times
  their transfers only, not XLA's collective.

An int ``Config.xla_below_bytes`` is used as given (0: never).
"""

from __future__ import annotations

from typing import Any

from coarse_jax.config import Config
from coarse_jax.mesh import has_hosts

AUTO = "auto"
# The reason of a plan built for a number of workers: `Plan.summary` says nothing of it.
NO_MESH = "auto (Config.xla_below_bytes): no mesh given, no platform to decide from"


def xla_below_bytes(config: Config, mesh: Any = None) -> tuple[int, str]:
    """The XLA route's cap in bytes for ``config`` on ``mesh``, and why.

    Args:
      config: the step's `Config`.
      mesh: the coarse mesh, or None (a plan for a number of workers: no
        platform to decide from, so ``"auto"`` is 0).

    Returns:
      ``(cap, reason)``: trees of at most ``cap`` bytes (0: none) are reduced
      by XLA; ``reason`` is one line for `Plan.summary`.
    """
    value = config.xla_below_bytes
    if value != AUTO:
        assert isinstance(value, int)  # Config checks it
        return value, "Config.xla_below_bytes"
    if mesh is None:
        return 0, NO_MESH
    if config.topology is not None:
        return 0, "auto (Config.xla_below_bytes): links emulated (Config.topology) time the proxies"
    if has_hosts(mesh):
        return 0, "auto (Config.xla_below_bytes): across hosts the proxies beat XLA's collective"
    if mesh.devices.flat[0].platform != "cpu":
        return 0, "auto (Config.xla_below_bytes): on GPUs, XLA's collective not yet measured"
    return (
        config.latency_threshold_bytes,
        "auto (Config.xla_below_bytes): on CPU workers in one process XLA's psum is a "
        "shared-memory reduction with no thread to wake; up to latency_threshold_bytes",
    )
