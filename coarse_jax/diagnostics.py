"""`coarse.diagnostics`: what a step's plan, links, memory and clock say, in one place.

The top level of `coarse_jax` holds the training core (`sync`,
`value_and_grad`, `value_and_update`, `all_reduce`, `make_mesh`, `Config`,
`optim`); everything that looks at a step rather than runs it is here:

* the plan: `plan` (what happens to each leaf of a tree) and `Plan`
  (``Plan.summary()``);
* the links: `profile` measures them and returns a `Profile`, which
  `config_from_profile` plans a `coarse.Config` from (also reached as
  `coarse.Config.from_profile`, the design card's name); `measure_step_times` times the
  forward and backward passes for ``Config(leading_bytes="auto")``;
* memory: `memory_report` (what each tier of one step holds: `MemoryReport`,
  `TierMemory`), `runtime_stats` (what the runtime keeps between steps, all
  steps together) and `set_memory_limits` (its bounds);
* time: `virtual_sync_seconds` (each synchronization's simulated time on a
  virtual-clock `coarse.EmulatedTopology`); a step's own timeline,
  ``SyncedStep.timeline()`` with ``Config(trace=True)``, is a `Timeline` of
  `Span` records;
* the build: `CudaSupport`, what `coarse.has_cuda_support()` answers.

Example:
  >>> topo = coarse.EmulatedTopology.preset("v100", 4, clock="virtual")
  >>> prof = coarse.diagnostics.profile(mesh, topology=topo, sizes=[1 << 10, 1 << 20])
  >>> prof.workers, prof.proxies
  (4, 4)
  >>> plan = coarse.diagnostics.plan({"w": jnp.ones(4)}, mesh)
  >>> plan.workers, plan.total_bytes
  (4, 16)
"""

from __future__ import annotations

from coarse_jax._ffi import CudaSupport, runtime_stats, set_memory_limits, virtual_sync_seconds
from coarse_jax.api import MemoryReport, TierMemory, memory_report
from coarse_jax.api.timeline import Span, Timeline
from coarse_jax.plan import Plan, plan
from coarse_jax.profiling import Profile, measure_step_times, profile
from coarse_jax.profiling.to_config import config_from_profile

__all__ = [
    "CudaSupport",
    "MemoryReport",
    "Plan",
    "Profile",
    "Span",
    "TierMemory",
    "Timeline",
    "config_from_profile",
    "measure_step_times",
    "memory_report",
    "plan",
    "profile",
    "runtime_stats",
    "set_memory_limits",
    "virtual_sync_seconds",
]
