"""Across hosts, for real: 2 (and 3) jax processes x 8 CPU devices (gloo), by coarse_jax.launch.

Each test runs ``python -m coarse_jax.launch --processes 2 --devices-per-process 8
tests/multihost_script.py SCENARIO`` in a subprocess with a timeout; the
processes check their own results (an assertion fails the launch) and print
``RESULT`` lines compared here across processes.
"""

import json
import os
import pathlib
import re
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import make_batch, mlp_init, mlp_loss
from jax.sharding import Mesh

import coarse_jax as coarse
from coarse_jax.mesh import HOST_AXES

HERE = pathlib.Path(__file__).parent
SCRIPT = HERE / "multihost_script.py"
LIMIT_S = 150  # a hang detector: quiet, a scenario takes 10-45 s; loaded (load 15), up to 97 s


def _launch(tmp_path, *args, processes=2, devices=8, limit=LIMIT_S, env=None):
    cmd = [sys.executable, "-m", "coarse_jax.launch", "--processes", str(processes)]
    if devices:
        cmd += ["--devices-per-process", str(devices)]
    cmd += ["--timeout", str(limit - 10), *map(str, args)]
    # From tmp_path: the installed package is imported, not ./coarse_jax.
    start = time.monotonic()
    proc = subprocess.run(
        cmd,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=limit,
        check=False,
        env=None if env is None else {**os.environ, **env},
    )
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def _scenario(tmp_path, name, *args, processes=2, proxies=None, proxies_on=None):
    """Runs scenario ``name`` of the script; every process must exit 0 and report it ok.
    ``proxies``: per host (default one per worker); ``proxies_on``: make_mesh's (default
    "devices"). Returns the RESULT lines by (name, process)."""
    env = {} if proxies is None else {"COARSE_TEST_PROXIES": str(proxies)}
    if proxies_on is not None:
        env["COARSE_TEST_PROXIES_ON"] = proxies_on
    env = env or None
    code, output, _ = _launch(tmp_path, SCRIPT, name, *args, processes=processes, env=env)
    assert code == 0, output[-6000:]
    r = _results(output)
    assert all(r.get(("ok", i)) == name for i in range(processes)), output[-3000:]
    return r


def _results(output):
    out = {}
    for line in output.splitlines():
        _, sep, payload = line.partition("RESULT ")
        if sep and line.startswith("[p"):
            r = json.loads(payload)
            out[(r["name"], r["process"])] = r["value"]
    return out


# 2 hosts sum by psum over "host", 3 by gather-then-add in host order; one proxy
# shared by the 4 workers of each host (COARSE 4:1).
# Last: 2 proxies per host in host memory (proxies_on="host"), shared by 2 workers each.
@pytest.mark.parametrize(
    "processes, proxies, proxies_on",
    [(2, None, None), (3, None, None), (2, 1, None), (2, 2, "host")],
)
@pytest.mark.timeout(LIMIT_S + 20)
def test_grads_and_all_reduce_equal_float64_mean_over_all_hosts(
    tmp_path, processes, proxies, proxies_on
):
    r = _scenario(tmp_path, "sync", processes=processes, proxies=proxies, proxies_on=proxies_on)
    # Bitwise the same results in every process, for every mode / split.
    assert all(r[("digests", i)] == r[("digests", 0)] for i in range(processes))
    assert set(r[("digests", 0)]) == {"ffi/0", "ffi/416", "reference/0", "reference/416"}


@pytest.mark.timeout(LIMIT_S + 20)
def test_twenty_optax_steps_match_pmean_over_all_workers(tmp_path):
    r = _scenario(tmp_path, "optax")
    assert r[("params_digest", 0)] == r[("params_digest", 1)]
    assert len(r[("losses", 0)]) == 20


# 2 hosts sum by psum over "host", 3 by gather-then-add in host order; 2 proxies per
# host, each shared by 2 workers (COARSE 2:1); last, those 2 in host memory.
@pytest.mark.parametrize(
    "processes, proxies, proxies_on",
    [(2, None, None), (3, None, None), (2, 2, None), (2, 2, "host")],
)
@pytest.mark.timeout(LIMIT_S + 20)
def test_value_and_update_across_hosts_matches_pmean_and_optax(
    tmp_path, processes, proxies, proxies_on
):
    """The proxies of every host update from the mean over all workers (checked in
    each process against lax.pmean + optax: losses, params, optimizer state), every
    host ends bitwise equal, and hosts with different plans are refused, naming them."""
    r = _scenario(tmp_path, "update", processes=processes, proxies=proxies, proxies_on=proxies_on)
    assert all(r[("update_digests", i)] == r[("update_digests", 0)] for i in range(processes))
    assert len(r[("update_digests", 0)]) == 6
    for i in range(processes):
        # Process 0 runs another shard size than the rest.
        others = ", ".join(str(h) for h in range(1, processes)) if i == 0 else "0"
        message = r[("mismatch", i)]
        assert message and "different plans" in message, message
        assert f"host(s) {others} differs" in message, message


@pytest.mark.timeout(LIMIT_S + 20)
def test_snapshots_across_hosts_written_once_and_restored_on_every_host(tmp_path):
    directory = tmp_path / "snapshots"
    r = _scenario(tmp_path, "snapshots", directory)
    assert r[("snapshots", 0)] == r[("snapshots", 1)]
    # Steps 4 and 8 (Snapshots(every=4), 10 steps), one directory each, no partial one left.
    assert sorted(p.name for p in directory.iterdir()) == ["4", "8"]


@pytest.mark.timeout(LIMIT_S + 20)
def test_nnx_batch_statistics_average_over_both_hosts(tmp_path):
    r = _scenario(tmp_path, "nnx")
    assert r[("nnx_digest", 0)] == r[("nnx_digest", 1)]


