"""The PCIe link from each worker to host memory, where host proxies live.

With ``make_mesh(..., proxies_on="host")`` the proxies are host memory, and a
worker reaches them over its own PCIe link to the CPU (the paper's memory
device on a serial bus). `coarse.EmulatedTopology.preset(name, workers,
proxies_on="host")` describes that link with these figures, per direction,
for an x16 link:

=======  =========  ==========  ==================  ===========
preset   PCIe gen   raw GB/s    effective (preset)  latency
=======  =========  ==========  ==================  ===========
pcie3    3.0        15.75       12.5 GB/s           2 us
pcie4    4.0        31.5        25.0 GB/s           2 us
pcie5    5.0        63.0        50.0 GB/s           2 us
=======  =========  ==========  ==================  ===========

* Raw: 8, 16 and 32 GT/s per lane with 128b/130b encoding, times 16 lanes
  (PCI-SIG, PCI Express Base Specification 3.0, 4.0 and 5.0).
* Effective: about 80% of raw, what is left after packet (TLP/DLLP) overheads
  and what pinned host<->device copies reach in practice (e.g. CUDA's
  ``bandwidthTest`` sample reports about 12-13 GB/s on Gen3 x16, 25 on Gen4,
  50 on Gen5). Rounded figures, not one machine's measurement.
* Latency: 2 us, an assumption of this project (one DMA's setup and a trip
  across the bus is a few us; PCIe generations differ little in it).
* The paper's boards (``"t4"``, ``"v100"``, ``"p100"``) are PCIe Gen3 to the
  host, so with ``proxies_on="host"`` they get the pcie3 link.

**The root complex is shared.** The workers' links meet on the way to host
memory: on boards like NVIDIA's DGX-1 (and AWS p3.16xlarge, built the same
way) two GPUs sit behind one PCIe switch whose one x16 uplink goes to the CPU
(NVIDIA DGX-1 System Architecture white paper, 2017; DGX A100 and DGX H100
pair their GPUs behind PCIe switches the same way). So the presets put
``root_complex_workers = 2`` consecutive workers on one uplink that carries
one x16 link's effective bandwidth (``root_complex_gbps``) per direction.
The share is static: each worker's PCIe link runs at
``min(link, root_complex_gbps / workers on its root complex)``, its fair share
when all of them move data at once, which is what a synchronization does
(every worker pushes, then every worker pulls). A worker that moves data
while the others of its root complex are idle still gets only its share:
the model is pessimistic there.

Host memory itself is not a serial bus: a host proxy has no port of its own,
so k workers pushing to one host proxy queue only on the root complex (device
proxies queue on the proxy's port). Proxy<->proxy transfers (the proxies'
ring) are copies in host memory: 20 GB/s and 1 us, an assumption (several
cores' copy rate, well under a server socket's DRAM bandwidth).
"""

from __future__ import annotations

import math

PCIE = {"pcie3": (12.5, 2.0), "pcie4": (25.0, 2.0), "pcie5": (50.0, 2.0)}  # (GB/s, us)
BOARD_PCIE = {"t4": "pcie3", "v100": "pcie3", "p100": "pcie3"}  # the paper's boards: Gen3
ROOT_COMPLEX_WORKERS = 2  # GPUs per PCIe switch uplink (DGX-1 / p3.16xlarge)
HOST_MEMORY = (20.0, 1.0)  # proxy<->proxy copies in host memory (GB/s, us): an assumption
PLACEMENTS = ("devices", "host")


def group_sizes(workers: int, per_group: int) -> list[int]:
    """For each worker, how many workers share its root complex (consecutive groups).

    Args:
      workers: p.
      per_group: workers per root complex (the last group may be smaller); 0 means all p.

    Returns:
      A list of p ints.

    Example:
      >>> from coarse_jax.emulation.pcie_link import group_sizes
      >>> group_sizes(5, 2)
      [2, 2, 2, 2, 1]
    """
    g = per_group or workers
    return [min(g, workers - (i // g) * g) for i in range(workers)]


def shared_gbps(link_gbps: float, root_complex_gbps: float, sharing: int) -> float:
    """A PCIe link's bandwidth with its root complex shared by ``sharing`` workers.

    Args:
      link_gbps: the link's own bandwidth, GB/s.
      root_complex_gbps: the root complex's aggregate bandwidth per direction
        (``math.inf``: not a limit).
      sharing: workers on that root complex.

    Returns:
      ``min(link_gbps, root_complex_gbps / sharing)``.

    Example:
      >>> from coarse_jax.emulation.pcie_link import shared_gbps
      >>> shared_gbps(25.0, 25.0, 2), shared_gbps(25.0, float("inf"), 2)
      (12.5, 25.0)
    """
    return min(link_gbps, root_complex_gbps / sharing)


def check_placement(proxies_on: object, root_complex_gbps: object, per_group: object) -> None:
    """Raises ValueError naming the argument when a PCIe-link field is invalid."""
    if proxies_on not in PLACEMENTS:
        raise ValueError(
            f"EmulatedTopology.proxies_on: expected one of {PLACEMENTS}, got {proxies_on!r}; "
            '"host" for make_mesh(..., proxies_on="host"), "devices" otherwise.'
        )
    if isinstance(root_complex_gbps, bool) or not isinstance(root_complex_gbps, (int, float)):
        raise ValueError(
            f"EmulatedTopology.root_complex_gbps: expected a number, got {root_complex_gbps!r}."
        )
    if not root_complex_gbps > 0:
        raise ValueError(
            f"EmulatedTopology.root_complex_gbps: expected > 0 GB/s (math.inf: no cap), got "
            f"{root_complex_gbps!r}."
        )
    if isinstance(per_group, bool) or not isinstance(per_group, int) or per_group < 0:
        raise ValueError(
            "EmulatedTopology.root_complex_workers: expected an int >= 0 (0: all workers share "
            f"one), "
            f"got {per_group!r}."
        )
    if proxies_on == "devices" and (root_complex_gbps != math.inf or per_group):
        raise ValueError(
            "EmulatedTopology.root_complex_gbps / root_complex_workers: the root complex is shared "
            "by "
            "PCIe links, which only host proxies use; got them with proxies_on='devices'. "
            "Fix: pass proxies_on='host', or leave them at their defaults."
        )
