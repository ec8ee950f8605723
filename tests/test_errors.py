"""Errors a user can act on, and waits that fail instead of hanging."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coarse_jax as coarse


def test_value_and_grad_outside_sync():
    with pytest.raises(RuntimeError, match=r"outside a coarse\.sync step"):
        coarse.value_and_grad(lambda p: jnp.sum(p))(jnp.ones(3))
    with pytest.raises(RuntimeError, match=r"outside a coarse\.sync step"):
        coarse.all_reduce(jnp.ones(3))


def test_unusable_device_counts():
    with pytest.raises(ValueError, match="workers=5, proxies=5 needs 10 devices"):
        coarse.make_mesh(workers=5)
    with pytest.raises(ValueError, match="even number"):
        coarse.make_mesh(devices=jax.devices()[:3])
    with pytest.raises(ValueError, match="positive int"):
        coarse.make_mesh(workers=0)


def test_mesh_without_the_two_axes():
    flat = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
    with pytest.raises(ValueError, match=r"axes \('tier', 'data'\)"):
        coarse.sync(lambda b: b, mesh=flat)


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.bool_])
def test_integer_and_boolean_gradient_leaves(dtype):
    mesh = coarse.make_mesh(workers=2)

    @coarse.sync(mesh)
    def step(params, batch):
        return coarse.value_and_grad(lambda p, b: jnp.sum(p["w"] * b) + 0.0 * jnp.sum(p["n"]))(
            params, batch
        )

    params = {"n": jnp.ones(3, dtype), "w": jnp.ones(3)}
    with pytest.raises(
        TypeError, match=r"\['n'\] of argument 0 has dtype (int32|bool); only float32"
    ):
        step(params, jnp.ones((2, 3)))


def test_tree_changes_between_calls_retrace_as_jit_does():
    mesh = coarse.make_mesh(workers=2)

    @coarse.sync(mesh)
    def step(params, batch):
        return coarse.value_and_grad(lambda p, b: jnp.sum(jax.tree.leaves(p)[0] * b))(params, batch)

    step({"w": jnp.ones(3)}, jnp.ones((2, 3)))
    _, grads = step({"w": jnp.ones(3), "x": jnp.ones(3)}, jnp.ones((2, 3)))
    assert set(grads) == {"w", "x"}
    np.testing.assert_array_equal(grads["w"], np.full(3, 1.0))
    _, grads = step({"w": jnp.ones(4)}, 2 * jnp.ones((2, 4)))
    np.testing.assert_array_equal(grads["w"], np.full(4, 2.0))
    assert step.stats()["compiled"] == 3


def test_tree_changes_refused_where_the_proxies_hold_state():
    mesh = coarse.make_mesh(workers=2)
    opt = coarse.optim.sgd(0.1)

    @coarse.sync(mesh)
    def step(params, batch):
        f = lambda p, b: jnp.sum(jax.tree.leaves(p)[0] * b)  # noqa: E731
        return coarse.value_and_update(f, opt)(params, batch)

    step({"w": jnp.ones(3)}, jnp.ones((2, 3)))
    with pytest.raises(ValueError, match=r"argument 0: new leaves: \['extra'\].*value_and_update"):
        step({"w": jnp.ones(3), "extra": jnp.ones(3)}, jnp.ones((2, 3)))
    with pytest.raises(ValueError, match=r"changed: \['w'\] float32\[3\] -> float32\[4\]") as err:
        step({"w": jnp.ones(4)}, jnp.ones((2, 4)))
    assert len(str(err.value)) < 700  # the leaves that differ, not two whole trees


def test_batch_not_divisible():
    mesh = coarse.make_mesh(workers=4)
    step = coarse.sync(lambda b: coarse.all_reduce(jnp.sum(b)), mesh=mesh)
    with pytest.raises(ValueError, match="divisible by the 4 workers"):
        step(jnp.ones((6, 2)))


@pytest.mark.timeout(120)  # a hang guard: the 1 s timeout must fire, not wait forever
def test_missing_arrival_times_out_with_a_named_error():
    # xla_below_bytes=0: the tree is small enough for the latency route
    # (XLA's psum); the dropped push is the proxies' own.
    from coarse_jax import _ffi

    mesh = coarse.make_mesh(workers=4)
    cfg = coarse.Config(timeout_s=1.0, shard_bytes=256, xla_below_bytes=0)

    @coarse.sync(mesh, config=cfg)
    def step(params, batch):
        return coarse.value_and_grad(lambda p, b: jnp.sum((b @ p["w"]) ** 2))(params, batch)

    params = {"w": jnp.ones((8, 16))}
    batch = jnp.ones((8, 8))
    jax.block_until_ready(step(params, batch))  # compile; a healthy step
    _ffi.inject_dropped_push(1)
    with pytest.raises(
        Exception,
        match=r"proxy 1 \(tier=1, data=1\) timed out after 1.000 s at step 2 "
        r"waiting for worker\(s\) 1 to push tensor '(loss|grads\['w'\])'",
    ):
        jax.block_until_ready(step(params, batch))
    # The failure does not poison later steps.
    _, grads = step(params, batch)
    np.testing.assert_allclose(
        grads["w"], jax.grad(lambda p: jnp.sum((batch[:2] @ p["w"]) ** 2))(params)["w"], rtol=1e-6
    )


# (workers, proxies), then the workers to drop one at a time: the first and
# last of a group, so a message that names the group instead of the missing
# worker fails. Proxy k serves workers k*g .. k*g + g - 1 (g = 4 / proxies).
@pytest.mark.parametrize(
    "proxies, dropped",
    [(4, (0, 3)), (1, (0, 3, 1)), (2, (2, 3, 0))],
    ids=["1:1", "4:1", "4:2"],
)
@pytest.mark.timeout(180)
def test_a_timeout_names_exactly_the_worker_whose_push_is_missing(proxies, dropped):
    from coarse_jax import _ffi

    mesh = coarse.make_mesh(workers=4, proxies=proxies)
    cfg = coarse.Config(timeout_s=1.0, shard_bytes=256, xla_below_bytes=0)

    @coarse.sync(mesh, config=cfg)
    def step(params, batch):
        return coarse.value_and_grad(lambda p, b: jnp.sum((b @ p["w"]) ** 2))(params, batch)

    params = {"w": jnp.ones((8, 16))}
    batch = jnp.ones((8, 8))
    jax.block_until_ready(step(params, batch))  # compile; a healthy step
    group = 4 // proxies
    for w in dropped:
        _ffi.inject_dropped_push(w)
        with pytest.raises(Exception, match="timed out") as caught:
            jax.block_until_ready(step(params, batch))
        message = str(caught.value)
        k = w // group
        shared = "" if group == 1 else f", shared by workers {k * group}..{k * group + group - 1}"
        # The proxy the worker is routed to waits for it alone, and says how
        # many of its group's pushes arrived.
        found = re.search(
            r"proxy (\d+) \(tier=1, data=[\d.]+(, shared by workers [\d.]+)?\) timed out after "
            r"1\.000 s at step \d+ waiting for worker\(s\) ([\d, ]+) to push tensor '[^']+'"
            r"(?: \[shard \d+/\d+\])?, piece \d+ \((\d+) of (\d+) arrived\)",
            message,
        )
        assert found, message
        assert found.group(1) == str(k), message
        assert (found.group(2) or "") == shared, message
        assert found.group(3) == str(w), message
        assert (found.group(4), found.group(5)) == (str(group - 1), str(group)), message
    # The failures do not poison later steps.
    _, grads = step(params, batch)
    np.testing.assert_allclose(
        grads["w"], jax.grad(lambda p: jnp.sum((batch[:2] @ p["w"]) ** 2))(params)["w"], rtol=1e-6
    )


def test_gpu_errors_name_the_missing_piece_and_the_fix(monkeypatch):
    from coarse_jax import _ffi

    # As if built with CUDA (the wheels hold the CPU extension only).
    monkeypatch.setattr(_ffi.extension, "_coarse_cuda", object())
    with pytest.raises(
        NotImplementedError, match=r"coarse_probe has no CUDA implementation.*Topology"
    ):
        _ffi.check_gpu_target("coarse_probe", "gpu", " profile a CPU mesh or an emulated Topology")
    _ffi.check_gpu_target("coarse_probe", "cpu")  # nothing to say on CPU
    monkeypatch.setattr(_ffi.extension, "_coarse_cuda", None)
    with pytest.raises(
        RuntimeError, match=r"built without its CUDA extension.*COARSE_JAX_ENABLE_CUDA=ON"
    ):
        _ffi.check_gpu_target("coarse_push", "gpu")
    monkeypatch.setattr(coarse.kernels, "_platform", lambda: "gpu")
    with pytest.raises(RuntimeError, match="built without its CUDA extension"):
        coarse.kernels.reduce(jnp.ones(3))


def _vg_step(mesh):
    @coarse.sync(mesh)
    def step(params, batch):
        return coarse.value_and_grad(lambda p, b: jnp.sum(p * b))(params, batch)

    return step


def test_vmap_is_refused_at_trace_time():
    """vmap over a step, or over a coarse call inside one, fails while tracing, naming vmap."""
    mesh = coarse.make_mesh(workers=2)
    batch = jnp.ones((4, 3))
    with pytest.raises(TypeError, match=r"traced under jax\.vmap.*Fix: vmap the per-example"):
        jax.vmap(_vg_step(mesh), in_axes=(0, None))(jnp.ones((5, 3)), batch)

    @coarse.sync(mesh)
    def vmapped_inside(params, batch):
        vg = coarse.value_and_grad(lambda p, b: jnp.sum(p * b))
        return jax.vmap(vg, in_axes=(0, None))(params, batch)

    with pytest.raises(TypeError, match=r"coarse[._]\w+ was traced under jax\.vmap"):
        vmapped_inside(jnp.ones((5, 3)), batch)

    @coarse.sync(mesh)
    def reduce_rows(x):
        return jax.vmap(coarse.all_reduce)(x)

    with pytest.raises(TypeError, match=r"traced under jax\.vmap"):
        reduce_rows(jnp.ones((4, 3)))
    # Nothing ran, so nothing is left waiting: the same mesh still works.
    loss, grads = _vg_step(mesh)(jnp.ones(3), batch)
    assert float(loss) == 6.0
    np.testing.assert_array_equal(np.asarray(grads), np.ones(3) * 2)


@pytest.mark.parametrize("mode", ["ffi", "reference"])
def test_differentiating_a_coarse_call_names_coarse_jax_and_the_fix(mode):
    """jax.grad over a step, or through coarse.all_reduce inside one, fails while tracing
    (ffi) with what to use instead; a stop_gradient'ed metric is reduced as usual."""
    mesh = coarse.make_mesh(workers=2)
    batch = jnp.ones((4, 3))
    cfg = coarse.Config(mode=mode)

    @coarse.sync(mesh, config=cfg)
    def grad_through_all_reduce(params, batch):
        return jax.grad(lambda p: coarse.all_reduce(jnp.sum(p * batch)))(params)

    @coarse.sync(mesh, config=cfg)
    def metric(params, batch):  # a metric reduced inside a differentiated function
        def loss(p):
            value = jnp.sum(p * batch)
            return value + 0.0 * coarse.all_reduce(jax.lax.stop_gradient(value))

        return coarse.all_reduce(jax.grad(loss)(params)), coarse.all_reduce(loss(params))

    grads, m = metric(jnp.ones(3), batch)
    # jax.grad of invariant params inside the step is the gradient of the workers' mean
    # loss (as under jit; not jax's sum over workers): 2 rows of ones per worker.
    np.testing.assert_array_equal(np.asarray(grads), np.ones(3) * 2)
    assert float(m) == 6.0
    if mode == "reference":
        return  # pure JAX: differentiable, as psum is
    fix = r"coarse_jax: coarse[._]\w+ was differentiated.*Fix: take gradients inside the step"
    with pytest.raises(TypeError, match=fix):
        grad_through_all_reduce(jnp.ones(3), batch)
    with pytest.raises(TypeError, match=fix):
        jax.grad(lambda p: _vg_step(mesh)(p, batch)[0])(jnp.ones(3))
    # Nothing ran, so nothing is left waiting: the same mesh still works.
    loss, _ = _vg_step(mesh)(jnp.ones(3), batch)
    assert float(loss) == 6.0


