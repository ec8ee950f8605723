"""The profiler, the planner from a profile, and the emulated interconnect.

Emulated links run on a virtual clock (``Topology(clock="virtual")``) where
a test is about something else than measuring: the protocol runs for real,
time is simulated, so every timing checked here is exact and repeatable
whatever else the host is doing. The profiler's own decisions are tested on
the real clock too, on a machine kept busy on purpose. Wall-clock timings of
the real-time emulation live in benchmarks/, which record and do not fail.
"""

import contextlib
import dataclasses
import math
import os
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import coarse_jax as coarse
from coarse_jax.cli import schemes
from coarse_jax.cli.resnet50 import resnet50_tree
from coarse_jax.perf_model import predict_plan_sync_s
from coarse_jax.profiling.routing import threshold_bytes

SIZES = (1 << 10, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22)


def _virtual(preset: str, workers: int = 4) -> coarse.Topology:
    """A paper preset on a virtual clock: timings are simulated, exact and repeatable."""
    return coarse.Topology.preset(preset, workers, clock="virtual")


# Function-scoped meshes: the 1:1 and 2:1 meshes of workers 0..3 are one jax
# object whose proxies are those of its latest make_mesh (coarse_jax.mesh).
@pytest.fixture
def mesh():
    return coarse.make_mesh(workers=4)


@pytest.fixture(scope="module")
def v100_profile():
    mesh = coarse.make_mesh(workers=4)
    return coarse.diagnostics.profile(mesh, topology=_virtual("v100"), sizes=SIZES, reps=3)


def test_virtual_profile_measures_exactly_the_emulated_links(v100_profile):
    """Every probe takes latency + bytes / bandwidth of its link: the Topology's own numbers.

    To the nanosecond (the clock's tick; each of latency and transfer time is rounded to one).
    """
    topo = _virtual("v100")
    exact = {"rel": 1e-6, "abs": 1.01e-9}
    p, sizes = 4, v100_profile.sizes
    for j, n in enumerate(sizes):
        for i in range(p):
            for k in range(p):
                want = topo.transfer_s("wp", i, k, n)
                assert v100_profile.wp_oneway_s[i, k, j] == pytest.approx(want, **exact)
                # Push and pull use opposite directions and ports: no slower together.
                assert v100_profile.wp_bidir_s[i, k, j] == pytest.approx(want, **exact)
            for r, nb in enumerate(((i + 1) % p, (i - 1) % p)):
                assert v100_profile.pp_oneway_s[i, r, j] == pytest.approx(
                    topo.transfer_s("pp", i, nb, n), **exact
                )
                assert v100_profile.ww_oneway_s[i, r, j] == pytest.approx(
                    topo.transfer_s("ww", i, nb, n), **exact
                )


def test_virtual_profile_is_repeatable(mesh, v100_profile):
    again = coarse.diagnostics.profile(mesh, topology=_virtual("v100"), sizes=SIZES, reps=3)
    assert again == v100_profile


def test_v100_routes_small_local_large_remote(v100_profile):
    # A virtual clock is exact: its one pass makes every decision clear.
    assert {d.basis for d in v100_profile.decisions} == {"measured"}
    cfg = coarse.Config.from_profile(v100_profile)
    for i, (lat, bw) in enumerate(cfg.routes):
        assert lat == i, "lowest latency: the local proxy"
        assert bw != i, "V100 anti-locality: more bandwidth to a remote proxy"
    assert len({bw for _, bw in cfg.routes}) == 4, "one client per bandwidth proxy"
    # 3 us + S / 9 GB/s = 8 us + S / 16 GB/s at S = 5e-6 * 144e9 / 7 bytes; both
    # times are linear in S, so interpolating between measured sizes is exact.
    crossing = 5e-6 * 144e9 / 7
    for i in range(4):
        assert threshold_bytes(v100_profile, i) == pytest.approx(crossing, rel=1e-4)
    # S': the smallest measured size reaching 95% of the remote link's peak
    # bandwidth, from the link formula.
    bw = [n / (8e-6 + n / 16e9) for n in SIZES]
    want = next(n for n, b in zip(SIZES, bw, strict=True) if b >= 0.95 * max(bw))
    assert cfg.shard_bytes == want == 1 << 22


