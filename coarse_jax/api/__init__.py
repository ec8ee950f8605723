"""The user's calls: `sync`, `value_and_grad`, `value_and_update`, `all_reduce`.

* `sync.py`: `coarse.sync` and the `SyncedStep` it returns; the machinery
  that binds a call's arguments, places them, compiles the program and bounds
  the calls in flight is `coarse_jax.dispatch`, below this package.
  `proxy_state.py` reaches the proxies' state, `snapshots.py` writes it,
  `step_info.py` and `timeline.py` tell what a step did.
* `grad.py`: `coarse.value_and_grad`, pushing gradients from the backward pass.
  `_filter.py`: what it differentiates in an Equinox Module (its floating arrays).
* `update.py`: `coarse.value_and_update`, the optimizer on the proxies, and the
  step's access to their state (`_stores.py`: stores and the ring's operands).
* `collectives.py`: `coarse.all_reduce`.
* `memory.py`: `coarse.diagnostics.memory_report`, each tier's bytes.
* `_phases.py`: one synchronization's custom calls in step order; `_inter_host.py`
  the inter-host step; `_latency_route.py` a small tree reduced by XLA.
* `reprofile.py`: when and how a step re-profiles its links.
"""

from coarse_jax.api.collectives import all_reduce
from coarse_jax.api.grad import value_and_grad
from coarse_jax.api.memory import MemoryReport, TierMemory, memory_report
from coarse_jax.api.snapshots import Snapshots
from coarse_jax.api.sync import SyncedStep, sync
from coarse_jax.api.update import value_and_update

__all__ = [
    "MemoryReport",
    "Snapshots",
    "SyncedStep",
    "TierMemory",
    "all_reduce",
    "memory_report",
    "sync",
    "value_and_grad",
    "value_and_update",
]
