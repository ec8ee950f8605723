"""The stream-semantics CPU backend (COARSE_JAX_BACKEND=streams, issue 36).

Each case runs in a fresh process, since the backend is chosen once when the
extension loads: the same training under the default backend and under the
streams backend with chaos on must give the same bits. The order of every
sum is the same on both (the default backend's one-pass sums add in the
ring's order; the streams backend runs the ring), so equality is bitwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

TESTS = Path(__file__).resolve().parent

# Trains an MLP with value_and_grad + optax, value_and_update (adamw with
# clipping and a schedule) at 1:1 and value_and_update (adam) on 2:1 and 4:1
# meshes (the CPU backend sums a proxy's clients in one pass, the streams
# backend one client per pass: the same bits), the same with proxies in host
# memory (on the streams backend the GPU data path: pushes as device-to-host
# copies waited for by the proxy's job, pulls gated by its ready flags),
# and all_reduce; saves every result and the active backend's name.
SCRIPT = textwrap.dedent(
    """
    import sys
    import jax, numpy as np, optax
    import coarse_jax as coarse
    from coarse_jax.testing import active_backend
    from helpers import coarse_update_step, make_batch, mlp_init, mlp_loss

    out = {"backend": np.array(active_backend("cpu"))}
    params = mlp_init(jax.random.key(3), (8, 16, 16, 4))
    batches = [make_batch(jax.random.key(100 + i), 16, 8, 4) for i in range(6)]
    sched = optax.warmup_cosine_decay_schedule(0.0, 2e-2, 2, 20)
    cases = [
        ("adamw", coarse.make_mesh(workers=4),
         coarse.optim.adamw(sched, weight_decay=0.05, clip_norm=0.3)),
        ("k2", coarse.make_mesh(workers=4, proxies=2), coarse.optim.adam(1e-2)),
        ("k4", coarse.make_mesh(workers=4, proxies=1), coarse.optim.adam(1e-2)),
        ("host", coarse.make_mesh(workers=4, proxies=4, proxies_on="host"),
         coarse.optim.adamw(sched, weight_decay=0.05, clip_norm=0.3)),
        ("host_k2", coarse.make_mesh(workers=4, proxies=2, proxies_on="host"),
         coarse.optim.adam(1e-2)),
    ]
    for name, mesh, opt in cases:
        step = coarse_update_step(mesh, opt, coarse.Config(shard_bytes=256))
        p = params
        for i, b in enumerate(batches):
            p, loss = step(p, b)
            out[f"{name}_loss{i}"] = np.asarray(loss)
        for j, leaf in enumerate(jax.tree.leaves(p)):
            out[f"{name}_p{j}"] = np.asarray(leaf)

    tx = optax.sgd(0.05)
    for name, mesh in [
        ("grad", coarse.make_mesh(workers=4)),
        ("grad_host", coarse.make_mesh(workers=4, proxies=2, proxies_on="host")),
    ]:

        @coarse.sync(
            mesh, config=coarse.Config(shard_bytes=256, leading_bytes=512, xla_below_bytes=0)
        )
        def grad_step(params, batch):
            loss, grads = coarse.value_and_grad(mlp_loss)(params, batch)
            return loss, grads, coarse.all_reduce(jax.tree.leaves(batch)[0][:1], op="sum")

        p = params
        for i, b in enumerate(batches):
            loss, grads, red = grad_step(p, b)
            p = optax.apply_updates(p, tx.update(grads, tx.init(p))[0])
            out[f"{name}_loss{i}"] = np.asarray(loss)
            out[f"{name}_red{i}"] = np.asarray(red)
        for j, leaf in enumerate(jax.tree.leaves(p)):
            out[f"{name}_p{j}"] = np.asarray(leaf)
    np.savez(sys.argv[1], **out)
    """
)


def _run(tmp_path: Path, name: str, env: dict[str, str]) -> dict[str, np.ndarray]:
    path = tmp_path / f"{name}.npz"
    full = dict(os.environ, **env)
    # tests/ for the helpers; never the repository root, whose ./coarse_jax has no
    # compiled extension (the installed package is the one under test).
    full["PYTHONPATH"] = os.pathsep.join([str(TESTS), full.get("PYTHONPATH", "")])
    full["XLA_FLAGS"] = full.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    full["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(path)],
        env=full,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,  # import the installed package, not ./coarse_jax
    )
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


@pytest.mark.parametrize("seed", ["1", "7"])
def test_streams_with_chaos_give_the_default_backends_bits(tmp_path, seed):
    plain = _run(tmp_path, "cpu", {"COARSE_JAX_BACKEND": "cpu"})
    streams = _run(
        tmp_path, "streams", {"COARSE_JAX_BACKEND": "streams", "COARSE_JAX_STREAM_CHAOS": seed}
    )
    assert str(plain.pop("backend")) == "cpu"
    assert str(streams.pop("backend")) == "streams"
    assert plain.keys() == streams.keys()
    for key in plain:
        np.testing.assert_array_equal(streams[key], plain[key], err_msg=key)


def test_an_unknown_backend_names_the_variable_and_the_choices(tmp_path):
    env = dict(os.environ, COARSE_JAX_BACKEND="gpu", JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", "import coarse_jax"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,  # import the installed package, not ./coarse_jax
    )
    assert proc.returncode != 0
    assert "COARSE_JAX_BACKEND is 'gpu'" in proc.stderr
    assert "'cpu'" in proc.stderr and "'streams'" in proc.stderr


def test_a_chaos_seed_on_the_default_backend_warns_once_naming_the_fix(tmp_path):
    # The extension loaded on its own (the backend is read when it loads).
    from coarse_jax import _coarse_cpu

    script = (
        "import importlib.util, sys, warnings\n"
        "spec = importlib.util.spec_from_file_location('_coarse_cpu', sys.argv[1])\n"
        "cpu = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(cpu)\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    print(cpu.backend(), cpu.backend())\n"
        "for w in caught:\n"
        "    print(w.category.__name__, w.message)\n"
    )
    for backend, warns in [("cpu", True), ("", True), ("streams", False)]:
        env = dict(os.environ, COARSE_JAX_BACKEND=backend, COARSE_JAX_STREAM_CHAOS="5")
        proc = subprocess.run(
            [sys.executable, "-c", script, _coarse_cpu.__file__],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert lines[0] == ("streams streams" if backend == "streams" else "cpu cpu")
        if warns:
            assert len(lines) == 2, lines  # once, though backend() was called twice
            assert lines[1].startswith("UserWarning coarse_jax: COARSE_JAX_STREAM_CHAOS=5 ")
            assert "Set COARSE_JAX_BACKEND=streams" in lines[1]
        else:
            assert len(lines) == 1, lines


def test_a_stream_waits_for_the_hosts_flag_and_gives_up_naming_it():
    # Stream::WaitValue on the host streams, outside a session (in this
    # process: the check makes its own stream, whatever the backend): the
    # upload after the wait copies what the host wrote before the flag, 30 ms
    # after the enqueue; a flag never written fails the stream, naming it.
    from coarse_jax import _coarse_cpu

    err, copied = _coarse_cpu.check_flag_wait(timeout_ms=5000, delay_ms=30, write=True)
    assert (err, copied) == ("", 42.0)
    err, copied = _coarse_cpu.check_flag_wait(timeout_ms=50, delay_ms=0, write=False)
    assert "the check's flag" in err and "flag check stream" in err, err
    assert "timed out after 50 ms" in err and "reach 7 (it holds 0)" in err, err
    assert copied == 0.0  # it gave up and went on: the upload copied the unwritten value
