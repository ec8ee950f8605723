"""The whole sync protocol on each device backend, outside XLA (ffi/lab/sync_selftest.h),
through the lab extensions (`coarse_jax._lab`).

p threads run exactly what the workers' custom calls run, in a step's program
order (push, proxy ring, worker ring, pull; in a value_and_update also the
optimizer count and proxy k's inputs), and the runtime's service runs the
proxies' jobs on the devices it owns for them, for several steps, each a new
session reusing the storage of the one before, with fresh values each step.
On a GPU every member has its own stream, so the CUDA backend's events,
staging buffers, kernels and peer-copy calls race as they would across GPUs;
a single GPU cannot hold an XLA mesh of p + q devices, so this is how the
CUDA path runs there. On CPU the test runs on the module's backend (the
plain one, or under `make test-streams` the stream-semantics one with
chaos), and the streams backend with chaos seeds is run here in a fresh
process too (the backend is chosen when the extension loads).

Oracles: the float64 numpy mean over workers (and, with the proxy
optimizer, float64 sgd with momentum); bitwise equality between the
backends, whose sums run in the same order (the plain backend's one-pass
sums add in the ring's order; the 1/p scale is folded into the same step).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers import gpu_or_skip

from coarse_jax._lab import lab_cpu, lab_cuda

# (p, q, proxy elements, piece, leading elements, route); q divides p.
CASES = [
    (1, 1, 10, 4, 3, "local"),
    (2, 2, 0, 1, 0, "local"),
    (2, 2, 1, 1, 1, "cross"),
    (3, 3, 1000, 128, 7, "cross"),
    (4, 4, 100003, 16384, 1003, "cross"),
    (4, 4, 50000, 4096, 0, "dense"),
    (4, 4, 0, 1, 70001, "local"),
    (4, 2, 30011, 2048, 501, "local"),
    (4, 2, 30011, 2048, 501, "cross"),
    (6, 3, 20000, 1500, 99, "dense"),
    (4, 1, 9000, 1000, 13, "local"),
    (8, 8, 40000, 3000, 4099, "cross"),
]
IDS = [f"p{c[0]}q{c[1]}-{c[2]}x{c[3]}-lead{c[4]}-{c[5]}" for c in CASES]
# (p, q, proxy elements, piece, route, momentum) for the proxy optimizer.
OPT_CASES = [(4, 4, 20011, 4096, "cross", 0.9), (4, 2, 7001, 1024, "local", 0.0)]
OPT_IDS = [f"p{c[0]}q{c[1]}-{c[4]}-m{c[5]}" for c in OPT_CASES]
STEPS = 3


def _values(p, n, steps=STEPS, seed=None):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((steps, p, n)) * rng.uniform(0.1, 10.0)).astype(np.float32)


def _check_mean(out, values):
    steps, p, n = values.shape
    assert out.shape == (steps, p, n)
    want = values.astype(np.float64).mean(axis=1, keepdims=True)
    scale = max(1.0, float(np.abs(values).max(initial=0.0)))
    np.testing.assert_allclose(out, np.broadcast_to(want, out.shape), rtol=0, atol=4e-7 * p * scale)
    # Every worker holds the same bits.
    assert (out == out[:, :1]).all()


def _sgd_oracle(values, params, lr, momentum, proxy):
    w = params.astype(np.float64)
    trace = np.zeros_like(w)
    want = []
    for g in values.astype(np.float64).mean(axis=1):
        trace = g[:proxy] + momentum * trace
        w = w - lr * trace
        want.append(np.concatenate([w, g[proxy:]]))
    return np.stack(want)


def _cpu():
    return lab_cpu()


def _cuda():
    gpu_or_skip()
    return lab_cuda()


@pytest.mark.parametrize("p,q,proxy,piece,lead,route", CASES, ids=IDS)
def test_cpu_sync(p, q, proxy, piece, lead, route):
    cpu = _cpu()
    values = _values(p, proxy + lead)
    _check_mean(cpu.sync_selftest(values, lead, piece, route, q), values)
    assert cpu.live_sessions() == 0


@pytest.mark.parametrize("p,q,proxy,piece,lead,route", CASES[3:6], ids=IDS[3:6])
def test_cpu_sync_push_in_place(p, q, proxy, piece, lead, route):
    # push_in_place: on the plain backend the proxies read the pushes in
    # place (PushesInPlace); on the streams backend it changes nothing.
    cpu = _cpu()
    values = _values(p, proxy + lead)
    out = cpu.sync_selftest(values, lead, piece, route, q, in_place=True)
    _check_mean(out, values)
    np.testing.assert_array_equal(out, cpu.sync_selftest(values, lead, piece, route, q))


@pytest.mark.parametrize("p,q,proxy,piece,route,momentum", OPT_CASES, ids=OPT_IDS)
def test_cpu_proxy_optimizer(p, q, proxy, piece, route, momentum):
    cpu = _cpu()
    lead, lr = 37, 0.05
    values = _values(p, proxy + lead, steps=4)
    params = np.random.default_rng().standard_normal(proxy).astype(np.float32)
    out = cpu.sync_selftest(values, lead, piece, route, q, params, lr, momentum)
    want = _sgd_oracle(values, params, lr, momentum, proxy)
    scale = max(1.0, float(np.abs(values).max()))
    np.testing.assert_allclose(
        out, np.broadcast_to(want[:, None], out.shape), rtol=1e-5, atol=2e-6 * p * scale
    )
    assert (out == out[:, :1]).all()
    assert cpu.live_sessions() == 0


def test_bad_arguments_name_the_fix():
    cpu = _cpu()
    values = _values(4, 10, steps=1)
    with pytest.raises(ValueError, match="proxies dividing them"):
        cpu.sync_selftest(values, 2, 4, "local", 3)
    with pytest.raises(ValueError, match="route must be local, cross or dense"):
        cpu.sync_selftest(values, 2, 4, "ring", 4)
    with pytest.raises(ValueError, match=r"needs params of shape .* = \[8\]"):
        cpu.sync_selftest(values, 2, 4, "local", 4, lr=0.1)


# Runs every case on the extension at argv[1] (loaded on its own, so the
# backend is the one this process's environment names) and saves the results.
SCRIPT = textwrap.dedent(
    """
    import importlib.util, sys
    import numpy as np
    spec = importlib.util.spec_from_file_location("_coarse_lab_cpu", sys.argv[1])
    cpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cpu)
    inputs = np.load(sys.argv[2])
    out = {"backend": np.array(cpu.backend())}
    for key in inputs.files:
        if key.startswith("values"):
            i = key[len("values"):]
            lead, piece, q = (int(x) for x in inputs["args" + i])
            route = str(inputs["route" + i])
            out["out" + i] = cpu.sync_selftest(inputs[key], lead, piece, route, q)
    v, prm = inputs["opt_values"], inputs["opt_params"]
    out["opt"] = cpu.sync_selftest(v, 37, 4096, "cross", 4, prm, 0.05, 0.9)
    assert cpu.live_sessions() == 0
    np.savez(sys.argv[3], **out)
    """
)


def test_streams_backend_with_chaos_matches_cpu_bitwise(tmp_path: Path):
    cpu = _cpu()
    inputs = {}
    for i, (p, q, proxy, piece, lead, route) in enumerate(CASES[2:10]):
        inputs[f"values{i}"] = _values(p, proxy + lead, seed=i)
        inputs[f"args{i}"] = np.array([lead, piece, q])
        inputs[f"route{i}"] = np.array(route)
    inputs["opt_values"] = _values(4, 20011 + 37, steps=3, seed=99)
    inputs["opt_params"] = np.random.default_rng(98).standard_normal(20011).astype(np.float32)
    np.savez(tmp_path / "in.npz", **inputs)
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    runs = {}
    for name, env in [
        ("cpu", {"COARSE_JAX_BACKEND": "cpu"}),
        ("streams1", {"COARSE_JAX_BACKEND": "streams", "COARSE_JAX_STREAM_CHAOS": "1"}),
        ("streams7", {"COARSE_JAX_BACKEND": "streams", "COARSE_JAX_STREAM_CHAOS": "7"}),
    ]:
        full = dict(os.environ, **env)
        if name == "cpu":
            full.pop("COARSE_JAX_STREAM_CHAOS", None)
        subprocess.run(
            [
                sys.executable,
                str(script),
                cpu.__file__,
                str(tmp_path / "in.npz"),
                str(tmp_path / f"{name}.npz"),
            ],
            env=full,
            check=True,
            timeout=600,
            cwd=tmp_path,
        )
        runs[name] = dict(np.load(tmp_path / f"{name}.npz"))
    assert str(runs["cpu"]["backend"]) == "cpu"
    assert str(runs["streams1"]["backend"]) == "streams"
    for i in range(8):
        _check_mean(runs["cpu"][f"out{i}"], inputs[f"values{i}"])
    for name in ("streams1", "streams7"):
        for key, value in runs["cpu"].items():
            if key != "backend":
                np.testing.assert_array_equal(runs[name][key], value, err_msg=f"{name}: {key}")


@pytest.mark.parametrize("p,q,proxy,piece,lead,route", CASES, ids=IDS)
def test_cuda_sync_matches_cpu_bitwise(p, q, proxy, piece, lead, route):
    cuda = _cuda()
    values = _values(p, proxy + lead, steps=4)
    out = cuda.sync_selftest(values, lead, piece, route, q)
    _check_mean(out, values)
    np.testing.assert_array_equal(out, _cpu().sync_selftest(values, lead, piece, route, q))
    assert cuda.live_sessions() == 0


@pytest.mark.parametrize("p,q,proxy,piece,route,momentum", OPT_CASES, ids=OPT_IDS)
def test_cuda_proxy_optimizer_matches_cpu_bitwise(p, q, proxy, piece, route, momentum):
    cuda = _cuda()
    values = _values(p, proxy + 37, steps=4)
    params = np.random.default_rng().standard_normal(proxy).astype(np.float32)
    args = (values, 37, piece, route, q, params, 0.05, momentum)
    out = cuda.sync_selftest(*args)
    # Not bitwise: nvcc contracts the update's multiply-adds into FMAs (the
    # sums of the mean are plain adds and stay bitwise, see above).
    np.testing.assert_allclose(out, _cpu().sync_selftest(*args), rtol=1e-6, atol=1e-6)
    want = _sgd_oracle(values, params, 0.05, momentum, proxy)
    np.testing.assert_allclose(out, np.broadcast_to(want[:, None], out.shape), rtol=1e-5, atol=1e-4)


def test_cuda_sync_many_steps_new_values():
    # Storage reused across sessions with different inputs: a step that read
    # the previous step's data (a missing wait) would show here.
    cuda = _cuda()
    values = _values(4, 65537 + 999, steps=20)
    _check_mean(cuda.sync_selftest(values, 999, 8192, "cross", 4), values)