@pytest.mark.parametrize("preset", ["p100", "t4"])
def test_p100_and_t4_route_local(mesh, preset):
    prof = coarse.diagnostics.profile(
        mesh, topology=_virtual(preset), sizes=(1 << 10, 1 << 16, 1 << 22), reps=2
    )
    cfg = coarse.Config.from_profile(prof)
    assert cfg.routes == tuple((i, i) for i in range(4))


def test_profile_round_trip_and_plot(v100_profile, tmp_path):
    v100_profile.save(tmp_path / "p.json")
    assert coarse.diagnostics.Profile.load(tmp_path / "p.json") == v100_profile
    v100_profile.plot(tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 10_000
    assert "worker 3" in v100_profile.table()


def test_profile_of_the_real_host(mesh):
    prof = coarse.diagnostics.profile(mesh, sizes=(1 << 10, 1 << 20), reps=2, budget_s=2)
    assert prof.topology is None
    assert (prof.wp_oneway_s > 0).all() and (prof.link("wp", "bandwidth_gbps") > 0).all()
    # The host's own links have no model: what stays unclear goes to the local proxy.
    assert {d.basis for d in prof.decisions} <= {"measured", "local", "unclear"}
    for i, (lat, bw) in enumerate(coarse.Config.from_profile(prof).routes):
        for kind, choice in (("latency", lat), ("bandwidth", bw)):
            assert prof.decision(i, kind).basis == "measured" or choice == i


PAPER_V100_ROUTES = ((0, 1), (1, 2), (2, 3), (3, 0))  # local for latency, the next for bandwidth
V100_CROSSING = 5e-6 * 144e9 / 7  # 3 us + S / 9 GB/s = 8 us + S / 16 GB/s


@pytest.mark.parametrize(
    ("preset", "routes"), [("v100", PAPER_V100_ROUTES), ("p100", tuple((i, i) for i in range(4)))]
)
def test_unclear_decisions_keep_the_models_choice_and_say_so(mesh, preset, routes):
    """budget_s=0: one pass on the real clock, too few rounds for any confidence interval, so
    every decision is the model's choice for the topology, and the report says so."""
    topo = coarse.Topology.preset(preset, 4)
    prof = coarse.diagnostics.profile(
        mesh, topology=topo, sizes=(1 << 10, 1 << 16, 1 << 18), reps=2, budget_s=0
    )
    assert {d.basis for d in prof.decisions} == {"model"}
    cfg = coarse.Config.from_profile(prof)
    assert cfg.routes == routes
    if preset == "v100":
        assert cfg.latency_threshold_bytes == round(V100_CROSSING)  # the model's crossing
    text = prof.table()
    assert "12 decision(s) not clear from the measurements" in text
    assert f"the {preset} model's choice (budget_s=0 spent after 0 more rounds)" in text


def test_budget_must_be_seconds(mesh):
    for bad in (-1, "10", True, float("nan")):
        with pytest.raises(ValueError, match=r"budget_s must be seconds >= 0.*got"):
            coarse.diagnostics.profile(
                mesh, topology=_virtual("v100"), sizes=(1 << 10,), budget_s=bad
            )


@contextlib.contextmanager
def _every_core_busy():
    """A busy loop on every core (``os.cpu_count()`` processes), killed on the way out."""
    procs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 1)
    ]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=30)


