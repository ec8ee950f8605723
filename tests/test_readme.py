"""Every ```python block of README.md runs, in order, as one script (later blocks use earlier
names)."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def _blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def test_readme_has_python_blocks():
    assert len(_blocks()) >= 2


@pytest.mark.timeout(300)
def test_readme_python_blocks_run(tmp_path):
    script = tmp_path / "readme.py"
    script.write_text("\n\n".join(_blocks()))
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    env.pop("COARSE_JAX_MODE", None)
    # From tmp_path: the blocks write files (v100.png, v100.json), and the
    # installed package is imported rather than ./coarse_jax.
    run = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert run.returncode == 0, f"README blocks failed:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    assert "leaves" in run.stdout  # Plan.summary() printed
    assert (tmp_path / "v100.json").exists() and (tmp_path / "v100.png").exists()
