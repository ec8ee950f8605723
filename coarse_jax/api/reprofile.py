"""The re-profile policy of a step with ``Config(reprofile_every=N)``."""

from __future__ import annotations

import dataclasses
from typing import Any

from coarse_jax.config import Config
from coarse_jax.mesh import DATA, MeshLike, has_hosts, num_proxies
from coarse_jax.plan import plan as make_plan
from coarse_jax.plan.xla_route import xla_below_bytes
from coarse_jax.profiling import profile
from coarse_jax.profiling.to_config import config_from_profile

# Fields the profile decides; every other field of the step's Config is kept.
_FROM_PROFILE = ("routes", "latency_threshold_bytes", "shard_bytes", "profile")


def check_reprofile(mesh: MeshLike, outer_trace: bool, step: str) -> None:
    """A step with ``Config(reprofile_every=N)`` can re-plan: it runs as its own program
    (``outer_trace`` is false), on one host."""
    if outer_trace:
        raise TypeError(
            f"coarse.sync({step}): Config(reprofile_every=...) cannot re-plan a step "
            "that an outer jax transformation (jax.jit, say) compiled into its own program. "
            "Fix: call the coarse.sync step directly (it is jitted already; pass "
            "donate_argnums / static_argnums to coarse.sync), or set reprofile_every=0."
        )
    if has_hosts(mesh):
        raise NotImplementedError(
            f"coarse.sync({step}): Config(reprofile_every=...) re-plans from this "
            "process's own measurements, so the processes of a mesh across hosts could "
            "disagree on the plan. Fix: set reprofile_every=0 and pass the same Config on "
            "every process."
        )


def reprofiled(mesh: MeshLike, config: Config) -> Config:
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
    return config_from_profile(fresh, **kept)


def changes_plans(
    mesh: MeshLike, plans: list[tuple[Any, dict[str, Any]]], old: Config, new: Config
) -> bool:
    """Whether ``new`` plans any of the step's ``plans`` ((tree, keyword arguments) each, as
    its traces built them with ``old``) differently: a threshold that moved between two
    piece sizes routes nothing else, and needs no recompile."""
    p, q = mesh.shape[DATA], num_proxies(mesh)

    def keys(cfg: Config) -> list[tuple[int, bool]]:
        # With the latency route decided for the mesh, as the traces did: a
        # threshold that moved may send a tree to XLA or back (xla_route.py).
        route = xla_below_bytes(cfg, mesh)
        built = [make_plan(t, p, cfg, proxies=q, xla_route=route, **kw) for t, kw in plans]
        return [(int(b.ffi_attrs()["plan_key"]), b.xla) for b in built]

    return keys(new) != keys(old)
