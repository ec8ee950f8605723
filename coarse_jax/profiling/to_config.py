"""A `coarse.Config` planned from a `Profile`: the profiler's side of `Config.from_profile`.

A Config is a plain value and imports nothing from the profiler; building one
from measurements belongs here, with the measurements. `coarse.Config.from_profile`
(the design card's entry) calls `config_from_profile`, which this module hands to
`coarse_jax.config` when it loads (`register_profile_builder`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from coarse_jax.config import Config, register_profile_builder
from coarse_jax.profiling import routing
from coarse_jax.profiling.data import Profile


def config_from_profile(profile: Profile, **overrides: Any) -> Config:
    """A Config whose routes, latency threshold and shard size come from ``profile``.

    The paper's planner (Section III-E, `coarse_jax.profiling.routing`);
    `coarse.Config.from_profile` is this function under the design card's name:

    * ``routes``: per worker, LatProxy = lowest measured latency, BwProxy =
      highest peak bandwidth among the profile's q proxies
      (`routing.routes_from_profile`), so they are valid for a mesh of
      the profile's p workers and q proxies (``routes_for(p, q)``). A
      profile from `coarse.diagnostics.profile` carries its decisions
      (`Profile.decisions`): each is clear from repeated measurements by
      a 5% margin, or, where the measurements left it unclear within
      the profiler's time budget, the emulated topology's model's choice
      (the local proxy on the host's own devices); these are followed.
    * ``latency_threshold_bytes``: the largest `routing.threshold_bytes`
      (where the two proxies' transfer times cross, measured or, when
      not clear, the model's) over workers: one value
      serves the whole mesh. 0 when LatProxy == BwProxy everywhere (the
      value cannot matter then).
    * ``shard_bytes``: the largest `routing.shard_bytes_from_profile` (the
      smallest measured size reaching 95% of the BwProxy link's peak) over
      workers, at least 4, so every worker's shards reach full bandwidth.

    ``profile`` itself is kept (for ``leading_bytes="auto"`` and
    re-profiling). ``profile.topology`` is only a name, so ``topology`` is
    left at its default; pass ``topology=coarse.EmulatedTopology...`` to run on the
    emulated links that were measured. ``overrides`` replace any field.

    Args:
      profile: a `coarse.diagnostics.Profile` (from `coarse.diagnostics.profile` or
        `Profile.load`).
      **overrides: Config fields to set instead (``leading_bytes``,
        ``topology``, ``step_times_s``, ...).

    Returns:
      The `Config`.

    Raises:
      ValueError: an override that is not a Config field, or a value Config rejects.

    Example:
      >>> topo = coarse.EmulatedTopology.preset("v100", 4, clock="virtual")
      >>> sizes = [1 << 10, 1 << 16, 1 << 22]
      >>> prof = coarse.diagnostics.profile(mesh, topology=topo, sizes=sizes)
      >>> cfg = coarse.Config.from_profile(prof, topology=topo, leading_bytes=1 << 16)
      >>> cfg.routes, cfg.shard_bytes, cfg.leading_bytes
      (((0, 1), (1, 2), (2, 3), (3, 0)), 4194304, 65536)
      >>> shared = coarse.make_mesh(workers=4, proxies=2)                 # COARSE(2:1)
      >>> topo = coarse.EmulatedTopology.preset("v100", 4, proxies=2, clock="virtual")
      >>> prof = coarse.diagnostics.profile(shared, topology=topo, sizes=sizes)
      >>> coarse.Config.from_profile(prof, topology=topo).routes_for(4, proxies=2)
      ((0, 1), (0, 1), (1, 0), (1, 0))
    """

    fields = {f.name for f in dataclasses.fields(Config)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(
            f"config_from_profile: unknown Config field(s) {unknown}; expected some of "
            f"{sorted(fields)}."
        )
    workers = range(profile.workers)
    thresholds = [routing.threshold_bytes(profile, i) for i in workers]
    known = [t for t in thresholds if t is not None]
    cfg = Config(
        shard_bytes=max(4, *(routing.shard_bytes_from_profile(profile, i) for i in workers)),
        latency_threshold_bytes=max(known) if known else 0,
        routes=routing.routes_from_profile(profile),
        profile=profile,
    )
    cfg.routes_for(profile.workers, profile.proxies)  # the planner names proxies 0..q-1
    return dataclasses.replace(cfg, **overrides)


register_profile_builder(config_from_profile)
