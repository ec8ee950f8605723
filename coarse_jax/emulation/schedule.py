"""The runtime's schedule on emulated links, piece by piece: `predict_plan_sync_s`."""

from __future__ import annotations

from typing import Any


def predict_plan_sync_s(plan: Any, topology: Any) -> float:
    """Predicted seconds for one `coarse.all_reduce` of ``plan`` on an emulated ``topology``.

    The paper's push -> proxy ring -> pull pipeline, evaluated piece by piece
    on the links and ports the runtime books (coarse_jax/emulation/topology.py,
    ffi/runtime/emulator.h), so unequal pieces, crossing routes and DENSE
    (every worker routed to one proxy: no ring, one port) are all covered:

    * pushes: each worker issues its pieces in plan order at t=0; a transfer
      books its directed link and, worker<->proxy, both devices' ports; it
      arrives ``latency + bytes / bandwidth`` after its start;
    * proxy ring: piece s starts when every proxy has its pushes and piece
      s-1 is done; two rings over the q proxies in opposite directions each
      move half of s in 2(q-1) steps of ``chunk = bytes / 2q`` (a piece held
      by one proxy has no ring); with q < p (COARSE k:1) each proxy takes its
      k clients' pushes through its one port;
    * pulls: each worker takes its pieces in order from its proxy once reduced;
    * leading layers: the worker ring (same two rings on worker links).

    With host proxies (``EmulatedTopology(proxies_on="host")``) a worker<->proxy
    transfer runs over the worker's PCIe link at its root-complex share
    (`coarse.EmulatedTopology.effective_worker_proxy_gbps`) and books only the
    worker's port: host memory has no serial-bus port, so k clients of one
    host proxy do not queue on it.

    Host costs (copies, additions, thread wake-ups) are not modelled: the
    runtime does them inside the emulated transfers' windows where it can
    (ffi/runtime/ring.cc), so they show only when they outlast a transfer;
    pick a ``time_scale`` that makes the emulated links dominate.
    `coarse.perf_model.link_bound` is the floor under this schedule.

    Args:
      plan: a `coarse.diagnostics.Plan` (`coarse.diagnostics.plan(tree, mesh, config)`).
      topology: the `coarse.EmulatedTopology` it runs on (its ``time_scale`` applies).

    Returns:
      Seconds; on ``clock="virtual"`` the runtime's simulated time of the same
      synchronization (`coarse.diagnostics.virtual_sync_seconds`) equals it.

    Example:
      >>> topo = coarse.EmulatedTopology.preset("v100", workers=4, clock="virtual")
      >>> cfg = coarse.Config(topology=topo)
      >>> tree = {"w": jnp.ones((256, 1024))}                    # 1 MiB per worker
      >>> step = coarse.sync(lambda t, x: coarse.all_reduce(t), mesh=mesh, config=cfg)
      >>> _ = jax.block_until_ready(step(tree, jnp.ones((8,))))
      >>> plan = coarse.diagnostics.plan(tree, mesh, cfg)
      >>> predicted = coarse.perf_model.predict_plan_sync_s(plan, topo)
      >>> (simulated,) = coarse.diagnostics.virtual_sync_seconds()
      >>> abs(simulated - predicted) < 1e-8
      True
    """
    p, q = plan.workers, plan.proxies
    host_proxies = getattr(topology, "proxies_on", "devices") == "host"
    link_free: dict[tuple[int, int], float] = {}
    port_in = [0.0] * (p + q)
    port_out = [0.0] * (p + q)

    def book(src: int, dst: int, nbytes: float, ready: float) -> float:
        src_w, dst_w = src < p, dst < p
        if src_w and dst_w:
            kind, a, b = "ww", src, dst
        elif not src_w and not dst_w:
            kind, a, b = "pp", src - p, dst - p
        else:
            kind = "wp"
            a, b = (src, dst - p) if src_w else (dst, src - p)
        s_per_byte, latency = topology.link(kind, a, b)
        busy = nbytes * s_per_byte
        start = max(ready, link_free.get((src, dst), 0.0))
        serial_bus = src_w != dst_w
        # The ports booked: both devices', or with host proxies the worker's only.
        outs = [src] if serial_bus and (src_w or not host_proxies) else []
        ins = [dst] if serial_bus and (dst_w or not host_proxies) else []
        start = max([start] + [port_out[d] for d in outs] + [port_in[d] for d in ins])
        link_free[(src, dst)] = start + busy
        for d in outs:
            port_out[d] = start + busy
        for d in ins:
            port_in[d] = start + busy
        return start + busy + latency

    def ring_s(nbytes: float, kind: str, n: int) -> float:
        if n == 1:
            return 0.0
        # Lockstep rings are bounded by their slowest neighbour link. With two
        # members the rings' "next" and "previous" are the same device: both
        # halves share one directed link per step, one after the other.
        sharing = 2 if n == 2 else 1
        step = max(
            topology.transfer_s(kind, k, (k + 1) % n, sharing * nbytes / (2 * n)) for k in range(n)
        )
        return 2 * (n - 1) * step

    pieces = plan.pieces
    # Book in time order (piece by piece, all workers), as the devices do.
    arrival = [[book(i, p + pc.dest[i], pc.nbytes, 0.0) for i in range(p)] for pc in pieces]
    ring_end = 0.0
    done = 0.0
    reduced = []
    for s, pc in enumerate(pieces):
        start = max(max(arrival[s]), ring_end)
        holder = pc.dest[0] if all(d == pc.dest[0] for d in pc.dest) else None
        ring_end = start + (0.0 if holder is not None else ring_s(pc.nbytes, "pp", q))
        reduced.append(ring_end)
    for s, pc in enumerate(pieces):
        for i in range(p):
            done = max(done, book(p + pc.dest[i], i, pc.nbytes, reduced[s]))
    lead_bytes = sum(plan.leaves[t].nbytes for t in plan.leading_leaves)
    if plan.leading_leaves:
        # The workers keep the result: no hand-over to the proxies, which
        # run no program (docs/guides/design.md, "The proxies as a service").
        done = max(done, ring_s(lead_bytes, "ww", p))
    return done
