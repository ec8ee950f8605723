"""Smaller failure paths of the runtime: huge timeouts, the dropped-push hook, malformed
plan attributes, Ctrl-C during a stalled step."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coarse_jax as coarse
from coarse_jax import _ffi


def _vg_step(mesh, cfg):
    @coarse.sync(mesh, config=cfg)
    def step(params, batch):
        return coarse.value_and_grad(lambda p, b: jnp.sum((b @ p["w"]) ** 2))(params, batch)

    return step


def _want(params, batch, workers):
    n = batch.shape[0] // workers
    grads = [
        jax.grad(lambda p, b: jnp.sum((b @ p["w"]) ** 2))(params, batch[i * n : (i + 1) * n])["w"]
        for i in range(workers)
    ]
    return np.mean(np.asarray(grads, np.float64), axis=0)


@pytest.mark.timeout(120)
def test_longest_timeout_does_not_fire_at_once():
    """timeout_s ~1e10 s overflowed the int64-nanosecond deadline: every wait timed out at once.

    Config now stops at a week (test_errors.py checks the refusal of more);
    the runtime also clamps its deadlines, so the longest allowed wait works.
    """
    mesh = coarse.make_mesh(workers=4)
    params, batch = {"w": jnp.ones((8, 16))}, jnp.arange(64.0).reshape(8, 8) / 64
    for timeout_s in (coarse.config.MAX_TIMEOUT_S,):
        step = _vg_step(
            mesh, coarse.Config(timeout_s=timeout_s, shard_bytes=256, xla_below_bytes=0)
        )
        for _ in range(3):
            _, grads = step(params, batch)
            np.testing.assert_allclose(grads["w"], _want(params, batch, 4), rtol=1e-5)


@pytest.mark.timeout(120)
def test_dropped_push_arms_only_the_next_session():
    """A hook armed for worker 3, then a 2-worker step: spent there, never reaching a later mesh."""
    params, batch = {"w": jnp.ones((8, 16))}, jnp.ones((8, 8))
    cfg = coarse.Config(timeout_s=2.0, shard_bytes=256, xla_below_bytes=0)
    small, large = _vg_step(coarse.make_mesh(workers=2), cfg), _vg_step(coarse.make_mesh(4), cfg)
    jax.block_until_ready((small(params, batch), large(params, batch)))  # compiled, healthy
    _ffi.inject_dropped_push(3)
    jax.block_until_ready(small(params, batch))  # no worker 3: nothing dropped, hook spent
    _, grads = large(params, batch)  # healthy: the hook did not stay armed (else: timeout)
    np.testing.assert_allclose(grads["w"], _want(params, batch, 4), rtol=1e-5)
    # Armed for a worker the next mesh has: that step loses the push and times out.
    _ffi.inject_dropped_push(1)
    with pytest.raises(Exception, match=r"timed out after 2.000 s .* worker\(s\) 1 to push"):
        jax.block_until_ready(large(params, batch))
    jax.block_until_ready(large(params, batch))


_SITES = iter(range(1 << 29, 1 << 30))


def _run_push(attrs, bucket, leaves):
    """One coarse_push on one CPU device (worker 0 of a 1-worker mesh), outside shard_map."""
    call = _ffi.CallSite(attrs, next(_SITES), np.array([0, 0]), axes=())
    me = np.array([0, 0], np.int32)

    def f(*xs):
        tok = jnp.zeros((), jnp.float32)
        return _ffi.push(call, me, tok, list(xs), bucket, passthrough=False)[1]

    with jax.default_device(jax.devices("cpu")[0]):
        return jax.block_until_ready(jax.jit(f)(*leaves))


class _Bucket:
    def __init__(self, first_leaf, first_piece, num_pieces):
        self.first_leaf, self.first_piece, self.num_pieces = first_leaf, first_piece, num_pieces


def _plan():
    """One worker; a 3-float leading leaf (the first layer) and a 40-float proxy leaf in one
    piece. Returns the plan and the leaves its one push takes."""
    leaves = [np.ones((3,), np.float32), np.ones((40,), np.float32)]
    plan = coarse.diagnostics.plan(leaves, 1, coarse.Config(shard_bytes=4096, leading_bytes=12))
    assert plan.num_proxy_leaves == 1 and len(plan.pieces) == 1, plan.summary()
    return plan, [leaves[i] for i in plan.proxy_leaves]


def _malformed(plan, **changes):
    attrs = dict(plan.ffi_attrs())
    attrs.update(changes)
    # A new key: the runtime caches parsed plans by it.
    attrs["plan_key"] = np.int64(hash(tuple(sorted(changes))) & ((1 << 62) - 1) | (1 << 61))
    return attrs


@pytest.mark.parametrize(
    "changes,match",
    [
        ({"num_proxy_leaves": np.int64(99)}, r"num_proxy_leaves must be in \[0, 2\].*got 99"),
        ({"num_proxy_leaves": np.int64(-1)}, r"num_proxy_leaves must be in \[0, 2\].*got -1"),
        ({"workers": np.int64(0)}, r"workers must be >= 1"),
        ({"timeout_ms": np.int64(-5)}, r"timeout_ms must be >= 0"),
        ({"piece_dest": np.array([5], np.int64)}, r"piece_dest routes to proxy 5"),
        ({"piece_push": np.array([0, 0], np.int64)}, r"piece_push has 2 entries, piece_nelems 1"),
        ({"piece_push": np.array([-1], np.int64)}, r"piece_push must be >= 0 and non-decreasing"),
        (
            {"segments": np.array([0, 0, 10_000, 0, 0], np.int64)},
            r"segment 0 .*leaf_off \+ len exceeds the leaf's",
        ),
        (
            {"segments": np.array([0, -4, 4, 0, 0], np.int64)},
            r"segment 0 .*leaf_off, len and piece_off must be >= 0",
        ),
        ({"segments": np.array([1, 0, 1, 0, 0], np.int64)}, r"segment 0 .*leaf outside \[0, 1\)"),
    ],
)
def test_malformed_plan_attributes_are_invalid_argument(changes, match):
    plan, pushed = _plan()
    with pytest.raises(Exception, match="malformed plan: " + match):
        _run_push(_malformed(plan, **changes), _Bucket(0, 0, 1), pushed)


@pytest.mark.parametrize(
    "bucket,match",
    [
        ((0, 1, 1), r"first_piece=1, num_pieces=1 are outside the plan's 1 pieces"),
        ((0, -1, 1), r"first_piece=-1"),
        ((0, 0, -1), r"num_pieces=-1"),
        ((1, 0, 1), r"first_leaf=1 with 1 leaves is outside the plan's 1 proxy leaves"),
    ],
)
def test_push_bucket_attributes_are_range_checked(bucket, match):
    plan, pushed = _plan()
    with pytest.raises(Exception, match="coarse_push: .*" + match):
        _run_push(plan.ffi_attrs(), _Bucket(*bucket), pushed)


_STALL_SCRIPT = textwrap.dedent(
    """
    import signal, sys, time
    import jax, jax.numpy as jnp
    import coarse_jax as coarse
    from coarse_jax import _ffi

    timeout_s, custom_handler = float(sys.argv[1]), sys.argv[2] == "custom"
    # Python's own default, even if this process was started with SIGINT
    # ignored (as a background job of a non-interactive shell is).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    mesh = coarse.make_mesh(workers=2)
    cfg = coarse.Config(timeout_s=timeout_s, xla_below_bytes=0)  # the proxies' wait
    step = coarse.sync(
        lambda p, b: coarse.value_and_grad(lambda p, b: jnp.sum(p * jnp.sum(b)))(p, b),
        mesh=mesh, config=cfg,
    )
    x, b = jnp.ones(8), jnp.ones((2, 3))
    jax.block_until_ready(step(x, b))  # compiled, healthy
    if custom_handler:  # a program that stops after the current step on Ctrl-C
        signal.signal(signal.SIGINT, lambda *a: print("HANDLER", flush=True))
    _ffi.arm_interrupt_hook()
    _ffi.inject_dropped_push(1)
    print("READY", flush=True)
    t0 = time.monotonic()
    try:
        jax.block_until_ready(step(x, b))
    except KeyboardInterrupt:
        print(f"KEYBOARDINTERRUPT after {time.monotonic() - t0:.2f} s", flush=True)
        sys.exit(3)
    except Exception as e:
        print(f"ERROR after {time.monotonic() - t0:.2f} s: {e}", flush=True)
        sys.exit(4)
    print("NO ERROR", flush=True)
    """
)


def _stall_and_interrupt(tmp_path, timeout_s, handler):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    proc = subprocess.Popen(
        [sys.executable, "-c", _STALL_SCRIPT, str(timeout_s), handler],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,  # import the installed package, not ./coarse_jax
    )
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("READY"):
                break
        else:
            pytest.fail("the script never got ready:\n" + "".join(lines))
        time.sleep(2.0)  # the step is stalled on the dropped push by now
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        return time.monotonic() - sent, proc.returncode, "".join(lines) + out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.timeout(120)
def test_ctrl_c_stops_a_stalled_step_at_once(tmp_path):
    """Ctrl-C while a step waits 60 s for a lost push: the process stops within seconds."""
    elapsed, rc, out = _stall_and_interrupt(tmp_path, 60.0, "default")
    assert elapsed < 10, out
    # KeyboardInterrupt, never the abandoned step's error first (the runtime
    # waits for Python to take the SIGINT: ffi/runtime/interrupt.h).
    assert rc == 3 and "KEYBOARDINTERRUPT" in out, out


@pytest.mark.timeout(120)
def test_ctrl_c_with_a_custom_handler_lets_the_step_run(tmp_path):
    """A program with its own SIGINT handler keeps control: the step is not abandoned (here it
    then times out, since its push is lost), and the handler runs."""
    _, rc, out = _stall_and_interrupt(tmp_path, 4.0, "custom")
    assert rc == 4 and "timed out after 4.000 s" in out, out
    assert "interrupted" not in out and "HANDLER" in out, out
