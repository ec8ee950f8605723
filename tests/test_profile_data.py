"""`coarse_jax.profiling.data` and `.routing`: the Profile container and the Section III-E planner.

Profiles here are synthetic, built from the link model ``time = latency +
size / bandwidth`` so the planner's answers can be checked analytically.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from coarse_jax.config import Config
from coarse_jax.profiling.data import FORMAT, Profile
from coarse_jax.profiling.routing import (
    routes_from_profile,
    shard_bytes_from_profile,
    threshold_bytes,
)

SIZES = tuple(1 << k for k in range(10, 27))  # 1 KiB .. 64 MiB


def _t(us: float, gbps: float, sizes=SIZES) -> np.ndarray:
    return us * 1e-6 + np.asarray(sizes, np.float64) / (gbps * 1e9)


def linear_profile(
    p: int,
    local: tuple[float, float],
    remote: tuple[float, float],
    *,
    sizes=SIZES,
    name: str | None = None,
    proxies: int | None = None,
) -> Profile:
    """A profile of the link model; ``local``/``remote`` are (GB/s, us) of worker<->proxy links.

    ``proxies``: q (default p); worker i's local proxy is i // (p // q).
    """
    s = len(sizes)
    q = p if proxies is None else proxies
    wp = np.empty((p, q, s))
    for i in range(p):
        for k in range(q):
            bw, us = local if i // (p // q) == k else remote
            wp[i, k] = _t(us, bw, sizes)
    ring_pp = np.broadcast_to(_t(2.0, 24.0, sizes), (q, 2, s))
    ring_ww = np.broadcast_to(_t(8.0, 9.0, sizes), (p, 2, s))
    return Profile(
        workers=p,
        sizes=sizes,
        wp_oneway_s=wp,
        wp_bidir_s=wp * 1.1,
        pp_oneway_s=ring_pp,
        pp_bidir_s=ring_pp * 1.1,
        ww_oneway_s=ring_ww,
        topology=name,
        host="synthetic",
        **({} if proxies is None else {"proxies": proxies}),
    )


V100 = ((9.0, 3.0), (16.0, 8.0))
P100 = ((25.0, 3.0), (18.0, 8.0))
T4 = ((12.0, 5.0), (12.0, 5.0))


@pytest.fixture
def v100() -> Profile:
    return linear_profile(4, *V100, name="v100")


# ---------------------------------------------------------------- Profile


def test_derived_latency_and_bandwidth(v100):
    lat = v100.link("wp", "latency_us")
    bw = v100.link("wp", "bandwidth_gbps")
    assert lat.shape == bw.shape == (4, 4)
    # Latency is the time at the smallest size: the link latency plus 1 KiB at line rate.
    assert lat[0, 0] == pytest.approx(3.0 + 1024 / 9e9 * 1e6)
    assert lat[0, 1] == pytest.approx(8.0 + 1024 / 16e9 * 1e6)
    # Peak bandwidth is at the largest size and approaches the line rate.
    assert bw[0, 0] == pytest.approx(SIZES[-1] / _t(3.0, 9.0)[-1] / 1e9)
    assert 8.9 < bw[2, 2] < 9.0 and 15.9 < bw[2, 3] < 16.0
    assert v100.link("wp", "bidir_bandwidth_gbps")[0, 0] == pytest.approx(2 * bw[0, 0] / 1.1)
    assert v100.link("pp", "latency_us").shape == v100.link("pp", "bandwidth_gbps").shape == (4, 2)
    assert v100.link("ww", "latency_us").shape == v100.link("ww", "bandwidth_gbps").shape == (4, 2)
    assert 23.9 < v100.link("pp", "bandwidth_gbps")[1, 1] < 24.0
    assert 8.9 < v100.link("ww", "bandwidth_gbps")[3, 0] < 9.0


# (link kind, figure): every figure of every kind.
LINK_FIGURES = [
    ("wp", "latency_us"),
    ("wp", "bandwidth_gbps"),
    ("wp", "bidir_bandwidth_gbps"),
    ("wp", "bandwidth_curve_gbps"),
    ("pp", "latency_us"),
    ("pp", "bandwidth_gbps"),
    ("pp", "bidir_bandwidth_gbps"),
    ("pp", "bandwidth_curve_gbps"),
    ("ww", "latency_us"),
    ("ww", "bandwidth_gbps"),
    ("ww", "bandwidth_curve_gbps"),
]


@pytest.mark.parametrize("kind, what", LINK_FIGURES, ids=[f"{k}-{w}" for k, w in LINK_FIGURES])
def test_link_figures_match_the_times_link_by_link(v100_2to1, kind, what):
    prof = v100_2to1  # 4 workers, 2 proxies: "wp" [4, 2], "pp" [2, 2], "ww" [4, 2]
    got = prof.link(kind, what)
    oneway = getattr(prof, f"{kind}_oneway_s")
    bidir = getattr(prof, f"{kind}_bidir_s", None)
    for index in np.ndindex(oneway.shape[:2]):  # each link, from its own times
        t, b = oneway[index], (None if bidir is None else bidir[index])
        want = {
            "latency_us": t[0] * 1e6,
            "bandwidth_gbps": max(s / x for s, x in zip(prof.sizes, t, strict=True)) / 1e9,
            "bidir_bandwidth_gbps": None
            if b is None
            else max(2 * s / x for s, x in zip(prof.sizes, b, strict=True)) / 1e9,
            "bandwidth_curve_gbps": [s / x / 1e9 for s, x in zip(prof.sizes, t, strict=True)],
        }[what]
        np.testing.assert_allclose(got[index], want, rtol=1e-12)


@pytest.mark.parametrize(
    "kind, what, match",
    [
        ("wq", "latency_us", r"expected kind in \('wp', 'pp', 'ww'\).*got \('wq'"),
        ("wp", "latency", r"what in \('latency_us'.*got \('wp', 'latency'\)"),
        ("ww", "bidir_bandwidth_gbps", r"workers' ring \('ww'\) is measured one way only"),
    ],
)
def test_link_names_what_it_takes(v100, kind, what, match):
    with pytest.raises(ValueError, match=match):
        v100.link(kind, what)


def test_lists_become_readonly_arrays(v100):
    d = v100.to_json_dict()
    prof = Profile(
        workers=d["workers"],
        sizes=d["sizes"],
        **{
            k: d[k]
            for k in ("wp_oneway_s", "wp_bidir_s", "pp_oneway_s", "pp_bidir_s", "ww_oneway_s")
        },
    )
    assert isinstance(prof.wp_oneway_s, np.ndarray) and isinstance(prof.sizes, tuple)
    with pytest.raises(ValueError):
        prof.wp_oneway_s[0, 0, 0] = 1.0


def test_equality_and_allclose(v100):
    same = linear_profile(4, *V100, name="v100")
    assert v100 == same
    assert not v100.__ne__(same)
    other = linear_profile(4, *P100, name="v100")
    assert v100 != other
    assert v100 != dataclasses.replace(v100, host="elsewhere")
    nudged = dataclasses.replace(v100, wp_oneway_s=v100.wp_oneway_s * (1 + 1e-12))
    assert nudged != v100 and nudged.allclose(v100)
    assert not other.allclose(v100)
    with pytest.raises(TypeError):
        hash(v100)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"workers": 0}, "workers"),
        ({"sizes": (2048, 1024, *SIZES[2:])}, "ascending"),
        ({"sizes": (0, *SIZES[1:])}, "positive"),
        ({"sizes": SIZES[:-1]}, r"wp_oneway_s.*shape"),
        ({"pp_oneway_s": np.ones((4, 4, len(SIZES)))}, r"pp_oneway_s.*\(4, 2, 17\)"),
        ({"ww_oneway_s": np.zeros((4, 2, len(SIZES)))}, r"ww_oneway_s.*> 0"),
        ({"wp_bidir_s": np.full((4, 4, len(SIZES)), np.nan)}, "wp_bidir_s"),
        ({"time_scale": 0.0}, "time_scale"),
        ({"topology": 3}, "topology"),
    ],
)
def test_validation(v100, change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(v100, **change)


def test_save_load_round_trip(v100, tmp_path):
    path = tmp_path / "v100.json"
    v100.save(path)
    data = json.loads(path.read_text())
    assert data["format"] == FORMAT and data["topology"] == "v100"
    loaded = Profile.load(path)
    assert loaded == v100
    assert loaded.sizes == SIZES and loaded.host == "synthetic"
    assert Profile.load(str(path)) == v100


def test_load_rejects_bad_files(v100, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="invalid JSON"):
        Profile.load(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        Profile.load(bad)
    data = v100.to_json_dict()
    bad.write_text(json.dumps({**data, "format": "something/2"}))
    with pytest.raises(ValueError, match=r"format.*coarse_jax\.profile/1.*something/2"):
        Profile.load(bad)
    del data["wp_bidir_s"]
    bad.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"missing.*wp_bidir_s"):
        Profile.load(bad)
    data = v100.to_json_dict()
    data["sizes"] = data["sizes"][::-1]
    bad.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"bad\.json.*ascending"):
        Profile.load(bad)


def test_table_contains_numbers(v100):
    text = v100.table()
    lat, bw = v100.link("wp", "latency_us"), v100.link("wp", "bandwidth_gbps")
    assert "v100" in text
    assert f"{lat[0, 0]:.2f}" in text and f"{bw[0, 1]:.3f}" in text
    assert f"{v100.link('pp', 'bandwidth_gbps')[0, 0]:.3f}" in text
    assert f"{v100.link('ww', 'latency_us')[0, 0]:.2f}" in text
    assert "proxy ring" in text and "worker ring" in text
    assert f"{threshold_bytes(v100, 0)} B" in text
    assert len([l for l in text.splitlines() if "*" in l]) == 4  # one row per worker, local marked


def test_plot_writes_png(v100, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "v100.png"
    v100.plot(path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


# ---------------------------------------------------------------- planner


def test_v100_routes_small_local_large_remote(v100):
    routes = routes_from_profile(v100)
    for i, (lat, bw) in enumerate(routes):
        assert lat == i  # lowest latency: the local proxy
        assert bw != i  # highest bandwidth: a remote one
        assert bw == (i + 1) % 4  # remote ties go to the next proxy: one client each
    (l_bw, l_us), (r_bw, r_us) = V100
    crossing = (r_us - l_us) * 1e-6 / (1 / (l_bw * 1e9) - 1 / (r_bw * 1e9))
    for i in range(4):
        th = threshold_bytes(v100, i)
        assert th is not None
        # Times are linear in size, so interpolation is exact up to rounding.
        assert abs(th - crossing) <= 1
        # ... and it lies between the measured sizes where the curves cross.
        j = np.searchsorted(SIZES, crossing)
        assert SIZES[j - 1] < th < SIZES[j]


@pytest.mark.parametrize("preset", [P100, T4], ids=["p100", "t4"])
def test_local_when_local_is_best(preset):
    prof = linear_profile(4, *preset)
    assert routes_from_profile(prof) == tuple((i, i) for i in range(4))
    assert all(threshold_bytes(prof, i) is None for i in range(4))
    cfg = Config.from_profile(prof)
    assert cfg.routes == tuple((i, i) for i in range(4))
    assert cfg.latency_threshold_bytes == 0


def test_threshold_edge_cases():
    # BwProxy is chosen by *measured* peak bandwidth: if only sizes below the
    # crossing are measured the local proxy wins both, and there is no threshold.
    sizes = (1024, 2048, 4096)
    prof = linear_profile(2, (9.0, 3.0), (16.0, 8.0), sizes=sizes)
    assert routes_from_profile(prof) == ((0, 0), (1, 1))
    assert threshold_bytes(prof, 0) is None
    # Crossing exactly at a measured size: the threshold is that size.
    (l_bw, l_us), (r_bw, r_us) = V100
    crossing = (r_us - l_us) * 1e-6 / (1 / (l_bw * 1e9) - 1 / (r_bw * 1e9))
    sizes = (1000, round(crossing), 10**7)
    prof = linear_profile(2, (9.0, 3.0), (16.0, 8.0), sizes=sizes)
    assert abs(threshold_bytes(prof, 1) - crossing) <= 1
    # Hand-made times where the BwProxy is no slower already at the smallest size
    # (equal latency; the local proxy wins the latency tie).
    wp = np.empty((2, 2, 3))
    wp[:, :] = [1e-6, 2e-6, 3e-6]
    wp[0, 1] = [1e-6, 1.5e-6, 2e-6]
    ring = np.ones((2, 2, 3))
    prof = Profile(2, sizes, wp, wp, ring, ring, ring)
    assert routes_from_profile(prof)[0] == (0, 1)
    assert threshold_bytes(prof, 0) == sizes[0]
    with pytest.raises(ValueError, match="worker"):
        threshold_bytes(prof, 2)


def test_shard_size_first_size_at_95_percent():
    sizes = (1000, 2000, 4000, 8000, 16000)
    gbps = np.array([1.0, 4.0, 9.4, 9.5, 10.0])  # 9.5 is exactly 95% of the 10 GB/s peak
    wp = np.broadcast_to(np.asarray(sizes) / (gbps * 1e9), (2, 2, 5)).copy()
    ring = np.ones((2, 2, 5))
    prof = Profile(2, sizes, wp, wp, ring, ring, ring)
    assert shard_bytes_from_profile(prof, 0) == 8000
    assert shard_bytes_from_profile(prof, 1, fraction=0.9) == 4000
    assert shard_bytes_from_profile(prof, 1, fraction=1.0) == 16000
    with pytest.raises(ValueError, match="fraction"):
        shard_bytes_from_profile(prof, 0, fraction=0.0)


def test_shard_size_matches_link_model(v100):
    # Bandwidth to the BwProxy (remote, 16 GB/s, 8 us) at each size; pick the first >= 95% of peak.
    curve = np.asarray(SIZES) / _t(8.0, 16.0) / 1e9
    expected = SIZES[int(np.argmax(curve >= 0.95 * curve.max()))]
    assert all(shard_bytes_from_profile(v100, i) == expected for i in range(4))
    assert Config.from_profile(v100).shard_bytes == expected


def test_config_from_profile(v100):
    cfg = Config.from_profile(v100)
    assert isinstance(cfg, Config)
    assert cfg.routes == routes_from_profile(v100)
    assert cfg.latency_threshold_bytes == max(threshold_bytes(v100, i) for i in range(4))
    assert cfg.shard_bytes == max(shard_bytes_from_profile(v100, i) for i in range(4))
    cfg = Config.from_profile(v100, leading_bytes=1 << 16, shard_bytes=1 << 20, mode="reference")
    assert (cfg.leading_bytes, cfg.shard_bytes, cfg.mode) == (1 << 16, 1 << 20, "reference")
    assert cfg.routes == routes_from_profile(v100)
    with pytest.raises(ValueError, match=r"config_from_profile: unknown Config field.*shard_size"):
        Config.from_profile(v100, shard_size=4096)
    with pytest.raises(ValueError, match="leading_bytes"):
        Config.from_profile(v100, leading_bytes=-1)


def test_robust_time_keeps_the_fastest_and_drops_outliers_from_the_spread():
    from coarse_jax.profiling.measure import robust_time

    fastest, spread = robust_time(np.array([1.0, 1.1, 1.2, 50.0]))  # one preempted repetition
    assert fastest == 1.0
    assert spread == pytest.approx(0.1)  # median of 1.0, 1.1, 1.2 over the fastest
    assert robust_time(np.array([2.0, 2.0])) == (2.0, 0.0)


def test_noise_does_not_decide_routes():
    """A remote proxy 15% faster at a size whose repetitions spread 12% is a tie: local wins."""
    base = linear_profile(2, (12.0, 5.0), (12.0, 5.0))
    wp = np.array(base.wp_oneway_s)
    wp[0, 1] *= 0.85  # worker 0 -> proxy 1 looks faster at every size
    quiet = dataclasses.replace(base, wp_oneway_s=wp, wp_spread=np.full(wp.shape, 0.01))
    noisy = dataclasses.replace(base, wp_oneway_s=wp, wp_spread=np.full(wp.shape, 0.12))
    assert routes_from_profile(quiet)[0] == (1, 1)  # a real difference: taken
    assert routes_from_profile(noisy)[0] == (0, 0)  # within the noise: the local proxy
    assert "max 12.0%" in noisy.table()
    assert Profile.from_json_dict(json.loads(json.dumps(noisy.to_json_dict()))) == noisy
    assert noisy != quiet and base != quiet  # the spread is part of the profile
    with pytest.raises(ValueError, match="wp_spread"):
        dataclasses.replace(base, wp_spread=np.full((2, 2), 0.1))


# ---------------------------------------------------------------- COARSE k:1


@pytest.fixture
def v100_2to1() -> Profile:
    """4 workers, 2 proxies (worker i's local proxy is i // 2), V100 links."""
    return linear_profile(4, *V100, name="v100", proxies=2)


def test_k_to_1_shapes_and_derived(v100_2to1):
    prof = v100_2to1
    assert (prof.workers, prof.proxies) == (4, 2)
    assert prof.wp_oneway_s.shape == prof.wp_bidir_s.shape == (4, 2, len(SIZES))
    assert prof.pp_oneway_s.shape == prof.pp_bidir_s.shape == (2, 2, len(SIZES))
    assert prof.ww_oneway_s.shape == (4, 2, len(SIZES))
    assert prof.link("wp", "latency_us").shape == prof.link("wp", "bandwidth_gbps").shape == (4, 2)
    assert prof.link("wp", "bidir_bandwidth_gbps").shape == (4, 2)
    assert prof.link("wp", "bandwidth_curve_gbps").shape == (4, 2, len(SIZES))
    pp_latency, pp_bidir = prof.link("pp", "latency_us"), prof.link("pp", "bidir_bandwidth_gbps")
    assert pp_latency.shape == pp_bidir.shape == (2, 2)
    assert prof.link("ww", "bandwidth_gbps").shape == (4, 2)
    assert [prof.local_proxy(i) for i in range(4)] == [0, 0, 1, 1]
    lat = prof.link("wp", "latency_us")
    assert lat[1, 0] == pytest.approx(3.0 + 1024 / 9e9 * 1e6)  # worker 1's local proxy is 0
    assert lat[1, 1] == pytest.approx(8.0 + 1024 / 16e9 * 1e6)
    with pytest.raises(ValueError, match="worker"):
        prof.local_proxy(4)
    with pytest.raises(TypeError, match="worker"):
        prof.local_proxy(1.0)
    # 1:1 profiles: proxies defaults to workers, every worker its own local proxy.
    one = linear_profile(4, *V100)
    assert one.proxies == 4 and [one.local_proxy(i) for i in range(4)] == [0, 1, 2, 3]
    assert dataclasses.replace(one, proxies=None).proxies == 4


@pytest.mark.parametrize(
    "change, match",
    [
        ({"proxies": 3}, r"Profile\.proxies.*dividing workers=4"),
        ({"proxies": 8}, r"Profile\.proxies"),
        ({"proxies": -2}, r"Profile\.proxies"),
        ({"proxies": True}, r"Profile\.proxies"),
        ({"proxies": 4}, r"wp_oneway_s.*\(4, 4, 17\) \[worker, proxy, size\] for workers=4 and"),
        ({"proxies": 1}, r"wp_oneway_s.*\(4, 1, 17\).*workers=4, proxies=1"),
        ({"pp_oneway_s": np.ones((4, 2, len(SIZES)))}, r"pp_oneway_s.*\(2, 2, 17\) \[proxy"),
        ({"ww_oneway_s": np.ones((2, 2, len(SIZES)))}, r"ww_oneway_s.*\(4, 2, 17\) \[worker"),
        ({"wp_spread": np.zeros((4, 4, len(SIZES)))}, r"wp_spread.*\(4, 2, 17\)"),
    ],
)
def test_k_to_1_validation(v100_2to1, change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(v100_2to1, **change)


def test_k_to_1_json_round_trip_and_equality(v100_2to1, tmp_path):
    d = v100_2to1.to_json_dict()
    assert d["proxies"] == 2 and np.asarray(d["wp_oneway_s"]).shape == (4, 2, len(SIZES))
    path = tmp_path / "v100_2to1.json"
    v100_2to1.save(path)
    loaded = Profile.load(path)
    assert loaded == v100_2to1 and loaded.allclose(v100_2to1) and loaded.proxies == 2
    one = linear_profile(4, *V100, name="v100")
    assert one != v100_2to1 and not one.allclose(v100_2to1)
    # A k:1 profile's arrays do not fit a 1:1 file: the message names the field and shape.
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**d, "proxies": 4}))
    with pytest.raises(ValueError, match=r"bad\.json.*wp_oneway_s.*\(4, 4, 17\)"):
        Profile.load(bad)