@pytest.mark.parametrize("timeout", [0, -1.0, float("inf"), float("nan"), 1e20, True])
def test_timeout_must_be_finite_and_positive(timeout):
    with pytest.raises(ValueError, match=r"Config.timeout_s: expected seconds in \(0, 604800\]"):
        coarse.Config(timeout_s=timeout)


def test_routes_are_int_pairs_not_truncated():
    with pytest.raises(TypeError, match=r"routes\[0\] is \(1.9, 0.2\).*Fix: name proxies"):
        coarse.Config(routes=((1.9, 0.2), (0, 1)))
    with pytest.raises(ValueError, match=r"routes\[1\] is \(0,\)"):
        coarse.Config(routes=((0, 1), (0,)))
    assert coarse.Config(routes=[[np.int64(1), 0], (0, 1)]).routes == ((1, 0), (0, 1))
    with pytest.raises(
        ValueError,
        match=r"routes\[1\].*0\.\.1 \(the mesh.s 2 proxies\); got \(0, 5\)\. Fix: route worker 1",
    ):
        coarse.diagnostics.plan({"w": jnp.ones(4)}, 2, coarse.Config(routes=((0, 1), (0, 5))))


def test_coarse_call_inside_a_closure_gives_the_right_result():
    """The program spans the workers only: a coarse call inside a function the step
    builds runs on every device of the program, as anywhere in the step."""
    mesh = coarse.make_mesh(workers=2)

    @coarse.sync(mesh)
    def step(x, batch):
        inner = lambda v: coarse.all_reduce(v * batch.sum())  # noqa: E731
        return inner(x)

    batch = jnp.arange(6.0).reshape(2, 3)  # worker sums 3 and 12
    np.testing.assert_allclose(step(jnp.ones(4), batch), np.full(4, 7.5))


