"""Host proxies on an emulated host link: the presets and the model, against hand-computed values.

Pure arithmetic (no devices run): every expected time below is written out
from the figures (`coarse_jax.emulation.pcie_link`), not computed by the
model's code. The runtime's own times on the virtual clock are compared with
the model in tests/test_host_link_emulated.py.
"""

import dataclasses
import math

import jax
import numpy as np
import pytest

import coarse_jax as coarse
from coarse_jax.cli import schemes
from coarse_jax.perf_model import link_bound, predict_plan_sync_s

MIB = 1 << 20


def _plan(scheme, topo, nbytes=4 * MIB, **config):
    base = coarse.Config(topology=topo, shard_bytes=MIB, **config)
    cfg = schemes.scheme_config(scheme, base, topo.workers)
    tree = {"w": jax.ShapeDtypeStruct((nbytes // 4,), np.float32)}
    return coarse.diagnostics.plan(tree, topo.workers, cfg, proxies=topo.proxies)


def test_presets_state_the_pcie_figures():
    for name, gbps in (("pcie3", 12.5), ("pcie4", 25.0), ("pcie5", 50.0)):
        topo = coarse.Topology.preset(name, 4, proxies=2, proxies_on="host")
        assert topo.name == name + "+host" and topo.proxies_on == "host"
        assert np.all(np.asarray(topo.worker_proxy_gbps) == gbps)
        assert np.all(np.asarray(topo.worker_proxy_us) == 2.0)
        assert (topo.root_complex_gbps, topo.root_complex_workers) == (gbps, 2)
        # Two workers on one x16 uplink: each gets half when both move data.
        assert np.all(np.asarray(topo.effective_worker_proxy_gbps()) == gbps / 2)
        assert topo.proxy_proxy_gbps[0][1] == 20.0 and topo.proxy_proxy_us[0][1] == 1.0
    # The paper's boards are PCIe Gen3 to the host; their worker links stay theirs.
    v100 = coarse.Topology.preset("v100", 4, proxies_on="host")
    assert v100.name == "v100+host" and v100.worker_proxy_gbps[0][0] == 12.5
    assert v100.worker_worker_gbps[0][1] == 9.0
    # Device proxies on a PCIe-generation board: the gen's link, no root complex.
    dev = coarse.Topology.preset("pcie4", 4)
    assert dev.proxies_on == "devices" and dev.worker_proxy_gbps[1][0] == 25.0
    assert dev.effective_worker_proxy_gbps() == dev.worker_proxy_gbps
    assert "emu_host_proxies" not in dev.ffi_attrs()


def test_root_complex_share_per_group_and_in_the_ffi_attributes():
    topo = coarse.Topology.preset("pcie4", 5, proxies=1, proxies_on="host", time_scale=3.0)
    # Groups {0, 1}, {2, 3}, {4}: worker 4 has its root complex to itself.
    assert topo.effective_worker_proxy_gbps() == ((12.5,), (12.5,), (12.5,), (12.5,), (25.0,))
    attrs = topo.ffi_attrs()
    np.testing.assert_allclose(attrs["emu_wp_s_per_byte"], [3 / 12.5e9] * 4 + [3 / 25e9])
    np.testing.assert_allclose(attrs["emu_wp_latency_s"], [3 * 2e-6] * 5)
    assert int(attrs["emu_host_proxies"]) == 1
    assert topo.transfer_s("wp", 4, 0, 25e9) == pytest.approx(3 * (1 + 2e-6))
    wide = dataclasses.replace(topo, root_complex_gbps=100.0, root_complex_workers=0)
    assert wide.effective_worker_proxy_gbps()[0] == (20.0,)  # all 5 share 100 GB/s
    no_cap = dataclasses.replace(topo, root_complex_gbps=math.inf)
    assert no_cap.effective_worker_proxy_gbps()[0] == (25.0,)


def test_bad_arguments_name_the_argument_and_the_fix():
    with pytest.raises(ValueError, match=r"proxies_on must be one of \('devices', 'host'\)"):
        coarse.Topology.preset("pcie4", 4, proxies_on="cpu")
    with pytest.raises(ValueError, match=r"name must be one of.*'pcie5'"):
        coarse.Topology.preset("pcie6", 4, proxies_on="host")
    host = coarse.Topology.preset("pcie4", 4, proxies_on="host")
    with pytest.raises(ValueError, match=r"Topology.root_complex_gbps: expected > 0"):
        dataclasses.replace(host, root_complex_gbps=0.0)
    with pytest.raises(ValueError, match=r"Topology.root_complex_workers: expected an int >= 0"):
        dataclasses.replace(host, root_complex_workers=-1)
    with pytest.raises(ValueError, match=r"Topology.proxies_on: expected one of"):
        dataclasses.replace(host, proxies_on="hosts")
    with pytest.raises(ValueError, match=r"with proxies_on='devices'. Fix: pass proxies_on='host'"):
        dataclasses.replace(host, proxies_on="devices")


def test_dense_on_host_proxies_does_not_queue_on_the_proxy():
    """DENSE, 4 workers, one host proxy: every worker's 4 pieces of 1 MiB go up and down its
    own host link (Gen4, 12.5 GB/s each with two on a root complex), in a pipeline."""
    topo = coarse.Topology.preset("pcie4", 4, proxies=1, proxies_on="host")
    plan = _plan("dense", topo)
    b, lat = MIB / 12.5e9, 2e-6
    # Push s ends at (s+1) b (+lat to arrive); pull s starts when it arrives and the
    # previous pull is done: pulls run one piece behind, the last ends at 5 b + 2 lat.
    assert predict_plan_sync_s(plan, topo) == pytest.approx(5 * b + 2 * lat, rel=1e-12)
    bound = link_bound(plan, topo)
    assert not any(r.startswith("proxy") for r in bound.busy_s)
    assert bound.binding == "worker 0 out port"
    assert bound.seconds == pytest.approx(4 * b + lat, rel=1e-12)
    # The same scheme on device proxies (the board's links without the share, 25 GB/s):
    # proxy 0's in port takes all 16 pushes one after another.
    dev = coarse.Topology.preset("pcie4", 4, proxies=1)
    assert link_bound(_plan("dense", dev), dev).busy_s["proxy 0 in port"] == pytest.approx(
        16 * MIB / 25e9, rel=1e-12
    )


def test_two_to_one_host_proxies_one_piece_with_the_proxy_ring():
    """COARSE(2:1) on Gen3 host links, one 1 MiB piece at each worker's local proxy."""
    topo = coarse.Topology.preset("pcie3", 4, proxies=2, proxies_on="host", time_scale=10.0)
    plan = _plan("coarse", topo, nbytes=MIB, leading_bytes=0, latency_threshold_bytes=1 << 30)
    assert [pc.dest for pc in plan.pieces] == [(0, 0, 1, 1)]
    wp = MIB / 6.25e9 + 2e-6  # Gen3 12.5 GB/s shared by two
    # Two host proxies' rings: 2(q-1) = 2 steps, both halves (b / 2q each) on the one link.
    ring = 2 * (1e-6 + 2 * MIB / 4 / 20e9)
    assert predict_plan_sync_s(plan, topo) == pytest.approx(10 * (2 * wp + ring), rel=1e-12)
    # On device proxies (the same Gen3 links, no share) the two clients of a proxy take
    # turns on its port: the second push starts when the first one's bytes are through.
    dev = coarse.Topology.preset("pcie3", 4, proxies=2, time_scale=10.0)
    dev_plan = _plan("coarse", dev, nbytes=MIB, leading_bytes=0, latency_threshold_bytes=1 << 30)
    b = MIB / 12.5e9
    ring_dev = 2 * (2e-6 + 2 * MIB / 4 / 24e9)
    # Pushes arrive at 2b + lat; the ring; pulls again one after the other: 2b + lat.
    want_dev = 10 * (2 * (2 * b + 2e-6) + ring_dev)
    assert predict_plan_sync_s(dev_plan, dev) == pytest.approx(want_dev, rel=1e-12)


def test_allreduce_is_the_same_on_either_placement():
    """The worker ring does not touch the proxies: the placement changes nothing for it."""
    host = coarse.Topology.preset("v100", 4, proxies_on="host")
    dev = coarse.Topology.preset("v100", 4)
    want = 0.75 * 4 * MIB / 9e9 + 6 * 8e-6  # two rings, (p-1)/p per link, 2(p-1) latencies
    for topo in (host, dev):
        assert predict_plan_sync_s(_plan("allreduce", topo), topo) == pytest.approx(want)


def test_plan_refuses_a_topology_for_the_other_placement():
    host_mesh = coarse.make_mesh(workers=4, proxies=2, proxies_on="host")
    tree = {"w": np.zeros(1000, np.float32)}
    dev = coarse.Config(topology=coarse.Topology.preset("pcie4", 4, proxies=2))
    with pytest.raises(ValueError, match=r"proxies on 'devices', the mesh's are on 'host'"):
        coarse.diagnostics.plan(tree, host_mesh, dev)
    host = coarse.Config(topology=coarse.Topology.preset("pcie4", 4, proxies=2, proxies_on="host"))
    assert coarse.diagnostics.plan(tree, host_mesh, host).proxies == 2
    with pytest.raises(ValueError, match=r"proxies_on='devices'\)"):
        coarse.diagnostics.plan(tree, coarse.make_mesh(workers=4, proxies=2), host)


@pytest.mark.parametrize("proxies", [1, 2, 4])
@pytest.mark.parametrize("scheme", schemes.SCHEMES)
def test_bound_is_under_the_schedule_on_host_proxies(scheme, proxies):
    topo = coarse.Topology.preset("pcie5", 4, proxies=proxies, proxies_on="host")
    plan = _plan(scheme, topo, nbytes=3 * MIB + 4096, latency_threshold_bytes=1 << 16)
    bound, schedule = link_bound(plan, topo), predict_plan_sync_s(plan, topo)
    assert 0 < bound.seconds <= schedule * (1 + 1e-12)
    if scheme != "allreduce":
        # Each worker's host link carries its bytes up and down at 25 GB/s (50 shared by two).
        assert bound.busy_s["worker 0 out port"] == pytest.approx((3 * MIB + 4096) / 25e9)
