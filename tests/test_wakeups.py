"""The runtime's wake-up counters (ffi/runtime/wakeups.h, coarse_jax._ffi.wakeups)."""

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse
from coarse_jax._ffi import wakeups
from coarse_jax._lab import lab_cpu

WORKERS = 4


def _synced_step():
    mesh = coarse.make_mesh(workers=WORKERS)
    cfg = coarse.Config(xla_below_bytes=0)  # the runtime's counters: 1 KiB takes the route
    step = coarse.sync(lambda x: coarse.all_reduce(x, op="sum"), mesh, config=cfg)
    x = np.arange(WORKERS * 256, dtype=np.float32) % 7
    xc = jax.device_put(x, NamedSharding(mesh, P("data")))
    return step, xc, x.reshape(WORKERS, -1).sum(0)


def test_reset_zeroes_and_subtraction():
    wakeups.reset_wakeup_stats()
    zero = wakeups.wakeup_stats()
    assert zero == wakeups.WakeupStats()
    a = wakeups.WakeupStats(parks=5, parked_ns=10, thread_starts=1)
    b = wakeups.WakeupStats(parks=2, parked_ns=4)
    assert a - b == wakeups.WakeupStats(parks=3, parked_ns=6, thread_starts=1)
    assert (a - b).per(3)["parks"] == 1.0


def test_syncs_move_the_counters():
    step, xc, want = _synced_step()
    jax.block_until_ready(step(xc))  # compile
    syncs = 10
    before = wakeups.wakeup_stats()
    for _ in range(syncs):
        out = step(xc)
        np.testing.assert_allclose(np.asarray(out), want)
    d = wakeups.wakeup_stats() - before
    # Every sync's proxies post progress that the workers (or peers) wait on:
    # at least one notify per proxy per sync, counted either way.
    assert d.notify_sleeper + d.notify_no_sleeper >= syncs * WORKERS
    # A park ends with work or without (timeout slice, spurious wake-up): never
    # more wake-ups with work than parks, and time parked only when parked.
    assert 0 <= d.woke_with_work <= d.parks
    assert (d.parked_ns > 0) == (d.parks > 0)
    assert d.spin_found >= 0 and d.thread_starts >= 0
    # One job per proxy per sync (1:1, so q = p), each timed from its queuing.
    assert d.jobs_started == syncs * WORKERS
    assert 0 <= d.jobs_late <= d.jobs_started
    assert d.job_start_ns > 0


def test_no_thread_starts_after_warm_up():
    """20 steps after the first start no thread, even when idle threads exit fast.

    With a 1 ms idle time and a pause between steps, every thread the pool did
    not reserve exits between steps: without the session's reservation (2 per
    proxy) each step would start its q proxies' threads anew.
    """
    step, xc, want = _synced_step()
    old = wakeups.set_service_idle_ms(1)
    try:
        for _ in range(3):  # compile, reserve
            jax.block_until_ready(step(xc))
        assert wakeups.service_threads() >= 2 * WORKERS
        before = wakeups.wakeup_stats()
        for _ in range(20):
            time.sleep(0.005)  # longer than the idle time
            np.testing.assert_allclose(np.asarray(step(xc)), want)
        d = wakeups.wakeup_stats() - before
    finally:
        wakeups.set_service_idle_ms(old)
    assert d.thread_starts == 0, d


@pytest.mark.parametrize("spin_ns", [0, 2_000, 50_000])
def test_no_lost_wake_up_under_seeded_delays(spin_ns):
    """Many threads, two per mailbox, meet at barriers with seeded random delays
    around each arrival, its notifies and each wait's park; a lost wake-up
    would leave a waiter asleep until its timeout (lab/wakeup_selftest.h).
    """
    cpu = lab_cpu()
    for seed in range(10):
        r = cpu.wakeup_selftest(threads=8, rounds=200, seed=seed, timeout_ms=2000, spin_ns=spin_ns)
        assert r["lost"] == 0, (seed, r)
        assert r["waits"] == 8 * 200, (seed, r)
        assert r["max_wait_ms"] < 1000, (seed, r)  # well before the timeout


def test_spin_budget_is_settable_and_restorable():
    old = wakeups.set_wait_spin_ns(1234)
    try:
        assert wakeups.set_wait_spin_ns(-1) == 1234
        default = wakeups.set_wait_spin_ns(-1)
        # On a host of at most 2 hardware threads the waits never spin.
        if (os.cpu_count() or 1) <= 2:
            assert default == 0
        else:
            assert 0 < default <= 50_000
    finally:
        wakeups.set_wait_spin_ns(old)


def _mlp_loss(params, x):
    h = jnp.tanh(x @ params["w1"])
    return jnp.mean((h @ params["w2"]) ** 2)


@pytest.mark.parametrize("kind", ["value_and_grad", "value_and_update", "all_reduce"])
def test_a_sync_queues_its_proxies_jobs_before_its_first_push(kind):
    """coarse_begin, ahead of the forward pass, starts the proxies' jobs: no push does.

    Deterministic whatever the load: on every worker the sync's first push
    takes coarse_begin's token, so the session's first worker call is a
    begin (or, in a value_and_update, its coarse_opt_count), never a push.
    A lone `coarse.all_reduce` has nothing before its push, so each of its
    syncs counts its q jobs here: the control. Without coarse_begin the
    value_and_grad case counts them too (checked: 24 of 24). A
    value_and_update's coarse_opt_count has no data dependency on the pushes.
    """
    mesh = coarse.make_mesh(workers=WORKERS)
    cfg = coarse.Config(xla_below_bytes=0)  # small trees take the latency route
    params = {"w1": jnp.full((16, 32), 0.01), "w2": jnp.full((32, 4), 0.02)}
    x = jnp.arange(WORKERS * 8 * 16, dtype=jnp.float32).reshape(-1, 16) / 100

    if kind == "value_and_grad":

        @coarse.sync(mesh, config=cfg)
        def step(p, x):
            loss, g = coarse.value_and_grad(_mlp_loss)(p, x)
            return jax.tree.map(lambda a, b: a - 0.1 * b, p, g), loss

    elif kind == "value_and_update":
        opt = coarse.optim.sgd(0.1)

        @coarse.sync(mesh, config=cfg)
        def step(p, x):
            loss, p = coarse.value_and_update(_mlp_loss, opt)(p, x)
            return p, loss

    else:

        @coarse.sync(mesh, config=cfg)
        def step(p, x):
            return p, coarse.all_reduce(jnp.sum(x))

    params, _ = jax.block_until_ready(step(params, x))  # compile
    syncs = 6
    before = wakeups.wakeup_stats()
    for _ in range(syncs):
        params, _ = jax.block_until_ready(step(params, x))
    d = wakeups.wakeup_stats() - before
    assert d.jobs_started == syncs * WORKERS, d
    want = syncs * WORKERS if kind == "all_reduce" else 0
    assert d.jobs_queued_at_push == want, d