def _uniform_cases(x):
    from jax import lax

    data = lax.axis_index("data")

    def synced(v):  # varies per device, as the other branch's value does
        return coarse.all_reduce(v) + v

    return {
        "cond": lambda: lax.cond(data == 0, synced, lambda v: v, x),
        "switch": lambda: lax.switch(data, [synced, lambda v: v * 2], x),
        "while": lambda: lax.while_loop(
            lambda c: c[0] < data + 1, lambda c: (c[0] + 1, synced(c[1])), (0, x)
        )[1],
        # On a per-worker value: workers would disagree on the branch.
        "per-worker value": lambda: lax.cond(
            jnp.sum(x) * data > 0,
            lambda v: coarse.value_and_grad(jnp.sum)(v)[1] + v,
            jnp.sin,
            x,
        ),
    }


@pytest.mark.parametrize("case", ["cond", "switch", "while", "per-worker value"])
def test_coarse_call_that_only_some_devices_run_is_a_type_error(case):
    mesh = coarse.make_mesh(workers=2)

    @coarse.sync(mesh)
    def step(x, batch):
        return coarse.all_reduce(_uniform_cases(x * batch.sum())[case]())

    call = "coarse.value_and_grad" if case == "per-worker value" else "coarse.all_reduce"
    loop = "a lax.while_loop" if case == "while" else r"a lax\.cond / lax\.switch"
    with pytest.raises(
        TypeError,
        match=rf"coarse\.sync\(step\): {call} is traced inside {loop} \(at .*test_errors\.py.*"
        r"varies over the mesh axis 'data'.*Fix: call it outside the conditional or loop",
    ):
        step(jnp.ones(4), jnp.ones((2, 3)))


