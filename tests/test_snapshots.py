"""Snapshots of the proxies' state: in memory, on disk, restored.

The disk tests run training in subprocesses that are killed with SIGKILL (no
atexit, no flush) and restarted from the checkpoint directory; the oracle is
the same training uninterrupted, compared bitwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from helpers import assert_tree_close, coarse_update_step, make_batch, mlp_init, mlp_loss

import coarse_jax as coarse

SIZES = (8, 16, 16, 4)

_TRAIN = textwrap.dedent(
    """
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, numpy as np
    import coarse_jax as coarse

    directory, total, kill_after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    every_write = sys.argv[4] == "1"  # wait for each snapshot's write (deterministic tests)
    every = int(sys.argv[5])  # Snapshots.every
    kill_at_once = sys.argv[6] == "1"  # kill after step kill_after without waiting for the writer
    if os.environ.get("KILL_BEFORE_RENAME"):  # this test's own switch, passed to the hook
        from coarse_jax.testing import kill_before_rename
        kill_before_rename(int(os.environ["KILL_BEFORE_RENAME"]))

    def loss_fn(params, batch):
        h = np.float32(1) * jax.numpy.tanh(batch["x"] @ params["w1"] + params["b1"])
        return jax.numpy.mean((h @ params["w2"] - batch["y"]) ** 2)

    def batch(i):  # the data position is the optimizer step
        rng = np.random.default_rng(100 + i)
        return {"x": rng.standard_normal((8, 8), np.float32),
                "y": rng.standard_normal((8, 4), np.float32)}

    mesh = coarse.make_mesh(workers=2)
    snaps = coarse.Snapshots(every=every, directory=directory, keep=2)
    opt = coarse.optim.adamw(1e-2, weight_decay=0.01, clip_norm=1.0)

    @coarse.sync(mesh, snapshots=snaps)
    def step(params, batch):
        loss, params = coarse.value_and_update(loss_fn, opt)(params, batch)
        return params, loss

    if os.path.isdir(directory) and any(n.isdigit() for n in os.listdir(directory)):
        params = step.restore(directory)
        start = step.restored_count
    else:
        rng = np.random.default_rng(0)
        params = {"w1": rng.standard_normal((8, 16), np.float32) * 0.3,
                  "b1": np.zeros(16, np.float32),
                  "w2": rng.standard_normal((16, 4), np.float32) * 0.3}
        start = 0
    print("START", start, flush=True)
    for i in range(start, total):
        params, loss = step(params, batch(i))
        if every_write:
            step.wait_snapshots()
        if i + 1 == kill_after:  # kill -9, by default once the newest snapshot is on disk
            jax.block_until_ready(params)
            if not kill_at_once:
                step.wait_snapshots()
            print("STATS", step.stats(), flush=True)
            os.kill(os.getpid(), 9)
    step.wait_snapshots()
    np.save(os.path.join(directory, "final.npy"),
            np.concatenate([np.asarray(params[k]).ravel() for k in sorted(params)]))
    """
)


def _run(directory, total, kill_after=0, env_extra=None, every_write=False, every=3, at_once=False):
    env = dict(os.environ, JAX_PLATFORMS="cpu", **(env_extra or {}))
    return subprocess.run(
        [
            sys.executable,
            "-c",
            _TRAIN,
            str(directory),
            str(total),
            str(kill_after),
            str(int(every_write)),
            str(every),
            str(int(at_once)),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=directory.parent,
        check=False,
    )


def _final(directory):
    return np.load(os.path.join(directory, "final.npy"))


@pytest.mark.timeout(600)
def test_kill_9_then_restart_from_the_directory_is_bitwise_uninterrupted(tmp_path):
    whole = _run(tmp_path / "whole", 14)
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = _run(tmp_path / "killed", 14, kill_after=10)
    assert killed.returncode == -9, killed.stderr[-3000:]
    steps = sorted(int(n) for n in os.listdir(tmp_path / "killed") if n.isdigit())
    assert steps and steps[-1] == 9 and len(steps) <= 2, steps  # taken when step 10 started
    resumed = _run(tmp_path / "killed", 14)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"START {steps[-1]}" in resumed.stdout
    np.testing.assert_array_equal(_final(tmp_path / "killed"), _final(tmp_path / "whole"))


@pytest.mark.timeout(600)
def test_kill_during_a_write_restarts_from_the_previous_checkpoint(tmp_path):
    whole = _run(tmp_path / "whole", 10)
    assert whole.returncode == 0, whole.stderr[-3000:]
    d = tmp_path / "crash"
    crashed = _run(d, 10, env_extra={"KILL_BEFORE_RENAME": "6"}, every_write=True)
    assert crashed.returncode == -9, crashed.stderr[-3000:]
    names = os.listdir(d)
    assert "3" in names and "6" not in names, names  # 6 was written, never made complete
    assert any(n.startswith("6.partial-") for n in names), names
    resumed = _run(d, 10)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "START 3" in resumed.stdout
    np.testing.assert_array_equal(_final(d), _final(tmp_path / "whole"))
    # A checkpoint coarse_jax wrote opens with plain orbax.
    latest = max(int(n) for n in os.listdir(d) if n.isdigit())
    tree = ocp.StandardCheckpointer().restore(str(d / str(latest)))
    assert int(tree["step"]) == latest
    assert set(tree["opt_state"]) == {"mu", "nu"}
    assert tree["params"]["w1"].shape == (8, 16) and tree["params"]["w1"].dtype == np.float32


@pytest.mark.timeout(600)
def test_kill_9_with_steps_faster_than_writes_loses_at_most_two_intervals(tmp_path):
    """CheckFreq's bound: Snapshots(every=5), steps of a few ms against writes of a second or
    so, kill -9 right after step 13 without waiting for the writer: a checkpoint at most
    2 x 5 steps old is on disk (5 at least: snapshot 10 is taken only once 5 is complete),
    and the restart ends bitwise where an uninterrupted run ends."""
    whole = _run(tmp_path / "whole", 20, every=5)
    assert whole.returncode == 0, whole.stderr[-3000:]
    d = tmp_path / "killed"
    killed = _run(d, 20, kill_after=13, every=5, at_once=True)
    assert killed.returncode == -9, killed.stderr[-3000:]
    steps = sorted(int(n) for n in os.listdir(d) if n.isdigit())
    assert steps and steps[-1] >= 13 - 2 * 5, (steps, killed.stdout)
    resumed = _run(d, 20, every=5)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"START {steps[-1]}" in resumed.stdout
    np.testing.assert_array_equal(_final(d), _final(tmp_path / "whole"))


_EXIT = textwrap.dedent(
    """
    import os, shutil, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, numpy as np
    import coarse_jax as coarse

    directory, ending = sys.argv[1], sys.argv[2]

    def loss_fn(params, batch):
        return jax.numpy.mean((jax.numpy.tanh(batch["x"] @ params["w"]) - batch["y"]) ** 2)

    mesh = coarse.make_mesh(workers=2)
    snaps = coarse.Snapshots(every=5, directory=directory, keep=2)

    @coarse.sync(mesh, snapshots=snaps)
    def step(params, batch):
        loss, params = coarse.value_and_update(loss_fn, coarse.optim.adam(1e-2))(params, batch)
        return params, loss

    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((8, 4), np.float32)}
    for i in range(10):
        batch = {"x": rng.standard_normal((4, 8), np.float32),
                 "y": rng.standard_normal((4, 4), np.float32)}
        params, loss = step(params, batch)
        if ending != "no-block":
            jax.block_until_ready(loss)
    print("TRAINED", flush=True)
    if ending == "sys.exit":
        sys.exit(0)
    if ending == "raise":
        raise RuntimeError("the user's own error after training")
    if ending == "unwritable":  # every write from here on fails
        import time
        # Not under a write still in flight (step 5's, which orbax would
        # recreate the directory for): the exit-time write of step 10 must fail.
        deadline = time.monotonic() + 120
        while step.stats()["snapshots_in_flight"] and time.monotonic() < deadline:
            time.sleep(0.01)
        shutil.rmtree(directory, ignore_errors=True)
        open(directory, "w").close()
    """
)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("ending", ["end", "no-block", "sys.exit", "raise"])
def test_a_clean_exit_leaves_every_snapshot_on_disk(tmp_path, ending):
    """10 steps, Snapshots(every=5), the script ends right after its last step (no
    wait_snapshots): checkpoints 5 and 10 are complete and open with plain orbax."""
    d = tmp_path / "ck"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    run = subprocess.run(
        [sys.executable, "-c", _EXIT, str(d), ending],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
        cwd=tmp_path,
    )
    assert "TRAINED" in run.stdout, run.stderr[-3000:]
    assert run.returncode == (1 if ending == "raise" else 0), run.stderr[-3000:]
    assert "snapshot" not in run.stderr, run.stderr[-3000:]
    assert sorted(n for n in os.listdir(d)) == ["10", "5"]
    for step in (5, 10):
        tree = ocp.StandardCheckpointer().restore(str(d / str(step)))
        assert int(tree["step"]) == step
        assert tree["params"]["w"].shape == (8, 4)


@pytest.mark.timeout(600)
def test_a_write_that_fails_at_exit_exits_non_zero_saying_so(tmp_path):
    d = tmp_path / "ck"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    run = subprocess.run(
        [sys.executable, "-c", _EXIT, str(d), "unwritable"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
        cwd=tmp_path,
    )
    assert "TRAINED" in run.stdout, run.stderr[-3000:]
    assert run.returncode == 1, (run.returncode, run.stderr[-3000:])
    assert "coarse_jax: a snapshot was not written before exit" in run.stderr, run.stderr[-3000:]


def test_stats_report_the_writer(tmp_path):
    mesh = coarse.make_mesh(workers=2)
    params = mlp_init(jax.random.key(3), SIZES)
    snaps = coarse.Snapshots(every=2, directory=tmp_path / "ck")
    step = _step(mesh, coarse.optim.adam(1e-2), snapshots=snaps)
    before = step.stats()
    assert before["snapshot_on_disk"] is None and before["snapshots_written"] == 0
    p = params
    for i in range(5):
        # Each step finished before the next: the pacing sees every snapshot taken, so
        # they fall on multiples of Snapshots.every (a loop running ahead may have one
        # deferred a step: test_a_snapshot_taken_by_a_step_in_flight_is_written...).
        p, _ = jax.block_until_ready(step(p, make_batch(jax.random.key(90 + i), 8, 8, 4)))
    step.wait_snapshots()  # 2 and 4 taken during steps 3 and 5 (the pacing keeps both)
    stats = step.stats()
    assert stats["snapshot_on_disk"] == 4, stats
    assert stats["snapshots_written"] == 2 and stats["snapshots_in_flight"] == 0, stats
    assert stats["snapshot_wait_s"] >= 0 and stats["snapshot_write_s"] > 0, stats


_step = coarse_update_step


def test_rollback_after_a_nan_equals_skipping_that_batch():
    mesh = coarse.make_mesh(workers=2)
    params = mlp_init(jax.random.key(1), SIZES)
    batches = [make_batch(jax.random.key(50 + i), 8, 8, 4) for i in range(8)]
    bad = dict(batches[4], x=batches[4]["x"].at[0, 0].set(jnp.nan))
    opt = coarse.optim.adam(1e-2)

    step = _step(mesh, opt, snapshots=coarse.Snapshots(every=1))
    p = params
    losses = []
    for i, batch in enumerate(batches):
        p, loss = step(p, bad if i == 4 else batch)
        if not np.isfinite(float(loss)):
            p = step.restore()  # back to before this step
            assert step.restored_count == i
            continue
        losses.append(float(loss))

    skip = _step(mesh, opt)
    q = params
    want = []
    for i, batch in enumerate(batches):
        if i == 4:
            continue
        q, loss = skip(q, batch)
        want.append(float(loss))
    np.testing.assert_array_equal(losses, want)
    assert_tree_close(p, q, rtol=0, atol_scale=0)


# (workers, proxies): 1:1, and proxies shared by 2 and 4 workers (COARSE k:1), on
# devices; in host memory, 4:1 on 4 workers and on all 8 devices as workers.
ROUND_TRIPS = {"devices": [(1, 1), (2, 2), (4, 4), (4, 2), (4, 1)], "host": [(4, 1), (8, 2)]}


@pytest.mark.parametrize(
    "proxies_on, workers, proxies",
    [
        pytest.param(on, p, q, id=f"{on}-p{p}q{q}")
        for on, cases in ROUND_TRIPS.items()
        for p, q in cases
    ],
)
def test_snapshot_and_restore_round_trip(proxies_on, workers, proxies, tmp_path):
    mesh = coarse.make_mesh(workers=workers, proxies=proxies, proxies_on=proxies_on)
    params = mlp_init(jax.random.key(2), SIZES)
    batches = [make_batch(jax.random.key(70 + i), 4 * workers, 8, 4) for i in range(6)]
    opt = coarse.optim.sgd(0.05, momentum=0.9)
    # Leading layers asked for: value_and_update sends everything through the proxies.
    cfg = coarse.Config(leading_bytes=8 * 16 * 4 + 64)
    step = _step(mesh, opt, cfg, snapshots=coarse.Snapshots(every=5, directory=tmp_path / "ck"))
    p = params
    for batch in batches[:3]:
        p, _ = step(p, batch)
    assert step.snapshot() == 3
    state3 = step.optimizer_state()
    for batch in batches[3:5]:  # the snapshot of step 5 would be taken when step 6 starts
        p, _ = step(p, batch)
    p = step.restore()  # in memory: back to step 3
    assert step.restored_count == 3
    for a, b in zip(jax.tree.leaves(step.optimizer_state()), jax.tree.leaves(state3), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    again = p
    for batch in batches[3:]:
        again, _ = step(again, batch)
    step.wait_snapshots()
    # From disk, in another step object (a fresh start): the newest checkpoint.
    fresh = _step(mesh, opt, cfg)
    restored = fresh.restore(str(tmp_path / "ck"))
    newest = fresh.restored_count
    assert newest == 5, newest  # step 5's snapshot, taken when step 6 started
    for batch in batches[newest:]:
        restored, _ = fresh(restored, batch)
    assert_tree_close(restored, again, rtol=0, atol_scale=0)
    want = optax.sgd(0.05, momentum=0.9)  # the exported state is optax's
    assert jax.tree.structure(fresh.optimizer_state()) == jax.tree.structure(want.init(params))


@pytest.mark.parametrize("first_call", ["quick", "late"])
def test_a_snapshot_taken_by_a_step_in_flight_is_written_not_overwritten(
    tmp_path, monkeypatch, first_call
):
    """The loop's pacing cannot see a snapshot a step still in flight takes; with a slow
    writer and steps dispatched ahead, the runtime defers the next snapshot instead of
    copying over one the writer has not taken: every snapshot taken reaches the disk.

    "late": the first call's update runs only after the step has attached its writer
    (its forward pass waits in a host callback), so the runtime's store does not exist
    yet when the writer attaches: attaching creates it (it was a no-op, and a loaded
    machine then lost snapshots)."""
    from coarse_jax.api import snapshots

    calls = []

    def late(x):
        calls.append(None)
        if first_call == "late" and len(calls) <= 2:  # the first call, on each worker
            time.sleep(0.5)
        return x

    def loss_fn(params, batch):
        x = jax.pure_callback(late, jax.ShapeDtypeStruct((), jnp.float32), jnp.float32(1))
        return mlp_loss(params, batch) * x

    write = snapshots.SnapshotWriter._write

    def slow(self, store, taken):
        time.sleep(0.05)  # the writer behind the proxies: the window this test widens
        write(self, store, taken)

    monkeypatch.setattr(snapshots.SnapshotWriter, "_write", slow)
    mesh = coarse.make_mesh(workers=2)
    params = mlp_init(jax.random.key(5), SIZES)
    cfg = coarse.Config(max_steps_in_flight=4)
    snaps = coarse.Snapshots(every=1, directory=tmp_path, keep=100)
    step = _step(mesh, coarse.optim.adam(1e-2), cfg, loss_fn=loss_fn, snapshots=snaps)
    p = params
    for i in range(16):
        p, _ = step(p, make_batch(jax.random.key(300 + i), 8, 8, 4))
    step.wait_snapshots()
    store = next(iter(step._proxies.stores.values()))
    taken = store.runtime.snapshot_serial()
    on_disk = sorted(int(d) for d in os.listdir(tmp_path))
    assert step.stats()["snapshots_written"] == taken == len(on_disk), (taken, on_disk)
    assert on_disk[-1] == 16, on_disk  # the exit-time flush: the last commit's