@pytest.mark.timeout(600)
def test_v100_preset_gives_the_papers_routes_on_a_busy_machine(mesh):
    """The real clock (the default), the default sizes, every core busy with another process:
    the routes are the paper's (anti-locality: large tensors to a remote proxy), run after run.
    Two runs here; by hand, 10 of 10 (the profiler guide)."""
    topo = coarse.Topology.preset("v100", 4)
    with _every_core_busy():
        for _ in range(2):
            start = time.monotonic()
            prof = coarse.diagnostics.profile(mesh, topology=topo)
            took = time.monotonic() - start
            cfg = coarse.Config.from_profile(prof)
            assert cfg.routes == PAPER_V100_ROUTES, prof.table()
            # The crossing lies between the two measured sizes around it, measured or modelled.
            assert 1 << 16 < cfg.latency_threshold_bytes < 1 << 18, prof.table()
            assert {d.basis for d in prof.decisions} <= {"measured", "model"}
            print(f"busy v100 profile: {took:.1f} s, routes {cfg.routes}")


@pytest.mark.timeout(300)
def test_virtual_clock_does_not_sleep(mesh):
    """At time_scale 1e5 a 4 MiB probe lasts 47 simulated seconds and a profile makes 50 of
    them: it finishes within the hang guard only if nothing sleeps."""
    topo = coarse.Topology.preset("v100", 4, time_scale=1e5, clock="virtual")
    prof = coarse.diagnostics.profile(mesh, topology=topo, sizes=(4 << 20,), reps=2)
    assert prof.wp_oneway_s[0, 0, 0] == pytest.approx(
        topo.transfer_s("wp", 0, 0, 4 << 20), rel=1e-6
    )
    assert prof.wp_oneway_s[0, 0, 0] > 40


@pytest.mark.parametrize("scheme", ["allreduce", "coarse", "dense"])
def test_v100_schemes_match_the_model(mesh, v100_profile, scheme):
    """Paper Fig. 15 in miniature: ResNet-50 gradients, 4 workers, V100 links, simulated time."""
    topo = _virtual("v100")
    cfg = schemes.scheme_config(scheme, coarse.Config.from_profile(v100_profile, topology=topo), 4)
    tree = resnet50_tree()
    measured = schemes.time_sync(mesh, tree, cfg, reps=2)
    predicted = predict_plan_sync_s(coarse.diagnostics.plan(tree, mesh, cfg), topo)
    # The model books the same links and ports in the same order: the runtime
    # matches it up to the clock's 1 ns ticks.
    assert measured == pytest.approx(predicted, rel=1e-4)


def test_v100_coarse_beats_allreduce_and_dense(mesh, v100_profile):
    topo = _virtual("v100")
    cfg = coarse.Config.from_profile(v100_profile, topology=topo)
    tree = resnet50_tree()
    measured = {
        s: schemes.time_sync(mesh, tree, schemes.scheme_config(s, cfg, 4), reps=1)
        for s in schemes.SCHEMES
    }
    assert measured["coarse"] < measured["allreduce"] < measured["dense"]


def test_virtual_and_real_clock_and_no_topology_give_the_same_bits(mesh):
    x = np.random.default_rng(1).standard_normal((4, 70_000)).astype(np.float32)
    outs = []
    for topo in (None, _virtual("v100"), coarse.Topology.preset("v100", 4)):
        cfg = coarse.Config(
            shard_bytes=1 << 16,
            latency_threshold_bytes=1 << 12,
            routes=((0, 1), (1, 2), (2, 3), (3, 0)),
            topology=topo,
        )
        outs.append(np.asarray(_reduce_step(mesh, cfg)(x)))
    assert outs[0].tobytes() == outs[1].tobytes() == outs[2].tobytes()
    np.testing.assert_allclose(outs[0], x.mean(0), rtol=1e-5, atol=1e-6)


