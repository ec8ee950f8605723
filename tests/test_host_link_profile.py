"""`coarse.diagnostics.profile` on a host-proxy mesh: the probe runs on the workers, each of
the first q also standing for a host proxy (ffi/runtime/probe.h).

Oracle: the emulated link's own figures (``Topology.transfer_s``, written out by hand in
tests/test_host_link_model.py); on the virtual clock the probe is exact, on the real clock
it sleeps at least that long.
"""

import numpy as np
import pytest

import coarse_jax as coarse
from coarse_jax.cli import schemes
from coarse_jax.cli.resnet50 import resnet50_tree
from coarse_jax.perf_model import predict_plan_sync_s

SIZES = (1 << 10, 1 << 16, 1 << 22)


@pytest.fixture(scope="module")
def host_mesh():
    return coarse.make_mesh(workers=4, proxies=2, proxies_on="host")


def _topo(**kw) -> coarse.Topology:
    return coarse.Topology.preset("pcie4", 4, proxies=2, proxies_on="host", **kw)


def test_virtual_profile_of_host_proxies_is_the_host_link(host_mesh):
    topo = _topo(time_scale=10.0, clock="virtual")
    prof = coarse.diagnostics.profile(host_mesh, topology=topo, sizes=SIZES, reps=2)
    assert (prof.workers, prof.proxies, prof.topology) == (4, 2, "pcie4+host")
    for j, n in enumerate(SIZES):
        # Every worker to either host proxy: 25 GB/s shared by two, 2 us, x10.
        want = 10 * (2e-6 + n / 12.5e9)
        np.testing.assert_allclose(prof.wp_oneway_s[:, :, j], want, rtol=1e-5)
        # Both ways at once: the worker's out and in ports, no proxy port: no slower.
        np.testing.assert_allclose(prof.wp_bidir_s[:, :, j], want, rtol=1e-5)
        # The two host proxies' ring (sources: the threads standing for them): 20 GB/s, 1 us.
        np.testing.assert_allclose(prof.pp_oneway_s[:, :, j], 10 * (1e-6 + n / 20e9), rtol=1e-5)
        np.testing.assert_allclose(prof.pp_bidir_s[:, :, j], 10 * (1e-6 + n / 20e9), rtol=1e-5)
        np.testing.assert_allclose(prof.ww_oneway_s[:, :, j], 10 * (8e-6 + n / 25e9), rtol=1e-5)


def test_routes_from_a_host_profile_run_in_the_models_time(host_mesh):
    topo = _topo(clock="virtual")
    prof = coarse.diagnostics.profile(host_mesh, topology=topo, sizes=SIZES, reps=2)
    cfg = coarse.Config.from_profile(prof, topology=topo, leading_bytes=0)
    tree = dict(list(resnet50_tree().items())[:20])
    measured = schemes.time_sync(host_mesh, tree, cfg, reps=1)
    assert measured == pytest.approx(
        predict_plan_sync_s(coarse.diagnostics.plan(tree, host_mesh, cfg), topo), rel=1e-4
    )


def test_real_clock_and_no_topology_profiles_of_host_proxies(host_mesh):
    topo = _topo(time_scale=50.0)
    prof = coarse.diagnostics.profile(
        host_mesh, topology=topo, sizes=(1 << 10, 1 << 20), reps=2, budget_s=0
    )
    want = np.array([topo.transfer_s("wp", 0, 0, n) for n in (1 << 10, 1 << 20)])
    # The probe sleeps until the booked arrival (float32 seconds: a relative 1e-6 below).
    assert (prof.wp_oneway_s >= want * (1 - 1e-6)).all()
    print(
        f"\nreal clock, pcie4 host x50: 1 MiB one way {prof.wp_oneway_s[:, :, 1].max() * 1e3:.3f} "
        f"ms measured (slowest pair), {want[1] * 1e3:.3f} ms emulated"
    )
    own = coarse.diagnostics.profile(host_mesh, sizes=(1 << 10, 1 << 20), reps=2, budget_s=0)
    assert own.topology is None and (own.wp_oneway_s > 0).all() and (own.pp_oneway_s > 0).all()


def test_profile_refuses_a_topology_for_the_other_placement(host_mesh):
    dev = coarse.Topology.preset("pcie4", 4, proxies=2, clock="virtual")
    with pytest.raises(ValueError, match=r"proxies on 'devices', the mesh's are on 'host'"):
        coarse.diagnostics.profile(host_mesh, topology=dev, sizes=SIZES)
