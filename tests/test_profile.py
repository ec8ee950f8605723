"""The profiler, the planner from a profile, and the emulated interconnect.

Emulated links are slowed by ``time_scale`` so that they, not this host's own
copies and thread wake-ups, set the times being checked.
"""

import dataclasses
import math

import jax
import numpy as np
import pytest

import coarse_jax as coarse
from coarse_jax import schemes
from coarse_jax.model import predict_plan_sync_s
from coarse_jax.profile_data import threshold_bytes
from coarse_jax.shapes import resnet50_tree

SIZES = (1 << 10, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22)


@pytest.fixture(scope="module")
def mesh():
    return coarse.make_mesh(workers=4)


@pytest.fixture(scope="module")
def v100_profile(mesh):
    topo = coarse.Topology.preset("v100", 4, time_scale=50)
    return coarse.profile(mesh, topology=topo, sizes=SIZES, reps=3)


def test_v100_routes_small_local_large_remote(v100_profile):
    cfg = coarse.Config.from_profile(v100_profile)
    for i, (lat, bw) in enumerate(cfg.routes):
        assert lat == i, "lowest latency: the local proxy"
        assert bw != i, "V100 anti-locality: more bandwidth to a remote proxy"
    assert len({bw for _, bw in cfg.routes}) == 4, "one client per bandwidth proxy"
    # The analytic crossing of 3us + S/9GB/s and 8us + S/16GB/s is 102,857 B.
    for i in range(4):
        assert 1 << 14 < threshold_bytes(v100_profile, i) < 1 << 18
    assert cfg.shard_bytes >= 1 << 20  # 95% of peak needs megabytes at 8 us latency


@pytest.mark.parametrize("preset", ["p100", "t4"])
def test_p100_and_t4_route_local(mesh, preset):
    topo = coarse.Topology.preset(preset, 4, time_scale=100)
    prof = coarse.profile(mesh, topology=topo, sizes=(1 << 10, 1 << 16, 1 << 22), reps=3)
    cfg = coarse.Config.from_profile(prof)
    assert cfg.routes == tuple((i, i) for i in range(4))