def test_virtual_sync_seconds_reports_each_step(mesh):
    topo = _virtual("t4")
    step = _reduce_step(mesh, coarse.Config(topology=topo, shard_bytes=1 << 20))
    x = np.ones((4, 1000), np.float32)
    jax.block_until_ready(step(x))
    coarse.diagnostics.virtual_sync_seconds()
    for _ in range(3):
        jax.block_until_ready(step(x))
    spans = coarse.diagnostics.virtual_sync_seconds()
    assert len(spans) == 3 and len(set(spans)) == 1
    predicted = predict_plan_sync_s(coarse.diagnostics.plan({"x": x[0]}, mesh, step.config()), topo)
    assert spans[0] == pytest.approx(predicted, abs=1e-8)  # a few 1 ns ticks of rounding
    assert coarse.diagnostics.virtual_sync_seconds() == []


def test_dense_is_one_proxy_without_a_ring(mesh):
    """DENSE: every worker routed to proxy 0; results still exact and on every device."""
    cfg = schemes.scheme_config("dense", coarse.Config(shard_bytes=4096), 4)
    plan = coarse.diagnostics.plan({"w": jax.ShapeDtypeStruct((5000,), np.float32)}, mesh, cfg)
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
        coarse.diagnostics.plan(
            {"w": jax.ShapeDtypeStruct((4,), np.float32)}, 4, coarse.Config(topology=topo)
        )
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
    plan = coarse.diagnostics.plan(leaves, 4, cfg)
    leading = sum(leaf.nbytes for leaf in plan.leaves if leaf.sync == "worker")
    n = sum(leaf.nbytes for leaf in plan.leaves)
    scale = v100_profile.time_scale
    bw_p = v100_profile.link("pp", "bandwidth_gbps").mean() * scale
    bw_g = v100_profile.link("ww", "bandwidth_gbps").mean() * scale
    costs = {
        k * 256 * 256 * 4: _paper_t_train(n - k * 256 * 256 * 4, n, 4, bw_p, bw_g, 0.01, t_bp)
        for k in range(13)
    }
    assert costs[leading] == pytest.approx(min(costs.values()), rel=1e-9)
    if t_bp == 10.0:
        assert leading == 0  # a long backward pass hides all proxy traffic


def test_auto_needs_profile_and_step_times():
    with pytest.raises(ValueError, match='leading_bytes="auto" needs profile='):
        coarse.Config(leading_bytes="auto")


def test_measure_step_times(monkeypatch):
    """T_FP is the forward pass's median, T_BP what value_and_grad adds (never negative)."""
    import jax.numpy as jnp

    from coarse_jax.profiling import measure

    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    class FakeClock:  # forward reps take 1, 5, 1 s; forward+backward 3, 3, 4 s
        def __init__(self, durations):
            self.durations, self.now, self.started = list(durations), 0.0, False

        def perf_counter(self):
            if self.started:
                self.now += self.durations.pop(0)
            self.started = not self.started
            return self.now

    monkeypatch.setattr(measure, "time", FakeClock([1, 5, 1, 3, 3, 4]))
    args = (jnp.ones((64, 64)), jnp.ones((32, 64)))
    assert coarse.diagnostics.measure_step_times(loss, *args, reps=3) == (1.0, 2.0)
    # A backward pass measured faster than the forward one (noise) counts as free.
    monkeypatch.setattr(measure, "time", FakeClock([2, 2, 2, 1, 1, 1]))
    assert coarse.diagnostics.measure_step_times(loss, *args, reps=3) == (2.0, 0.0)


@pytest.fixture(scope="module")
def small_v100_profile():
    return coarse.diagnostics.profile(
        coarse.make_mesh(workers=4),
        topology=_virtual("v100"),
        sizes=(1 << 10, 1 << 16, 1 << 22),
        reps=2,
    )


def _reduce_step(mesh, cfg):
    @coarse.sync(mesh, config=cfg)
    def step(x):
        return coarse.all_reduce(x[0])

    return step


