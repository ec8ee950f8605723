"""Memory stays bounded across many plans: spare storage, parsed plans, bookkeeping.

The RSS check runs in a subprocess, from a clean heap: 20 distinct plans, then
200 (1 MiB per worker, 4 workers, each a new coarse.sync step run a few times,
`jax.clear_caches()` after each so JAX's own executables do not grow the heap);
the resident set after 200 must stay within 10% of the one after 20.

The resident set is read after `malloc_trim(0)`, so it counts memory in use,
not free heap glibc keeps: compiling and dropping a step 200 times leaves
150-300 MB of such free pages (the same with one plan used 200 times, the
runtime holding one plan and one set; all of it returned by malloc_trim), which
would hide what the test is after. Before the fix the runtime itself kept
about 4 MB per plan of spare storage (up to 2 GiB), which no trim returns.
"""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest

import coarse_jax as coarse

DEFAULTS = {"spare_storage_bytes": 512 << 20, "spare_plans": 4, "cached_plans": 64}

_RSS_SCRIPT = textwrap.dedent(
    """
    import ctypes, os, sys
    import jax, jax.numpy as jnp
    import coarse_jax as coarse

    try:
        _trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to trim
        _trim = lambda pad: 0

    def rss(trim=True):
        if trim:
            _trim(0)  # give free heap pages back first: count memory in use
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS in /proc/self/status")

    total = int(sys.argv[1])
    mesh = coarse.make_mesh(workers=4)
    batch = jnp.ones((4, 2))
    for i in range(total):
        n = (1 << 18) + 64 * i  # ~1 MiB of float32 per worker; a new plan every time
        x = jnp.full((n,), 1.0 + i, jnp.float32)
        cfg = coarse.Config(xla_below_bytes=0)  # the runtime's plans, not XLA's psum
        step = coarse.sync(lambda x, b: coarse.all_reduce(x), mesh=mesh, config=cfg)
        for _ in range(3):
            out = step(x, batch)
        assert float(out[0]) == 1.0 + i
        del out, step, x
        jax.clear_caches()
        if i + 1 in (20, total):
            raw = rss(trim=False)
            print("RSS", i + 1, rss(), raw, flush=True)
    if hasattr(coarse, "diagnostics"):
        print("STATS", coarse.diagnostics.runtime_stats(), flush=True)
    """
)


@pytest.fixture
def default_limits():
    """Each test starts from the defaults and leaves them behind."""
    assert coarse.diagnostics.set_memory_limits(**DEFAULTS) == DEFAULTS
    yield
    coarse.diagnostics.set_memory_limits(**DEFAULTS)


@pytest.mark.timeout(300)
def test_rss_stays_flat_across_200_plans(tmp_path):
    if not os.path.exists("/proc/self/status"):
        pytest.skip("needs /proc/self/status (Linux) to read the resident set")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    proc = subprocess.run(
        [sys.executable, "-c", _RSS_SCRIPT, "200"],
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
        cwd=tmp_path,  # import the installed package, not ./coarse_jax
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [ln.split() for ln in proc.stdout.splitlines() if ln.startswith("RSS")]
    rss = {int(n): int(b) for _, n, b, _ in lines}
    raw = {int(n): int(r) for _, n, _, r in lines}
    print(
        f"RSS after 20 plans {rss[20] / 1e6:.0f} MB, after 200 {rss[200] / 1e6:.0f} MB "
        f"(untrimmed {raw[20] / 1e6:.0f} MB, {raw[200] / 1e6:.0f} MB)"
    )
    assert rss[200] <= 1.10 * rss[20], (rss, proc.stdout)


def _all_reduce_step(mesh, n):
    cfg = coarse.Config(xla_below_bytes=0)  # the runtime's plans (a small tree: latency route)
    step = coarse.sync(lambda x, b: coarse.all_reduce(x), mesh=mesh, config=cfg)
    return step, jnp.ones((n,), jnp.float32)


def _run_plans(count, workers=2, base=1000):
    mesh = coarse.make_mesh(workers=workers)
    batch = jnp.ones((workers, 2))
    for i in range(count):
        step, x = _all_reduce_step(mesh, base + 8 * i)
        jax.block_until_ready(step(x, batch))


def test_stats_respect_the_limits(default_limits):
    limits = coarse.diagnostics.set_memory_limits(spare_plans=2, cached_plans=3)
    assert limits == {"spare_storage_bytes": 512 << 20, "spare_plans": 2, "cached_plans": 3}
    _run_plans(6)
    stats = coarse.diagnostics.runtime_stats()
    assert stats["spare_plans"] == 2
    assert 2 <= stats["spare_sets"] <= 4  # at most two sets per plan
    assert 0 < stats["spare_storage_bytes"] <= 512 << 20
    assert stats["cached_plans"] <= 3
    assert stats["live_sessions"] == 0

    # Lowering a limit frees what exceeds it at once.
    coarse.diagnostics.set_memory_limits(spare_plans=1, cached_plans=1)
    stats = coarse.diagnostics.runtime_stats()
    assert stats["spare_plans"] == 1
    assert stats["cached_plans"] <= 1

    # The most recent plan's storage is kept whatever its size ...
    coarse.diagnostics.set_memory_limits(spare_storage_bytes=1, spare_plans=4)
    _run_plans(3)
    stats = coarse.diagnostics.runtime_stats()
    assert stats["spare_plans"] == 1 and stats["spare_storage_bytes"] > 1

    # ... unless no plan may keep any.
    coarse.diagnostics.set_memory_limits(spare_plans=0)
    assert coarse.diagnostics.runtime_stats()["spare_storage_bytes"] == 0
    _run_plans(2)
    assert coarse.diagnostics.runtime_stats()["spare_sets"] == 0


def test_bookkeeping_is_bounded(default_limits):
    """Runs remembered for loop iterations, per-(plan, site) step counters: bounded."""
    mesh = coarse.make_mesh(workers=1)
    step, x = _all_reduce_step(mesh, 8)
    batch = jnp.ones((1, 2))
    for _ in range(300):  # more runs than the registry remembers (256)
        step(x, batch)
    jax.block_until_ready(step(x, batch))
    stats = coarse.diagnostics.runtime_stats()
    assert stats["runs_remembered"] <= 256
    assert stats["live_sessions"] == 0


def test_set_memory_limits_rejects_bad_values(default_limits):
    with pytest.raises(ValueError, match=r"spare_plans expected an int >= 0, got -1"):
        coarse.diagnostics.set_memory_limits(spare_plans=-1)
    with pytest.raises(TypeError, match=r"spare_storage_bytes expected an int >= 0 or None.*float"):
        coarse.diagnostics.set_memory_limits(spare_storage_bytes=1.5)
    with pytest.raises(TypeError, match=r"cached_plans expected an int.*bool"):
        coarse.diagnostics.set_memory_limits(cached_plans=True)
    assert coarse.diagnostics.set_memory_limits() == DEFAULTS  # nothing changed
