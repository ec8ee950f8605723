"""What the links alone allow: a lower bound on one synchronization of a plan (`link_bound`).

`predict_plan_sync_s` is the runtime's schedule; this is the floor under it.
Every byte a scheme moves crosses some link (and, worker<->proxy, the two
devices' serial-bus ports), and a resource carries one transfer at a time per
direction. So a synchronization lasts at least as long as its busiest
resource is busy, plus the latency a byte cannot avoid on its way:

* worker<->proxy ports: each worker's out port carries its pushes, its in
  port its pulls (every piece, over the link to the proxy it is routed to);
  each proxy's in port the pushes it receives, its out port the pulls it
  serves. DENSE: proxy 0's in port carries p·n, its out port p·n. At
  COARSE k:1 a proxy's ports carry its k clients' pushes and pulls. A host
  proxy (``EmulatedTopology(proxies_on="host")``) has no port: only the workers'
  PCIe links count, each at its root-complex share.
* ring links: a ring of m members (q proxies, or p workers) over m bytes (two rings in opposite
  directions, halves of the bytes) moves (p-1)/p·m over each directed link
  between neighbours (with p = 2 the one link per direction carries both
  halves: m); AllReduce (the worker ring over all n bytes) and COARSE's proxy
  ring (each piece that several proxies hold).
* latency: the last transfer through a resource still has to arrive (one
  latency of that resource's links, the smallest); the worker ring's 2(p-1)
  lockstep steps each wait for their slowest link's latency.

So the bound is max over resources of (busy + latency).

The bound is for the scheme as planned (its routes, its rings), not for every
algorithm one could run on those links. It assumes perfect overlap: pushes,
rings and pulls of different pieces all at once, so the gap between it and
`predict_plan_sync_s` is what the schedule's order costs (pipeline fill and
drain, a ring waiting for the slowest push), and the gap between it and a
measured time adds the host's own costs.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class LinkBound:
    """A lower bound on one synchronization, from the links alone.

    Attributes:
      seconds: the bound: ``busy_s[binding] + latency_s``.
      binding: the resource that sets it, e.g. "proxy 0 in port" or "worker ring link 0->1".
      busy_s: seconds each resource must carry data (time_scale applied).
      latency_s: the binding resource's unavoidable latency (see the module docstring).

    Example:
      >>> b = coarse.perf_model.LinkBound(1.5, "proxy 0 in port", {"proxy 0 in port": 1.0}, 0.5)
      >>> b.seconds == b.busy_s[b.binding] + b.latency_s
      True
    """

    seconds: float
    binding: str
    busy_s: dict[str, float]
    latency_s: float


def _ring_link_bytes(p: int, nbytes: float) -> float:
    """Bytes one directed neighbour link carries in the two-ring all-reduce of ``nbytes``."""
    if p == 1:
        return 0.0
    # 2(p-1) steps of nbytes/2p per ring; with two members the rings' "next"
    # and "previous" are the same device, so both halves share the link.
    sharing = 2 if p == 2 else 1
    return 2 * (p - 1) * sharing * nbytes / (2 * p)


def link_bound(plan: Any, topology: Any) -> LinkBound:
    """Lower bound on `coarse.all_reduce` of ``plan`` on an emulated ``topology``, links only.

    Args:
      plan: a `coarse.diagnostics.Plan` (`coarse.diagnostics.plan(tree, mesh, config)`).
      topology: the `coarse.EmulatedTopology` it runs on (its ``time_scale`` applies).

    Returns:
      A `LinkBound` with the seconds, the binding resource and every resource's busy time.

    Raises:
      ValueError: ``topology`` describes another worker count than ``plan``.

    Example:
      >>> topo = coarse.EmulatedTopology.preset("v100", workers=4, clock="virtual")
      >>> tree = {"w": jnp.zeros((256, 1024))}                  # 1 MiB per worker
      >>> b = coarse.perf_model.link_bound(coarse.diagnostics.plan(tree, mesh), topo)
      >>> print(f"{b.seconds * 1e6:.1f} us, bound by {b.binding}")
      119.5 us, bound by worker 0 out port
    """
    p, q = plan.workers, plan.proxies
    if (topology.workers, topology.proxies) != (p, q):
        raise ValueError(
            f"link_bound: topology describes {topology.workers} workers and "
            f"{topology.proxies} proxies, the plan {p} and {q}; use "
            f"coarse.EmulatedTopology.preset(name, workers={p}, proxies={q})."
        )
    host_proxies = getattr(topology, "proxies_on", "devices") == "host"
    busy: dict[str, float] = {}
    latency: dict[str, float] = {}

    def add(resource: str, seconds: float, lat: float) -> None:
        busy[resource] = busy.get(resource, 0.0) + seconds
        latency[resource] = min(latency.get(resource, lat), lat)

    def wp(worker: int, proxy: int, nbytes: float) -> tuple[float, float]:
        s_per_byte, lat = topology.link("wp", worker, proxy)
        return nbytes * s_per_byte, lat

    for pc in plan.pieces:
        for i, k in enumerate(pc.dest):
            t, lat = wp(i, k, pc.nbytes)
            add(f"worker {i} out port", t, lat)  # push
            add(f"worker {i} in port", t, lat)  # pull
            if not host_proxies:
                add(f"proxy {k} in port", t, lat)
                add(f"proxy {k} out port", t, lat)
        if any(d != pc.dest[0] for d in pc.dest):  # held by several proxies: their ring
            per_link = _ring_link_bytes(q, pc.nbytes)
            for k in range(q):
                for j in {(k + 1) % q, (k - 1) % q} - {k}:
                    s_per_byte, lat = topology.link("pp", k, j)
                    add(f"proxy ring link {k}->{j}", per_link * s_per_byte, lat)
    lead_bytes = float(sum(plan.leaves[t].nbytes for t in plan.leading_leaves))
    if plan.leading_leaves and p > 1:
        per_link = _ring_link_bytes(p, lead_bytes)
        links = [(i, j) for i in range(p) for j in sorted({(i + 1) % p, (i - 1) % p} - {i})]
        # Lockstep: each of the 2(p-1) steps waits for its slowest link's latency.
        ring_lat = 2 * (p - 1) * max(topology.link("ww", i, j)[1] for i, j in links)
        for i, j in links:
            add(f"worker ring link {i}->{j}", per_link * topology.link("ww", i, j)[0], ring_lat)
    if not busy:
        return LinkBound(seconds=0.0, binding="none", busy_s={}, latency_s=0.0)
    binding = max(busy, key=lambda r: busy[r] + latency[r])
    return LinkBound(
        seconds=busy[binding] + latency[binding],
        binding=binding,
        busy_s=busy,
        latency_s=latency[binding],
    )