def test_reprofiling_keeps_the_program_when_the_plan_holds(mesh, small_v100_profile):
    cfg = coarse.Config.from_profile(
        small_v100_profile, topology=_virtual("v100"), reprofile_every=2
    )
    step = _reduce_step(mesh, cfg)
    x = np.ones((4, 300_000), np.float32)
    for _ in range(4):
        np.testing.assert_allclose(step(x), 1.0)
    assert (
        step.stats().items() >= {"calls": 4, "reprofiles": 2, "compiled": 1, "in_flight": 2}.items()
    )


def test_reprofiling_replans_when_the_links_change(mesh, small_v100_profile):
    # Planned on V100 links (remote bandwidth proxies), running on P100 links.
    cfg = coarse.Config.from_profile(
        small_v100_profile, topology=_virtual("p100"), reprofile_every=2
    )
    assert any(lat != bw for lat, bw in cfg.routes)
    step = _reduce_step(mesh, cfg)
    x = np.ones((4, 300_000), np.float32)
    for _ in range(3):
        np.testing.assert_allclose(step(x), 1.0)
    assert step.config().routes == tuple((i, i) for i in range(4))  # P100: local wins
    assert (
        step.stats().items() >= {"calls": 3, "reprofiles": 1, "compiled": 2, "in_flight": 2}.items()
    )


def test_cli_prints_matrices_routes_and_split(tmp_path):
    import subprocess
    import sys

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "coarse_jax.profile",
            "--emulate",
            "v100",
            "--workers",
            "2",
            "--max-size",
            str(1 << 20),
            "--reps",
            "2",
            "--clock",
            "virtual",
            "--save",
            str(tmp_path / "p.json"),
        ],
        cwd=tmp_path,  # the installed package, not the source tree
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "worker -> proxy" in out and "routing table" in out and "leading_bytes =" in out
    assert "allreduce" in out and "coarse" in out  # the schemes' simulated sync times
    assert "RuntimeWarning" not in result.stderr
    assert coarse.diagnostics.Profile.load(tmp_path / "p.json").workers == 2


@pytest.mark.parametrize("workers", [2, 3, 4])
@pytest.mark.parametrize("scheme", schemes.SCHEMES)
def test_runtime_schedule_equals_the_model_for_every_worker_count(workers, scheme):
    """At p = 2 both rings' halves share the one directed link per step (the model said
    they did not, 1.8x off for AllReduce): simulated time equals predict_plan_sync_s."""
    mesh = coarse.make_mesh(workers=workers)
    topo = _virtual("v100", workers)
    tree = {
        "a": jax.ShapeDtypeStruct((300_000,), np.float32),
        "b": jax.ShapeDtypeStruct((5_000,), np.float32),
    }
    cfg = schemes.scheme_config(scheme, coarse.Config(topology=topo, shard_bytes=1 << 18), workers)
    measured = schemes.time_sync(mesh, tree, cfg, reps=1)
    predicted = predict_plan_sync_s(coarse.diagnostics.plan(tree, mesh, cfg), topo)
    assert measured == pytest.approx(predicted, rel=1e-4)


# ---------------------------------------------------------------- COARSE k:1


def _virtual_k1(preset: str, workers: int = 4, proxies: int = 2) -> coarse.Topology:
    """A paper preset for ``proxies`` shared proxies, on a virtual clock."""
    return coarse.Topology.preset(preset, workers, proxies=proxies, clock="virtual")


@pytest.fixture
def shared_mesh():
    """COARSE(2:1): workers 0, 1 share proxy 0, workers 2, 3 proxy 1."""
    return coarse.make_mesh(workers=4, proxies=2)


@pytest.fixture(scope="module")
def v100_2to1_profile():
    shared_mesh = coarse.make_mesh(workers=4, proxies=2)
    return coarse.diagnostics.profile(
        shared_mesh, topology=_virtual_k1("v100"), sizes=SIZES, reps=3
    )


