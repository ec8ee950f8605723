"""Measuring the mesh's links and planning from the measurements (paper Section III-E).

* `measure.py`: `coarse.diagnostics.profile` (links through the runtime's own transport),
  `coarse.diagnostics.measure_step_times`, `robust_time`.
* `data.py`: `coarse.diagnostics.Profile`, the measurements (`file_format.py`: as JSON).
* `links.py`: the kinds of link, the figures read from their times, and the
  face of a `Profile` that `routing` and `report` read.
* `decision.py`, `rounds.py`: routing decisions, made from repeated rounds.
* `routing.py`: LatProxy / BwProxy per worker, the threshold S, the shard size S'.
* `report.py`: `Profile.table()` and `Profile.plot()`.
* `to_config.py`: `config_from_profile`, a `coarse.Config` planned from a `Profile`
  (what `coarse.Config.from_profile` calls).

The emulated interconnect it measures on (`coarse.EmulatedTopology`) is
`coarse_jax.emulation`, a layer below.

The command line that profiles a mesh and compares the sync schemes on it,
``python -m coarse_jax.cli``, is `coarse_jax.cli`: it syncs through
`coarse.sync`, a layer above this package.
"""

from coarse_jax.profiling.data import Profile
from coarse_jax.profiling.decision import Decision
from coarse_jax.profiling.measure import measure_step_times, profile, robust_time

__all__ = ["Decision", "Profile", "measure_step_times", "profile", "robust_time"]
