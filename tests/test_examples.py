"""Every example runs for a couple of steps, so none of them rots."""

import json
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


@pytest.mark.parametrize("name", ["demo", "cnn", "resnet18", "bert", "equinox_mnist"])
def test_example_runs(name, tmp_path):
    result = run_example(name, tmp_path, "--steps", "2")
    assert "loss curves match (relative diff < 1e-4): True" in result.stdout, result.stdout
    assert (tmp_path / "metrics.jsonl").exists()


def test_example_with_the_optimizer_on_the_proxies(tmp_path):
    """--optimizer proxy: coarse.value_and_update + coarse.optim.sgd, on pmean + optax's curve."""
    result = run_example("bert", tmp_path, "--steps", "3", "--optimizer", "proxy")
    assert "loss curves match (relative diff < 1e-4): True" in result.stdout, result.stdout


def test_equinox_example_with_the_optimizer_on_the_proxies(tmp_path):
    """Equinox's CNN, --optimizer proxy: coarse.value_and_update + coarse.optim.adam, on the
    curve of eqx.filter_jit + shard_map + lax.pmean + optax.adam."""
    result = run_example("equinox_mnist", tmp_path, "--steps", "3", "--optimizer", "proxy")
    assert "loss curves match (relative diff < 1e-4): True" in result.stdout, result.stdout
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {r["impl"] for r in records} == {"equinox", "coarse"}


def test_example_plot(tmp_path):
    run_example("cnn", tmp_path, "--steps", "2", "--plot")
    png = tmp_path / "loss.png"
    assert png.exists()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_example_noise_floor(tmp_path):
    """--noise-floor adds pmean with the worker sum reversed and compares step-0 gradients."""
    result = run_example("cnn", tmp_path, "--steps", "2", "--noise-floor")
    out = result.stdout
    assert "step-0 gradients, coarse vs pmean" in out, out
    assert "noise floor: max |loss_pmean-reversed - loss_pmean|" in out, out
    assert "loss curves match (relative diff < 1e-4): True" in out, out
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {r["impl"] for r in records if "step" in r} == {"coarse", "pmean", "pmean-reversed"}
    (diffs,) = [r for r in records if "noise_rel_loss_diff" in r]
    # Two valid float32 orders of the same 4-term sum: rounding-level, not zero-by-accident.
    assert diffs["noise_rel_loss_diff"] < 1e-5
    # Step-0 mean gradients agree to float32 rounding (two orders of one sum:
    # a few 1e-6 at most).
    assert 0 < diffs["step0_grad_diff"]["pmean-reversed"] < 1e-6
    assert diffs["step0_grad_diff"]["coarse"] < 1e-5


def test_noise_floor_needs_both(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "cnn" / "main.py"),
            "--workdir",
            str(tmp_path),
            "--impl",
            "pmean",
            "--noise-floor",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2 and "--noise-floor needs --impl both" in result.stderr


@pytest.mark.parametrize("proxies", [None, 2], ids=["1:1", "2:1"])
def test_demo_times_sync(tmp_path, proxies):
    """The demo (sync_timing_calls 20 by default) times the gradient sync alone, per impl;
    also with 2 proxies shared by the 4 workers (COARSE 2:1)."""
    more = [] if proxies is None else ["--proxies", str(proxies)]
    result = run_example(
        "demo", tmp_path, "--steps", "2", "--sync-timing-calls", "2", "--noise-floor", *more
    )
    if proxies:
        assert "via 2 proxies" in result.stdout, result.stdout
    assert "median step (ms)  median sync (ms)" in result.stdout, result.stdout
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    summaries = {r["impl"]: r for r in records if r.get("summary")}
    assert set(summaries) == {"coarse", "pmean", "pmean-reversed"}
    assert all(r["median_sync_s"] > 0 for r in summaries.values())


def test_demo_has_no_data_dir(tmp_path):
    """The demo's data are synthetic only: the shared CLI leaves --data-dir out."""
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "demo" / "main.py"), "--data-dir", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2 and "unrecognized arguments: --data-dir" in result.stderr


@pytest.mark.parametrize(
    "name, workers, proxies, on_mesh",
    [
        ("flax_mnist_linen", None, None, False),
        ("flax_mnist_nnx", 1, None, False),
        ("flax_mnist_linen", None, None, True),
        ("flax_mnist_nnx", 1, None, True),
    ],
)
def test_flax_mnist_runs(name, workers, proxies, on_mesh, tmp_path):
    """Flax's MNIST examples (Linen, NNX): Flax's step and the coarse one, two steps each.
    The NNX one is Flax's as written (BatchNorm, Dropout, an nnx.Rngs passed to the loss):
    on one worker it draws Flax's dropout masks and normalizes Flax's batch, so the losses
    are equal (several workers match only to the dropout noise floor:
    tests/test_flax_nnx_mnist.py). With ``--state-on-mesh`` the train state is placed on
    the coarse mesh, replicated, as jax's and flax's sharding guides do: Linen's jitted
    ``update_model`` then takes it with the synced step's gradients."""
    more = [] if proxies is None else ["--proxies", str(proxies)]
    more += [] if workers is None else ["--workers", str(workers)]
    more += ["--state-on-mesh"] if on_mesh else []
    result = run_example(name, tmp_path, "--steps", "2", *more)
    out = result.stdout
    assert "final loss: flax" in out, out
    # Two steps: the same losses up to float32 rounding of the split batch.
    rel = float(out.split("(relative ")[1].split(")")[0])
    assert rel < 1e-5, out
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {r["impl"] for r in records} == {"flax", "coarse"}