@pytest.mark.timeout(LIMIT_S + 20)
def test_missing_host_fails_the_other_within_the_timeout_naming_it(tmp_path):
    code, output, seconds = _launch(tmp_path, SCRIPT, "missing")
    r = _results(output)
    err = r.get(("error", 0))
    assert err is not None, output[-6000:]
    assert "process 1 of 2 did not arrive" in err["message"]
    assert "timeout_s=5" in err["message"]
    # Config(timeout_s=5): failed after the timeout, long before the launch's limit.
    assert 5 <= err["seconds"] < 30, err
    assert code == 3, output[-3000:]  # process 0's exit code, propagated
    assert "[launch] process 0 exited with code 3" in output
    assert seconds < 60


# COARSE 4:1 on each host: one proxy shared by the host's 4 workers. Host 0
# loses worker 0's push, host 1 worker 3's (first and last of the group).
@pytest.mark.timeout(LIMIT_S + 20)
def test_a_lost_push_on_each_host_names_exactly_that_worker(tmp_path):
    env = {"COARSE_TEST_PROXIES": "1"}
    code, output, _ = _launch(tmp_path, SCRIPT, "dropped", env=env)
    r = _results(output)
    for i, dropped in ((0, 0), (1, 3)):
        err = r.get(("error", i))
        assert err is not None and err["message"], output[-6000:]
        assert err["dropped"] == dropped
        found = re.search(
            r"proxy 0 \(tier=1, data=0\.\.3, shared by workers 0\.\.3\) timed out after "
            r"2\.000 s at step \d+ waiting for worker\(s\) ([\d, ]+) to push .*?"
            r"\((\d+) of (\d+) arrived\)",
            err["message"],
        )
        assert found, err["message"]
        assert found.groups() == (str(dropped), "3", "4"), err["message"]
    assert code == 3, output[-3000:]


@pytest.mark.timeout(60)
def test_launch_prefixes_output_stops_the_rest_and_propagates_the_exit_code(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "import os, pathlib, sys, time\n"
        "pid = int(os.environ['COARSE_JAX_PROCESS_ID'])\n"
        "print('hello from', pid, os.environ['COARSE_JAX_NUM_PROCESSES'],\n"
        "      os.environ['COARSE_JAX_COORDINATOR'].startswith('127.0.0.1:'),\n"
        "      os.environ['XLA_FLAGS'], sys.argv[1:], flush=True)\n"
        # Process 1 fails only once process 0 has said hello: on a busy machine
        # process 0 may start late, and the launcher stops it when 1 exits.
        "said = pathlib.Path(sys.argv[0]).with_name('p0_said_hello')\n"
        "if pid == 0:\n"
        "    said.touch()\n"
        "if pid == 1:\n"
        "    deadline = time.monotonic() + 20\n"
        "    while not said.exists() and time.monotonic() < deadline:\n"
        "        time.sleep(0.01)\n"
        "    sys.exit(7)\n"
        "time.sleep(600)\n"
    )
    code, output, seconds = _launch(tmp_path, script, "--flag", "x", devices=3, limit=50)
    assert code == 7, output
    # The launcher appends the device count to the XLA_FLAGS it was given (CI's may hold
    # other flags, e.g. --xla_cpu_max_isa=AVX).
    assert re.search(
        r"\[p0\] hello from 0 2 True (\S+ )*--xla_force_host_platform_device_count=3 "
        r"\['--flag', 'x'\]",
        output,
    ), output
    assert "[p1] hello from 1 2 True" in output
    assert "[launch] process 1 exited with code 7; stopping the rest" in output
    assert seconds < 30  # process 0 was stopped, not waited for

    # --timeout: everything is stopped, exit code 124.
    sleeper = tmp_path / "sleep.py"
    sleeper.write_text("import time\ntime.sleep(600)\n")
    code, output, seconds = _launch(tmp_path, sleeper, devices=None, limit=14)  # --timeout 4
    assert code == 124 and "[launch] timed out after 4 s" in output, output
    assert seconds < 12

    ok = tmp_path / "ok.py"
    ok.write_text("print('done')\n")
    code, output, _ = _launch(tmp_path, ok, devices=None, limit=50)
    assert code == 0 and output.count("done") == 2, output


@pytest.mark.parametrize("leading", [0, 7 * 13 * 4 + 13 * 4])
def test_one_host_mesh_gives_the_two_axis_results_bitwise(leading):
    """A ("host", "tier", "data") mesh of one host, in this process: the inter-host
    step (a sum over one host) and the runtime's in-host hand-out leave every bit
    of the one-host results as they were."""
    devices = np.array(jax.devices()[:8], dtype=object)
    # xla_below_bytes=0: the proxies on both meshes (the plain mesh's auto
    # latency route would give this small tree to XLA; the host mesh's does not).
    cfg = coarse.Config(shard_bytes=64, leading_bytes=leading, xla_below_bytes=0)
    params = mlp_init(jax.random.key(0), (7, 13, 5, 1))
    batch = make_batch(jax.random.key(1), 16, 7, 1)

    def run(mesh):
        @coarse.sync(mesh, config=cfg)
        def step(params, batch):
            loss, grads = coarse.value_and_grad(mlp_loss)(params, batch)
            return loss, grads, coarse.all_reduce(batch["y"].mean(0).astype(jnp.bfloat16))

        return jax.tree.map(np.asarray, step(params, batch))

    two_axes = run(coarse.make_mesh(workers=4))
    one_host = run(Mesh(devices.reshape(1, 2, 4), HOST_AXES))
    for a, b in zip(jax.tree.leaves(two_axes), jax.tree.leaves(one_host), strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
