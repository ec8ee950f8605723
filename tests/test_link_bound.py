"""The links' lower bound (`coarse.model.link_bound`) and the step across hosts on emulated links.

Pure model arithmetic against hand-computed values (no devices run); the
runtime's own times on a virtual clock are checked in tests/test_profile.py,
wall-clock ones are measured in benchmarks/, never asserted.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coarse_jax as coarse
from coarse_jax.cli import schemes
from coarse_jax.perf_model import (
    inter_host_bytes,
    link_bound,
    predict_hosts_sync_s,
    predict_plan_sync_s,
)

N = 1 << 20  # f32 elements: 4 MiB, four equal 1 MiB shards
NBYTES = 4 * N


def _plan(scheme, workers=4, dtype=np.float32, **config):
    topo = coarse.Topology.preset("v100", workers, clock="virtual")
    base = coarse.Config(topology=topo, shard_bytes=1 << 20, **config)
    cfg = schemes.scheme_config(scheme, base, workers)
    tree = {"w": jax.ShapeDtypeStruct((N,), dtype)}
    return coarse.diagnostics.plan(tree, workers, cfg), topo


def test_allreduce_bound_is_the_two_rings_on_the_worker_links():
    plan, topo = _plan("allreduce")
    b = link_bound(plan, topo)
    # Two opposite rings: each directed neighbour link carries (p-1)/p of the
    # bytes at 9 GB/s; 2(p-1) lockstep steps of 8 us latency each.
    want = 0.75 * NBYTES / 9e9 + 6 * 8e-6
    assert b.seconds == pytest.approx(want, rel=1e-12)
    assert b.binding.startswith("worker ring link")
    # The runtime's ring is as pipelined as the links allow: schedule == bound.
    assert predict_plan_sync_s(plan, topo) == pytest.approx(want, rel=1e-12)


def test_allreduce_bound_two_workers_share_one_link_per_direction():
    plan, topo = _plan("allreduce", workers=2)
    assert link_bound(plan, topo).seconds == pytest.approx(NBYTES / 9e9 + 2 * 8e-6, rel=1e-12)


def test_dense_bound_is_proxy_zeros_port():
    plan, topo = _plan("dense")
    b = link_bound(plan, topo)
    # Proxy 0's in port takes p·n: worker 0 over its local 9 GB/s link, the
    # other three over 16 GB/s remote links; its out port serves the same.
    busy = NBYTES / 9e9 + 3 * NBYTES / 16e9
    assert b.binding in ("proxy 0 in port", "proxy 0 out port")
    assert b.busy_s["proxy 0 in port"] == pytest.approx(busy, rel=1e-12)
    assert b.busy_s["proxy 0 out port"] == pytest.approx(busy, rel=1e-12)
    assert b.seconds == pytest.approx(busy + 3e-6, rel=1e-12)  # the local link's latency
    assert b.seconds <= predict_plan_sync_s(plan, topo)


def test_coarse_bound_is_each_workers_remote_port():
    routes = ((0, 1), (1, 2), (2, 3), (3, 0))  # every piece to the next (remote) proxy
    plan, topo = _plan("coarse", routes=routes, latency_threshold_bytes=1)
    b = link_bound(plan, topo)
    # Every worker pushes n (and pulls n) over a 16 GB/s remote link; the
    # proxies' ring carries 3/4 n per link at 24 GB/s, less.
    assert b.seconds == pytest.approx(NBYTES / 16e9 + 8e-6, rel=1e-12)
    assert b.binding.endswith("port")
    assert b.busy_s["proxy ring link 0->1"] == pytest.approx(0.75 * NBYTES / 24e9, rel=1e-12)
    assert b.seconds <= predict_plan_sync_s(plan, topo)


def test_bound_scales_with_time_scale_and_checks_workers():
    plan, topo = _plan("allreduce")
    slow = dataclasses.replace(topo, time_scale=300.0)
    assert link_bound(plan, slow).seconds == pytest.approx(300 * link_bound(plan, topo).seconds)
    with pytest.raises(ValueError, match="topology describes 2 workers and 2 proxies, the plan 4"):
        link_bound(plan, coarse.Topology.preset("v100", 2))


def test_a_shared_proxy_port_carries_its_k_clients():
    """COARSE(2:1): each proxy's ports take the pushes and pulls of its 2 workers."""
    tree = {"w": jnp.zeros((256, 1024))}  # 1 MiB
    one, two = (coarse.diagnostics.plan(tree, 4, coarse.Config(), proxies=q) for q in (4, 2))
    t1, t2 = (coarse.Topology.preset("v100", 4, proxies=q) for q in (4, 2))
    b1, b2 = link_bound(one, t1), link_bound(two, t2)
    assert b2.busy_s["proxy 0 in port"] == pytest.approx(2 * b1.busy_s["proxy 0 in port"])
    assert "proxy 2 in port" not in b2.busy_s
    # The ring of 2 proxies moves (2-1)/2 of each piece per link (with 2 members both halves
    # share the one link), against (4-1)/4 over each of a ring of 4's links.
    assert b2.busy_s["proxy ring link 0->1"] == pytest.approx(
        b1.busy_s["proxy ring link 0->1"] * (2 * 1 / 2) / (3 / 4)
    )
    with pytest.raises(ValueError, match="2 proxies, the plan 4 and 4"):
        link_bound(one, t2)


def test_preset_inter_host_link_is_100_gbps():
    topo = coarse.Topology.preset("v100", 4, time_scale=300)
    assert (topo.inter_host_gbps, topo.inter_host_us) == (12.5, 5.0)
    assert topo.inter_host_s(12.5e9) == pytest.approx(300 * (1 + 5e-6))
    attrs = topo.inter_host_attrs()
    assert attrs["emu_host_s_per_byte"] == pytest.approx(300 / 12.5e9)
    assert attrs["emu_host_latency_s"] == pytest.approx(300 * 5e-6)
    with pytest.raises(ValueError, match=r"inter_host_gbps.*100 Gb/s is 12.5 GB/s"):
        dataclasses.replace(topo, inter_host_gbps=0.0)
    with pytest.raises(ValueError, match="inter_host_us"):
        dataclasses.replace(topo, inter_host_us=-1.0)


@pytest.mark.parametrize("scheme", ["coarse", "allreduce"])
def test_hosts_model_adds_the_nic_time(scheme):
    plan, topo = _plan(scheme, dtype=jax.numpy.bfloat16)
    intra = predict_plan_sync_s(plan, topo)
    # The inter-host step moves f32 chunks: 4 bytes per element whatever the dtype.
    assert inter_host_bytes(plan, 2) == 4 * N
    assert inter_host_bytes(plan, 3) == 2 * 4 * N  # (hosts - 1) copies each way
    assert predict_hosts_sync_s(plan, topo, 1) == intra
    want = intra + 5e-6 + 4 * N / 12.5e9
    assert predict_hosts_sync_s(plan, topo, 2) == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError, match="hosts must be an int >= 1"):
        inter_host_bytes(plan, 0)
