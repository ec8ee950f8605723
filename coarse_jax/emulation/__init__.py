"""The emulated interconnect: the Python twin of the runtime's emulator (ffi/runtime/emulator.cc).

CPU devices share one memory, so the runtime makes their transfers last what
a described interconnect would take; this package describes that
interconnect and predicts what the runtime then books:

* `topology.py`: `coarse.EmulatedTopology` (the design card's name:
  `coarse.Topology`), the links, ports and clocks the runtime enforces.
* `pcie_link.py`: the figures of each worker's PCIe link to host memory,
  where host proxies live, and its shared root complex.
* `schedule.py`: the runtime's schedule on those links, piece by piece
  (`predict_plan_sync_s`, also `coarse.perf_model.predict_plan_sync_s`),
  equal to the virtual clock's time.

Nothing here measures (that is `coarse_jax.profiling`) or runs a step.
"""

from coarse_jax.emulation.schedule import predict_plan_sync_s
from coarse_jax.emulation.topology import EmulatedTopology

__all__ = ["EmulatedTopology", "predict_plan_sync_s"]
