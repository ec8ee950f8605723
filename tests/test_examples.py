"""Every example runs for a couple of steps, so none of them rots."""

import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def run_example(name, tmp_path, *flags):
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name / "main.py"), "--workdir", str(tmp_path), *flags],
        cwd=tmp_path,  # import the installed coarse_jax, not the source tree
        capture_output=True,
        text=True,
        timeout=600,
        check=False,  # the assertions below show the output
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.mark.parametrize("name", ["demo", "cnn", "resnet18", "bert"])
def test_example_runs(name, tmp_path):
    result = run_example(name, tmp_path, "--steps", "2")
    assert "loss curves match (relative diff < 1e-4): True" in result.stdout, result.stdout
    assert (tmp_path / "metrics.jsonl").exists()


def test_example_plot(tmp_path):
    run_example("cnn", tmp_path, "--steps", "2", "--plot")
    png = tmp_path / "loss.png"
    assert png.exists()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