def test_coarse_call_under_a_predicate_every_device_shares_runs():
    from jax import lax

    mesh = coarse.make_mesh(workers=2)

    @coarse.sync(mesh)
    def step(x, batch):
        mean = coarse.all_reduce(jnp.sum(batch))  # the same on every device
        return lax.cond(mean > 0, lambda v: coarse.all_reduce(v * mean), lambda v: -v, x)

    batch = jnp.arange(6.0).reshape(2, 3)
    np.testing.assert_allclose(step(jnp.ones(4), batch), np.full(4, 7.5))


_MISSING_PUSH_THEN_PSUM = """
import os, sys
os.environ["XLA_FLAGS"] = (
    "--xla_force_host_platform_device_count=8 "
    # XLA:CPU's rendezvous gives up (and aborts the process) after 2 s here
    # (40 s by default), shorter than the runtime's wait (3 s): coarse_jax
    # must still report first, and nothing may abort.
    "--xla_cpu_collective_call_warn_stuck_timeout_seconds=1 "
    "--xla_cpu_collective_call_terminate_timeout_seconds=2"
)
import jax, jax.numpy as jnp
from jax import lax
import coarse_jax as coarse
from coarse_jax import _ffi

mesh = coarse.make_mesh(workers=2)
for dependent in (True, False):
    @coarse.sync(mesh, config=coarse.Config(timeout_s=3.0, xla_below_bytes=0))
    def step(x, batch):
        y = coarse.all_reduce(x)
        return y, lax.psum(y.sum() if dependent else batch.sum(), "data")

    x, batch = jnp.ones(1000), jnp.ones((2, 3))
    jax.block_until_ready(step(x, batch))
    _ffi.inject_dropped_push(1)
    try:
        jax.block_until_ready(step(x, batch))
    except Exception as e:
        print("dependent" if dependent else "independent", "->", e)
    else:
        sys.exit("no error")
    jax.block_until_ready(step(x, batch))  # the next step is healthy
"""


@pytest.mark.timeout(120)
def test_missing_push_then_an_xla_collective_reports_the_coarse_error(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "missing_push.py"
    script.write_text(_MISSING_PUSH_THEN_PSUM)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "COARSE_JAX_MODE")}
    run = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert run.returncode == 0, (run.returncode, run.stdout[-2000:], run.stderr[-4000:])
    for which in ("dependent", "independent"):
        assert re.search(
            rf"^{which} -> .*proxy 1 \(tier=1, data=1\) timed out after 3\.000 s at step \d+ "
            r"waiting for worker\(s\) 1 to push",
            run.stdout,
            flags=re.M,
        ), run.stdout
