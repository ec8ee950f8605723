"""The re-profile policy of a step with ``Config(reprofile_every=N)``."""

from __future__ import annotations

import dataclasses

from jax.sharding import Mesh

from coarse_jax.config import Config
from coarse_jax.profiling import profile

# Fields the profile decides; every other field of the step's Config is kept.
_FROM_PROFILE = ("routes", "latency_threshold_bytes", "shard_bytes", "profile")


def reprofiled(mesh: Mesh, config: Config) -> Config:
    """``config`` re-planned from a fresh profile of ``mesh``'s links.

    Measures the sizes of the profile ``config`` came from, on the same
    emulated topology (at the time scale it was profiled with) if any, with 3
    repetitions, and keeps every field the profile does not decide.
    """
    old = config.profile
    assert old is not None, "Config.__post_init__: reprofile_every needs a profile"
    topology = config.topology
    if topology is not None:
        topology = dataclasses.replace(topology, time_scale=old.time_scale)
    fresh = profile(mesh, topology=topology, sizes=old.sizes, reps=3)
    kept = {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(config)
        if f.name not in _FROM_PROFILE
    }
    return Config.from_profile(fresh, **kept)