def test_profile_round_trip_and_plot(v100_profile, tmp_path):
    v100_profile.save(tmp_path / "p.json")
    assert coarse.Profile.load(tmp_path / "p.json") == v100_profile
    v100_profile.plot(tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 10_000
    assert "worker 3" in v100_profile.table()


def test_profile_of_the_real_host(mesh):
    prof = coarse.profile(mesh, sizes=(1 << 10, 1 << 20), reps=2)
    assert prof.topology is None
    assert (prof.wp_oneway_s > 0).all() and (prof.wp_bandwidth_gbps() > 0).all()


def test_emulated_link_time_is_enforced(mesh):
    """One 4 MiB push at 9 GB/s x200 takes ~93 ms: the probe sees it."""
    topo = coarse.Topology.preset("v100", 4, time_scale=200)
    prof = coarse.profile(mesh, topology=topo, sizes=(4 << 20,), reps=2)
    want = topo.transfer_s("wp", 0, 0, 4 << 20)
    assert want == pytest.approx(0.0932, rel=0.01)
    assert prof.wp_oneway_s[0, 0, 0] == pytest.approx(want, rel=0.15)


def test_v100_coarse_beats_allreduce_and_matches_the_model(mesh, v100_profile):
    """Paper Fig. 15 in miniature: ResNet-50 gradients, 4 workers, V100 links."""
    # x600: a 97.5 MiB tree takes seconds, and this host's own per-piece costs
    # (copies, thread wake-ups; about 2 ms each under load) stay a few percent.
    topo = coarse.Topology.preset("v100", 4, time_scale=600)
    cfg = coarse.Config.from_profile(v100_profile, topology=topo)
    tree = resnet50_tree()
    measured, predicted = {}, {}
    for scheme in ("allreduce", "coarse"):
        scfg = schemes.scheme_config(scheme, cfg, 4)
        measured[scheme] = schemes.time_sync(mesh, tree, scfg, reps=2)
        predicted[scheme] = predict_plan_sync_s(coarse.plan(tree, mesh, scfg), topo)
    assert measured["coarse"] < measured["allreduce"]
    assert measured["coarse"] == pytest.approx(predicted["coarse"], rel=0.15)
    assert measured["allreduce"] == pytest.approx(predicted["allreduce"], rel=0.15)


def test_dense_is_one_proxy_without_a_ring(mesh):
    """DENSE: every worker routed to proxy 0; results still exact and on every device."""
    cfg = schemes.scheme_config("dense", coarse.Config(shard_bytes=4096), 4)
    plan = coarse.plan({"w": jax.ShapeDtypeStruct((5000,), np.float32)}, mesh, cfg)
    assert {pc.dest for pc in plan.pieces} == {(0, 0, 0, 0)}

    @coarse.sync(mesh, config=cfg)
    def step(x):
        return coarse.all_reduce(x[0])

    x = np.random.default_rng(0).standard_normal((4, 5000)).astype(np.float32)
    out = step(x)
    np.testing.assert_allclose(out, x.mean(0), rtol=1e-6, atol=1e-7)
    shards = [np.asarray(s.data) for s in out.addressable_shards]
    assert all(s.tobytes() == shards[0].tobytes() for s in shards)


def test_topology_checks():
    with pytest.raises(ValueError, match="one of"):
        coarse.Topology.preset("a100", 4)
    topo = coarse.Topology.preset("v100", 2)
    with pytest.raises(ValueError, match="describes 2 workers"):
        coarse.plan({"w": jax.ShapeDtypeStruct((4,), np.float32)}, 4, coarse.Config(topology=topo))
    with pytest.raises(ValueError, match="time_scale"):
        dataclasses.replace(topo, time_scale=0.0)
    assert math.isclose(topo.transfer_s("pp", 0, 1, 24e9), 1.0 + 2e-6)


def _paper_t_train(m, n, p, bw_proxy, bw_gpu, t_fp, t_bp):
    """The paper's T_train written out again (oracle; shares no code with coarse.model)."""
    c = 2 * (p - 1) / p
    return max(t_fp + t_bp + c * (n - m) / (bw_gpu * 1e9), t_fp + c * m / (bw_proxy * 1e9))


@pytest.mark.parametrize("t_bp", [0.0, 0.02, 10.0])
def test_auto_leading_bytes_minimizes_the_papers_t_train(v100_profile, t_bp):
    leaves = {f"l{i:02d}": jax.ShapeDtypeStruct((256, 256), np.float32) for i in range(12)}
    cfg = coarse.Config.from_profile(v100_profile, leading_bytes="auto", step_times_s=(0.01, t_bp))
    plan = coarse.plan(leaves, 4, cfg)
    leading = sum(leaf.nbytes for leaf in plan.leaves if leaf.sync == "worker")
    n = sum(leaf.nbytes for leaf in plan.leaves)
    scale = v100_profile.time_scale
    bw_p = v100_profile.pp_bandwidth_gbps().mean() * scale
    bw_g = v100_profile.ww_bandwidth_gbps().mean() * scale
    costs = {k * 256 * 256 * 4: _paper_t_train(n - k * 256 * 256 * 4, n, 4, bw_p, bw_g, 0.01, t_bp)
             for k in range(13)}
    assert costs[leading] == pytest.approx(min(costs.values()), rel=1e-9)
    if t_bp == 10.0:
        assert leading == 0  # a long backward pass hides all proxy traffic


def test_auto_needs_profile_and_step_times():
    with pytest.raises(ValueError, match='leading_bytes="auto" needs profile='):
        coarse.Config(leading_bytes="auto")


def test_measure_step_times():
    import jax.numpy as jnp

    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    t_fp, t_bp = coarse.measure_step_times(loss, jnp.ones((64, 64)), jnp.ones((32, 64)), reps=3)
    assert t_fp > 0 and t_bp >= 0


@pytest.fixture(scope="module")
def small_v100_profile(mesh):
    topo = coarse.Topology.preset("v100", 4, time_scale=50)
    return coarse.profile(mesh, topology=topo, sizes=(1 << 10, 1 << 16, 1 << 22), reps=3)


def _reduce_step(mesh, cfg):
    @coarse.sync(mesh, config=cfg)
    def step(x):
        return coarse.all_reduce(x[0])

    return step


def test_reprofiling_keeps_the_program_when_the_plan_holds(mesh, small_v100_profile):
    topo = coarse.Topology.preset("v100", 4, time_scale=50)
    cfg = coarse.Config.from_profile(small_v100_profile, topology=topo, reprofile_every=2)
    step = _reduce_step(mesh, cfg)
    x = np.ones((4, 300_000), np.float32)
    for _ in range(4):
        np.testing.assert_allclose(step(x), 1.0)
    assert step.stats() == {"calls": 4, "reprofiles": 2, "compiled": 1}


def test_reprofiling_replans_when_the_links_change(mesh, small_v100_profile):
    # Planned on V100 links (remote bandwidth proxies), running on P100 links.
    topo = coarse.Topology.preset("p100", 4, time_scale=50)
    cfg = coarse.Config.from_profile(small_v100_profile, topology=topo, reprofile_every=2)
    assert any(lat != bw for lat, bw in cfg.routes)
    step = _reduce_step(mesh, cfg)
    x = np.ones((4, 300_000), np.float32)
    for _ in range(3):
        np.testing.assert_allclose(step(x), 1.0)
    assert step.config().routes == tuple((i, i) for i in range(4))  # P100: local wins
    assert step.stats() == {"calls": 3, "reprofiles": 1, "compiled": 2}


def test_cli_prints_matrices_routes_and_split(tmp_path):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "coarse_jax.profile", "--emulate", "v100", "--workers", "2",
         "--max-size", str(1 << 20), "--reps", "2", "--no-sync", "--save", str(tmp_path / "p.json")],
        cwd=tmp_path,  # the installed package, not the source tree
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "worker -> proxy" in out and "routing table" in out and "leading_bytes =" in out
    assert "RuntimeWarning" not in result.stderr
    assert coarse.Profile.load(tmp_path / "p.json").workers == 2