def test_old_json_without_proxies_loads_as_1_to_1(v100, tmp_path):
    """Files saved before COARSE k:1 have no "proxies": one proxy per worker."""
    d = v100.to_json_dict()
    assert d.pop("proxies") == 4
    path = tmp_path / "old.json"
    path.write_text(json.dumps(d))
    loaded = Profile.load(path)
    assert loaded.proxies == loaded.workers == 4 and loaded == v100
    assert routes_from_profile(loaded) == routes_from_profile(v100)
    # A hand-written file of the old format, 1 worker.
    old = {
        "format": FORMAT,
        "workers": 1,
        "sizes": [1024],
        **{n: [[[1e-6]]] for n in ("wp_oneway_s", "wp_bidir_s")},
        **{n: [[[1e-9], [1e-9]]] for n in ("pp_oneway_s", "pp_bidir_s", "ww_oneway_s")},
    }
    prof = Profile.from_json_dict(old)
    assert (prof.workers, prof.proxies, prof.topology, prof.wp_spread) == (1, 1, None, None)
    assert Config.from_profile(prof).routes == ((0, 0),)


def test_k_to_1_v100_routes_small_local_large_remote(v100_2to1):
    routes = routes_from_profile(v100_2to1)
    assert routes == ((0, 1), (0, 1), (1, 0), (1, 0))
    (l_bw, l_us), (r_bw, r_us) = V100
    crossing = (r_us - l_us) * 1e-6 / (1 / (l_bw * 1e9) - 1 / (r_bw * 1e9))
    for i in range(4):
        assert abs(threshold_bytes(v100_2to1, i) - crossing) <= 1
    cfg = Config.from_profile(v100_2to1)
    assert cfg.routes == routes and cfg.routes_for(4, 2) == routes
    assert cfg.latency_threshold_bytes == max(threshold_bytes(v100_2to1, i) for i in range(4))
    assert cfg.shard_bytes == shard_bytes_from_profile(v100_2to1, 0)


