"""The public API: `sync`, `value_and_grad`, `value_and_update`, `all_reduce`, `on_workers`.

* `sync.py`: `coarse.sync` and the `SyncedStep` it returns (compiles per config, checks
  arguments, dispatches, re-profiles); `_program.py` builds its program,
  `_in_flight.py` bounds its calls in flight, `proxy_state.py` reaches the
  proxies' state.
* `grad.py`: `coarse.value_and_grad`, pushing gradients from the backward pass.
* `update.py`: `coarse.value_and_update`, the optimizer on the proxies, and the
  step's access to their state (`_update.py`: stores and the ring's operands).
* `memory.py`: `coarse.memory_report`, each tier's bytes.
* `collectives.py`: `coarse.all_reduce` and `coarse.on_workers`.
* `_phases.py`: one synchronization's custom calls in step order.
* `_context.py`: what a step knows while it is traced (mesh, config, call sites).
* `reprofile.py`: when and how a step re-profiles its links.
"""

from coarse_jax.api.collectives import all_reduce, on_workers
from coarse_jax.api.grad import value_and_grad
from coarse_jax.api.memory import MemoryReport, TierMemory, memory_report
from coarse_jax.api.sync import SyncedStep, sync
from coarse_jax.api.update import value_and_update

__all__ = [
    "MemoryReport",
    "SyncedStep",
    "TierMemory",
    "all_reduce",
    "memory_report",
    "on_workers",
    "sync",
    "value_and_grad",
    "value_and_update",
]