def test_k_to_1_profile_measures_exactly_the_emulated_links(v100_2to1_profile):
    """Every worker's link to each of the q distinct proxies, the proxies' ring of q and the
    workers' ring of p: latency + bytes / bandwidth of the Topology's own p x q links."""
    topo = _virtual_k1("v100")
    prof = v100_2to1_profile
    exact = {"rel": 1e-6, "abs": 1.01e-9}
    assert (prof.workers, prof.proxies) == (4, 2)
    assert prof.wp_oneway_s.shape == prof.wp_spread.shape == (4, 2, len(SIZES))
    assert prof.pp_oneway_s.shape == (2, 2, len(SIZES))
    assert prof.ww_oneway_s.shape == (4, 2, len(SIZES))
    for j, n in enumerate(prof.sizes):
        for i in range(4):
            for k in range(2):
                want = topo.transfer_s("wp", i, k, n)
                assert prof.wp_oneway_s[i, k, j] == pytest.approx(want, **exact)
                assert prof.wp_bidir_s[i, k, j] == pytest.approx(want, **exact)
            for r, nb in enumerate(((i + 1) % 4, (i - 1) % 4)):
                want = topo.transfer_s("ww", i, nb, n)
                assert prof.ww_oneway_s[i, r, j] == pytest.approx(want, **exact)
        for k in range(2):
            for r in range(2):
                want = topo.transfer_s("pp", k, 1 - k, n)
                assert prof.pp_oneway_s[k, r, j] == pytest.approx(want, **exact)
                assert prof.pp_bidir_s[k, r, j] == pytest.approx(want, **exact)
    # Local (worker i, proxy i // 2) is the V100's slow, low-latency link.
    assert prof.wp_oneway_s[1, 0, 0] < prof.wp_oneway_s[1, 1, 0]
    assert prof.wp_oneway_s[1, 0, -1] > prof.wp_oneway_s[1, 1, -1]


def test_k_to_1_v100_routes_small_local_large_remote(v100_2to1_profile):
    cfg = coarse.Config.from_profile(v100_2to1_profile)
    # Latency: the local proxy i // 2; bandwidth: the other (remote) proxy.
    assert cfg.routes == ((0, 1), (0, 1), (1, 0), (1, 0))
    assert cfg.routes_for(4, 2) == cfg.routes
    crossing = 5e-6 * 144e9 / 7  # as at 1:1: the same two links cross
    for i in range(4):
        assert threshold_bytes(v100_2to1_profile, i) == pytest.approx(crossing, rel=1e-4)
    assert cfg.shard_bytes == 1 << 22


@pytest.mark.parametrize("preset", ["p100", "t4"])
def test_k_to_1_p100_and_t4_route_local(shared_mesh, preset):
    prof = coarse.diagnostics.profile(
        shared_mesh, topology=_virtual_k1(preset), sizes=(1 << 10, 1 << 16, 1 << 22), reps=2
    )
    assert coarse.Config.from_profile(prof).routes == ((0, 0), (0, 0), (1, 1), (1, 1))


def test_one_proxy_profile_has_no_proxy_ring():
    """4:1: every worker's link to the one proxy; a ring of one proxy moves nothing."""
    mesh = coarse.make_mesh(workers=4, proxies=1)
    topo = _virtual_k1("v100", proxies=1)
    prof = coarse.diagnostics.profile(mesh, topology=topo, sizes=(1 << 10, 1 << 20), reps=2)
    assert prof.wp_oneway_s.shape == (4, 1, 2) and prof.pp_oneway_s.shape == (1, 2, 2)
    for j, n in enumerate(prof.sizes):
        for i in range(4):
            assert prof.wp_oneway_s[i, 0, j] == pytest.approx(
                topo.transfer_s("wp", i, 0, n), rel=1e-6, abs=1.01e-9
            )
    assert (prof.pp_oneway_s == 1e-9).all() and (prof.pp_bidir_s == 1e-9).all()
    assert coarse.Config.from_profile(prof).routes == ((0, 0),) * 4


