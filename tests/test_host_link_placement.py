"""COARSE-host beside COARSE-devices, AllReduce and DENSE (`coarse_jax.cli.proxy_placement`) and the
profiler's CLI that prints them.

On the virtual clock every row's simulated time must equal the model's; which placement
wins is checked against reasoning on the figures: at 4:1 a proxy device's one port takes
its four clients in turn (4 n at 25 GB/s) while a host proxy's four clients each use their
own host link (n at 12.5 GB/s, two per root complex); at 1:1 each client has its own proxy
device at 25 GB/s, but its host link is still shared (12.5 GB/s).
"""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from coarse_jax.cli import proxy_placement as placement

TREE = {
    "a": jax.ShapeDtypeStruct((400_000,), np.float32),
    "b": jax.ShapeDtypeStruct((3_000,), np.float32),
}


@pytest.mark.parametrize(("proxies", "winner"), [(1, "host proxies"), (4, "device proxies")])
def test_placements_side_by_side_match_the_model(proxies, winner):
    rows = placement.compare_placements(
        TREE, "pcie4", 4, proxies, time_scale=10.0, profile_time_scale=1.0, reps=1
    )
    assert [r.scheme for r in rows] == ["DENSE", "AllReduce", "COARSE-devices", "COARSE-host"]
    for r in rows:
        assert r.taken_s == pytest.approx(r.predicted_s, rel=1e-4), r
    line = placement.favoured(rows, "pcie4")
    assert line.startswith(f"pcie4 favours {winner} by ") and line.endswith("(emulated)")
    print("\n" + placement.table(rows) + "\n" + line)
    predicted_only = placement.compare_placements(
        TREE, "pcie4", 4, proxies, time_scale=10.0, run=False
    )
    assert all(r.taken_s is None for r in predicted_only)
    assert placement.favoured(predicted_only, "pcie4").endswith("(predicted)")


def _cli(tmp_path, *args: str) -> str:
    """``python -m coarse_jax.cli ARGS``'s output: the installed package
    (cwd=tmp_path, not ./coarse_jax, which a clean clone builds no extension into)."""
    result = subprocess.run(
        [sys.executable, "-m", "coarse_jax.cli", *args],
        cwd=tmp_path,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_cli_puts_coarse_host_beside_the_others(tmp_path):
    out = _cli(
        tmp_path, "--emulate", "pcie5", "--workers", "2", "--proxies", "1",
        "--max-size", str(1 << 16), "--reps", "2", "--clock", "virtual",
    )  # fmt: skip
    for scheme in ("DENSE", "AllReduce", "COARSE-devices", "COARSE-host"):
        assert f"\n{scheme} " in out, out
    # 2:1 on one root complex: a proxy device's port takes 2 n at 50 GB/s, each worker's
    # share of the root complex n at 25 GB/s: the same time.
    assert "pcie5: both placements take" in out, out


def test_cli_profiles_a_host_proxy_mesh(tmp_path):
    out = _cli(
        tmp_path, "--emulate", "pcie4", "--workers", "2", "--proxies", "1",
        "--proxies-on", "host", "--max-size", str(1 << 16), "--reps", "2",
        "--clock", "virtual", "--no-placements",
    )  # fmt: skip
    assert out.startswith("Profile pcie4+host: 2 workers, 1 proxies"), out[:300]
    assert "\ncoarse " in out and "COARSE-host" not in out
