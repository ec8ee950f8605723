"""The hierarchical step across hosts on emulated links: `predict_hosts_sync_s`.

On a ``("host", "tier", "data")`` mesh each host first synchronizes on its
own, exactly as on one host (`predict_plan_sync_s` of the host's plan), then
the hosts exchange their results through XLA collectives over "host"
(coarse_jax/api/_inter_host.py) in the workers' program (the proxies run no XLA
program): the synced leaves in p chunks, worker k carrying chunk k, in f32. Every byte of the host's
result leaves through the host's one network link and every other host's
comes in through it, so its NIC carries ``(hosts - 1)`` times the host's f32
result each way (two hosts: a psum; more: an all-gather), whichever tier
sends it. The runtime charges exactly that (``coarse_host_gather``, real
clock), from the end of the host's own synchronization.

Not modelled: the in-host hand-out afterwards (every device gets every chunk
through the process's memory, ffi/runtime/hand_out.h; on GPUs an all-gather
over in-host links), the XLA ops around the collective, and the
collective's own wall time where it outlasts the emulated transfer.
"""

from __future__ import annotations

from typing import Any

from coarse_jax.emulation.schedule import predict_plan_sync_s

F32_BYTES = 4


def inter_host_bytes(plan: Any, hosts: int) -> int:
    """Bytes one host's network link carries each way in the inter-host step of ``plan``.

    Args:
      plan: the `coarse.diagnostics.Plan` of one host (its ``workers`` are the host's).
      hosts: how many hosts (processes) the mesh spans.

    Returns:
      ``(hosts - 1)`` times the host's synchronized values in f32, every
      leaf, proxy-synced or leading, as 4 bytes per element.

    Raises:
      ValueError: ``hosts`` is not an int >= 1.

    Example:
      >>> plan = coarse.diagnostics.plan({"w": jnp.zeros((1024,), jnp.bfloat16)}, 4)
      >>> coarse.perf_model.inter_host_bytes(plan, hosts=3)          # 2 x 1024 f32 values
      8192
    """
    if isinstance(hosts, bool) or not isinstance(hosts, int) or hosts < 1:
        raise ValueError(f"inter_host_bytes: hosts must be an int >= 1, got {hosts!r}.")
    elems = sum(plan.leaves[t].size for t in (*plan.proxy_leaves, *plan.leading_leaves))
    return (hosts - 1) * F32_BYTES * elems


def predict_hosts_sync_s(plan: Any, topology: Any, hosts: int) -> float:
    """Predicted seconds for one `coarse.all_reduce` of ``plan`` across ``hosts`` hosts.

    The host's own synchronization (`predict_plan_sync_s`) followed by the
    inter-host exchange on ``topology``'s inter-host link:
    ``time_scale * (inter_host_us + inter_host_bytes / inter_host_gbps)``.
    One host (``hosts=1``) is `predict_plan_sync_s`.

    Args:
      plan: the `coarse.diagnostics.Plan` of one host.
      topology: the `coarse.EmulatedTopology` of one host's devices, with its inter-host link.
      hosts: how many hosts (processes).

    Returns:
      Seconds (``topology.time_scale`` applied).

    Raises:
      ValueError: ``hosts`` is not an int >= 1, or ``topology`` describes
        another worker count than ``plan``.

    Example:
      >>> topo = coarse.EmulatedTopology.preset("v100", workers=4, clock="virtual")
      >>> plan = coarse.diagnostics.plan({"w": jnp.zeros((256, 1024))}, 4)   # 1 MiB per worker
      >>> one = coarse.perf_model.predict_hosts_sync_s(plan, topo, hosts=1)
      >>> two = coarse.perf_model.predict_hosts_sync_s(plan, topo, hosts=2)
      >>> one == coarse.perf_model.predict_plan_sync_s(plan, topo), two > one
      (True, True)
    """
    intra = predict_plan_sync_s(plan, topology)
    nbytes = inter_host_bytes(plan, hosts)
    if nbytes == 0:
        return intra
    return intra + topology.inter_host_s(nbytes)