def test_profile_rejects_a_topology_of_another_shape():
    # Each mesh made where it is used: both are the one jax mesh of workers 0..3.
    shared_mesh = coarse.make_mesh(workers=4, proxies=2)
    with pytest.raises(
        ValueError,
        match=r"topology describes 4 workers and 4 proxies, the mesh has 4 workers and 2 proxies"
        r".*proxies=2",
    ):
        coarse.diagnostics.profile(shared_mesh, topology=_virtual("v100"), sizes=(1 << 10,), reps=2)
    with pytest.raises(ValueError, match=r"describes 2 workers and 1 proxies.*has 4 workers"):
        coarse.diagnostics.profile(
            shared_mesh, topology=_virtual_k1("v100", 2, 1), sizes=(1 << 10,), reps=2
        )
    mesh = coarse.make_mesh(workers=4)
    with pytest.raises(ValueError, match=r"describes 4 workers and 2 proxies.*has 4 workers and 4"):
        coarse.diagnostics.profile(mesh, topology=_virtual_k1("v100"), sizes=(1 << 10,), reps=2)


def test_profile_needs_distinct_worker_and_proxy_devices():
    from coarse_jax.testing import shared_device_mesh

    with pytest.raises(ValueError, match=r"the mesh's workers and proxies must be distinct"):
        coarse.diagnostics.profile(shared_device_mesh(workers=2), sizes=(1 << 10,), reps=2)


def test_k_to_1_round_trip_table_and_real_host(shared_mesh, v100_2to1_profile, tmp_path):
    v100_2to1_profile.save(tmp_path / "p.json")
    assert coarse.diagnostics.Profile.load(tmp_path / "p.json") == v100_2to1_profile
    v100_2to1_profile.plot(tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 10_000
    text = v100_2to1_profile.table()
    assert "v100: 4 workers, 2 proxies" in text and "worker 3" in text and "proxy 2" not in text
    real = coarse.diagnostics.profile(shared_mesh, sizes=(1 << 10, 1 << 20), reps=2)
    assert (real.workers, real.proxies, real.topology) == (4, 2, None)
    assert (real.wp_oneway_s > 0).all() and real.link("wp", "bandwidth_gbps").shape == (4, 2)


def test_k_to_1_coarse_from_its_profile_matches_the_model(shared_mesh, v100_2to1_profile):
    """The routes planned from a 2:1 profile run on the 2:1 mesh, in the model's time."""
    topo = _virtual_k1("v100")
    cfg = coarse.Config.from_profile(v100_2to1_profile, topology=topo, leading_bytes=0)
    tree = {
        "a": jax.ShapeDtypeStruct((300_000,), np.float32),
        "b": jax.ShapeDtypeStruct((5_000,), np.float32),
    }
    plan = coarse.diagnostics.plan(tree, shared_mesh, cfg)
    assert (1, 1, 0, 0) in {pc.dest for pc in plan.pieces}  # large pieces: the remote proxy
    measured = schemes.time_sync(shared_mesh, tree, cfg, reps=1)
    assert measured == pytest.approx(predict_plan_sync_s(plan, topo), rel=1e-4)


def test_k_to_1_reprofiling_replans_when_the_links_change(shared_mesh):
    prof = coarse.diagnostics.profile(
        shared_mesh, topology=_virtual_k1("v100"), sizes=(1 << 10, 1 << 16, 1 << 22), reps=2
    )
    # Planned on V100 links (remote bandwidth proxies), running on P100 links.
    cfg = coarse.Config.from_profile(prof, topology=_virtual_k1("p100"), reprofile_every=2)
    assert cfg.routes == ((0, 1), (0, 1), (1, 0), (1, 0))
    step = _reduce_step(shared_mesh, cfg)
    x = np.ones((4, 300_000), np.float32)
    for _ in range(3):
        np.testing.assert_allclose(step(x), 1.0)
    assert step.config().routes == ((0, 0), (0, 0), (1, 1), (1, 1))  # P100: local wins
    assert step.stats()["reprofiles"] == 1