def test_k_to_1_remote_ties_spread_the_groups_over_the_proxies():
    """8 workers, 4 proxies: each group's bandwidth proxy is the next group's, so every
    proxy serves exactly k = 2 workers' large tensors."""
    prof = linear_profile(8, *V100, proxies=4)
    routes = routes_from_profile(prof)
    assert routes == tuple((i // 2, (i // 2 + 1) % 4) for i in range(8))
    assert sorted(bw for _, bw in routes) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert Config.from_profile(prof).routes_for(8, 4) == routes


@pytest.mark.parametrize("q", [1, 2])
@pytest.mark.parametrize("preset", [P100, T4], ids=["p100", "t4"])
def test_k_to_1_local_when_local_is_best(preset, q):
    prof = linear_profile(4, *preset, proxies=q)
    assert routes_from_profile(prof) == tuple((i // (4 // q),) * 2 for i in range(4))
    assert all(threshold_bytes(prof, i) is None for i in range(4))
    assert Config.from_profile(prof).latency_threshold_bytes == 0


def test_k_to_1_noise_does_not_decide_routes():
    """A remote proxy within its measurements' noise loses to the worker's local proxy i // k."""
    base = linear_profile(4, (12.0, 5.0), (12.0, 5.0), proxies=2)
    wp = np.array(base.wp_oneway_s)
    wp[1, 1] *= 0.85  # worker 1 (local proxy 0) -> proxy 1 looks faster at every size
    quiet = dataclasses.replace(base, wp_oneway_s=wp, wp_spread=np.full(wp.shape, 0.01))
    noisy = dataclasses.replace(base, wp_oneway_s=wp, wp_spread=np.full(wp.shape, 0.12))
    assert routes_from_profile(quiet)[1] == (1, 1)
    assert routes_from_profile(noisy)[1] == (0, 0)
    assert "max 12.0%" in noisy.table()


def test_k_to_1_table_and_plot(v100_2to1, tmp_path):
    text = v100_2to1.table()
    assert "v100: 4 workers, 2 proxies on synthetic" in text
    assert "proxy 1" in text and "proxy 2" not in text
    rows = [line for line in text.splitlines() if line.startswith("worker ") and "*" in line]
    assert len(rows) == 4  # one row per worker, its local proxy marked
    # "worker i  lat/ bw  lat/ bw  routes ...": the mark follows the local proxy's bandwidth.
    for i, row in enumerate(rows):
        cells = row.split()
        marked = [k for k in range(2) if cells[3 + 2 * k].endswith("*")]
        assert marked == [i // 2], row
        assert cells[6] == f"{i // 2}/{1 - i // 2}", row  # LatProxy/BwProxy
    assert "proxy 1   -> 0" in text and "worker 3   -> 0" in text
    pytest.importorskip("matplotlib")
    path = tmp_path / "v100_2to1.png"
    v100_2to1.plot(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- decisions from repeated rounds

from coarse_jax.profiling import rounds  # noqa: E402
from coarse_jax.profiling.data import Decision  # noqa: E402

PAPER_V100_ROUTES = ((0, 1), (1, 2), (2, 3), (3, 0))
ROUND_SIZES = (1 << 10, 1 << 16, 1 << 18, 1 << 24)


def _true_times(local, remote, p=4, sizes=ROUND_SIZES) -> np.ndarray:
    """[p, p, S] seconds of the link model (1:1)."""
    return np.array(
        [[_t(*(local if i == k else remote)[::-1], sizes) for k in range(p)] for i in range(p)]
    )


def _rounds(true_s: np.ndarray, rounds: int, noise_s: float, seed: int = 0) -> dict:
    """Per-round samples: the true time plus host noise, which only adds time: an
    exponential delay of mean ``noise_s`` and, in one round of 8, a preemption of 1 ms."""
    rng = np.random.default_rng(seed)
    p, q, S = true_s.shape
    out: dict = {}
    for i, k, j in np.ndindex(p, q, S):
        delay = rng.exponential(noise_s, rounds) + (rng.random(rounds) < 1 / 8) * 1e-3
        out[i, k, j] = dict(enumerate(true_s[i, k, j] + delay))
    return out


def _decide(samples: dict, model_s, *, final: bool, exact: bool = False):
    p, q, _ = model_s.shape if model_s is not None else (4, 4, 0)
    return rounds.decide(
        lambda i, k, j: samples[i, k, j],
        ROUND_SIZES,
        list(range(p)),
        q,
        exact=exact,
        model_s=model_s,
        model_name="v100",
        settled={},
        final=final,
        why=" (test)",
    )


def _routes(decisions: dict) -> tuple:
    return tuple(
        (decisions[i, "latency"].choice, decisions[i, "bandwidth"].choice) for i in range(4)
    )


def test_median_ci_is_the_sign_tests_interval():
    assert rounds.median_ci(np.ones(7)) is None  # 99% needs 8 values
    assert rounds.median_ci(np.arange(8.0)) == (3.5, 0.0, 7.0)  # the whole range
    # 20 values: P(Binomial(20, 1/2) <= 3) = 0.0013 <= 0.005 < P(<= 4) = 0.0059: x_(4), x_(17).
    assert rounds.median_ci(np.arange(20.0))[1:] == (3.0, 16.0)
    # Whatever the noise's shape, the interval holds the true median 99% of the time.
    rng = np.random.default_rng(3)
    hits = [
        lo <= 0 <= hi
        for _, lo, hi in (rounds.median_ci(rng.standard_cauchy(16)) for _ in range(3000))
    ]
    assert np.mean(hits) >= 0.985


def test_preempted_rounds_do_not_decide_v100_routes():
    """A 1 ms preemption (longer than the local link's 16 MiB transfer, 300x the latency) in
    one round of 8: 32 rounds make every decision clear, and it is the paper's."""
    true_s = _true_times((9.0, 3.0), (16.0, 8.0))
    decisions, needed = _decide(_rounds(true_s, 32, 0.3e-6), true_s, final=False)
    assert not needed
    assert {d.basis for d in decisions.values()} == {"measured"}
    assert _routes(decisions) == PAPER_V100_ROUTES
    crossing = 5e-6 * 144e9 / 7  # between 64 KiB and 256 KiB
    for i in range(4):
        assert ROUND_SIZES[1] < decisions[i, "threshold"].choice < ROUND_SIZES[2]
        assert decisions[i, "threshold"].choice == pytest.approx(crossing, rel=0.3)


def test_noise_as_large_as_the_latency_leaves_ties_unclear_and_the_model_decides():
    """Exponential noise of 6 us (and 1 ms preemptions) on links of 3 and 8 us: what 16 rounds
    leave unclear, the model decides, and the routes are the paper's."""
    true_s = _true_times((9.0, 3.0), (16.0, 8.0))
    decisions, _ = _decide(_rounds(true_s, 16, 6e-6), true_s, final=True)
    assert _routes(decisions) == PAPER_V100_ROUTES
    bases = [d.basis for d in decisions.values()]
    assert "model" in bases and set(bases) <= {"measured", "model"}


def test_too_few_rounds_leave_decisions_open_then_keep_the_models_choice():
    true_s = _true_times((9.0, 3.0), (16.0, 8.0))
    samples = _rounds(true_s, 5, 6e-6)  # too few rounds for a 99% interval
    decisions, needed = _decide(samples, true_s, final=False)
    assert decisions == {} and {(i, k, 0) for i in range(4) for k in range(4)} <= needed
    decisions, needed = _decide(samples, true_s, final=True)
    assert not needed
    routes = tuple(
        (decisions[i, "latency"].choice, decisions[i, "bandwidth"].choice) for i in range(4)
    )
    assert routes == PAPER_V100_ROUTES  # the model's choice: the v100 formula's
    d = decisions[0, "bandwidth"]
    assert (
        d.basis == "model" and "not clear" in d.detail and "v100 model's choice (test)" in d.detail
    )
    assert decisions[0, "threshold"].basis == "model"
    assert decisions[0, "threshold"].choice == round(5e-6 * 144e9 / 7)


def test_noise_larger_than_a_difference_follows_the_model_not_the_noise():
    """Links 3% apart under noise 20x that: not clear by the 5% margin. The model (here: the
    local proxy is 3% faster) decides, not whichever link the noise favoured."""
    true_s = _true_times((12.0, 5.0), (12.0, 5.0))
    true_s[:, :, :] *= 1.03
    for i in range(4):
        true_s[i, i] /= 1.03  # the local link is 3% faster
    samples = _rounds(true_s, 16, 100e-6, seed=1)
    decisions, _ = _decide(samples, true_s, final=True)
    for i in range(4):
        for kind in ("latency", "bandwidth"):
            assert decisions[i, kind].choice == i
    # Without a model (the host's own devices) an unclear decision takes the local proxy.
    decisions, _ = _decide(samples, None, final=True)
    assert all(decisions[i, "bandwidth"].choice == i for i in range(4))
    assert {decisions[i, "bandwidth"].basis for i in range(4)} <= {"local", "measured"}


def test_exact_samples_decide_in_one_round():
    true_s = _true_times((9.0, 3.0), (16.0, 8.0))
    samples = {(i, k, j): {0: true_s[i, k, j]} for i, k, j in np.ndindex(*true_s.shape)}
    decisions, needed = _decide(samples, true_s, final=True, exact=True)
    assert not needed and {d.basis for d in decisions.values()} == {"measured"}
    assert decisions[2, "bandwidth"].choice == 3


def _with_decisions(prof: Profile, routes, threshold, basis="model") -> Profile:
    decisions = []
    for i, (lat, bw) in enumerate(routes):
        decisions += [
            Decision(i, "latency", lat, "measured", "clear"),
            Decision(i, "bandwidth", bw, basis, "not clear: noise"),
            Decision(i, "threshold", None if lat == bw else threshold, basis, "crossing"),
        ]
    return dataclasses.replace(prof, decisions=tuple(decisions))


def test_a_profiles_decisions_route_it_and_are_reported(v100, tmp_path):
    # Decisions (here different from what the times alone say) are what routing follows.
    decided = _with_decisions(v100, ((0, 2), (1, 3), (2, 0), (3, 1)), 4096)
    assert routes_from_profile(decided) == ((0, 2), (1, 3), (2, 0), (3, 1))
    assert threshold_bytes(decided, 1) == 4096
    assert Config.from_profile(decided).latency_threshold_bytes == 4096
    text = decided.table()
    assert "bandwidth proxy 2 (model)" in text and "4 decision(s) not clear" not in text
    assert "8 decision(s) not clear from the measurements" in text
    assert "worker 0 bandwidth: not clear: noise" in text
    decided.save(tmp_path / "d.json")
    assert Profile.load(tmp_path / "d.json") == decided != v100
    assert decided.decision(3, "latency") == Decision(3, "latency", 3, "measured", "clear")
    assert v100.decision(0, "latency") is None


@pytest.mark.parametrize(
    ("decisions", "match"),
    [
        ("drop", r"Profile.decisions: expected one decision per worker 0..3"),
        ({"kind": "speed"}, r"Decision.kind: expected one of \('latency', 'bandwidth'"),
        ({"basis": "guess"}, r"Decision.basis: expected one of"),
        ({"choice": 4}, r"worker 0's latency proxy must be in 0..3"),
        ({"choice": -1}, r"Decision.choice: expected an int >= 0"),
    ],
)
def test_bad_decisions_name_the_field(v100, decisions, match):
    good = [dataclasses.asdict(d) for d in _with_decisions(v100, PAPER_V100_ROUTES, 1).decisions]
    bad = good[1:] if decisions == "drop" else [{**good[0], **decisions}, *good[1:]]
    with pytest.raises(ValueError, match=match):
        Profile.from_json_dict({**v100.to_json_dict(), "decisions": bad})
