"""8 virtual CPU devices, set before jax is imported anywhere.

`make test` is the CPU suite on every host, a GPU host too (its mesh tests
need 8 devices, which the CPU provides): jax is limited to the CPU unless
COARSE_TEST_GPU=1, which tools/gpu_check.sh sets to run the GPU cases (they
skip when jax sees no GPU).
"""

import os
import pathlib

# jax's persistent compilation cache, shared by the suite's own processes
# (examples, multihost launches: they inherit the environment) and by the
# Makefile's targets after `make test` (the streams backend runs the same
# programs; another jax version or XLA_FLAGS, as in test-isa, is another
# key). It skips XLA's compile only: every trace, plan and check still runs.
# About 60% of a test file's time is compiling (test_value_and_update.py:
# 153 s without, 124 s cold, 48 s warm, on the 2-core machine). In build/
# (`make clean` removes it); COARSE_TEST_COMPILE_CACHE=0 turns it off.
if os.environ.get("COARSE_TEST_COMPILE_CACHE", "1") != "0":
    _CACHE = pathlib.Path(__file__).resolve().parent.parent / "build" / "jax-cache"
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(_CACHE))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
if os.environ.get("COARSE_TEST_GPU") != "1":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

# The suite tests the proxies' runtime, mostly on small trees, which the
# default Config would give to XLA on CPU (the latency route,
# Config.xla_below_bytes="auto"): every tree goes through the proxies unless a
# test says otherwise (tests/test_xla_route.py sets the Config; the docs'
# examples run with the user's default, tests/test_docs.py). A test's own
# subprocess that needs the same calls the same hook (tests/helpers.py).
from coarse_jax.testing import set_default_xla_below_bytes

set_default_xla_below_bytes(0)


# Tests that `make test` runs (the oldest jax) and `make test-newest` leaves
# out (`-m "not once"`), to keep CI under its time budget. Each is among the
# suite's slowest, and what it adds at the newest jax is covered there by a
# faster test of the same path (named after the reason). Keyed by node id
# (file::name[params]); a name without [params] takes every case.
_EXAMPLES = "test_examples.py::"
_MULTIHOST = "test_multihost.py::"
ONCE = {
    _EXAMPLES + "test_example_noise_floor": "run-to-run noise of long runs (test_example_runs)",
    _EXAMPLES + "test_example_plot": "matplotlib's figure (test_example_runs)",
    _EXAMPLES + "test_demo_times_sync": "the real clock (test_example_runs[demo])",
    _EXAMPLES + "test_example_runs[resnet18]": "the longest example (cnn, bert)",
    _EXAMPLES + "test_flax_mnist_runs[flax_mnist_linen-None-None-True]": "state on the mesh "
    "(the same examples with state on the host)",
    _EXAMPLES + "test_flax_mnist_runs[flax_mnist_nnx-1-None-True]": "as above",
    "test_value_and_update.py::test_bert_example_hundred_adamw_steps_match_optax_within_the_"
    "noise_floor": "a long trajectory (test_bert_example_adamw_steps_in_lockstep_with_optax)",
    "test_memory.py::test_rss_stays_flat_across_200_plans": "the runtime's own memory growth",
    "test_profile.py::test_v100_preset_gives_the_papers_routes_on_a_busy_machine": "the real "
    "clock on a busy machine (the virtual-clock profile tests)",
    _MULTIHOST + "test_grads_and_all_reduce_equal_float64_mean_over_all_hosts[3-None-None]": (
        "three processes (the two-process cases)"
    ),
    _MULTIHOST + "test_value_and_update_across_hosts_matches_pmean_and_optax[3-None-None]": (
        "as above"
    ),
    # Across hosts the newest jax runs the two-process grads and value_and_update
    # scenarios (1:1, device proxies) and the missing host (the arrival barrier,
    # a jax internal); the rest differ from those in coarse's own code only.
    _MULTIHOST + "test_grads_and_all_reduce_equal_float64_mean_over_all_hosts[2-1-None]": (
        "proxies shared across hosts, coarse's code (the [2-None-None] case)"
    ),
    _MULTIHOST + "test_grads_and_all_reduce_equal_float64_mean_over_all_hosts[2-2-host]": (
        "host proxies across hosts, coarse's code (the [2-None-None] case)"
    ),
    _MULTIHOST + "test_value_and_update_across_hosts_matches_pmean_and_optax[2-2-None]": (
        "as above"
    ),
    _MULTIHOST + "test_value_and_update_across_hosts_matches_pmean_and_optax[2-2-host]": (
        "as above"
    ),
    _MULTIHOST + "test_twenty_optax_steps_match_pmean_over_all_workers": "optax across "
    "hosts (test_value_and_update_across_hosts_matches_pmean_and_optax[2-None-None])",
    _MULTIHOST + "test_snapshots_across_hosts_written_once_and_restored_on_every_host": (
        "coarse's snapshot writer (test_snapshots.py, and the 2-process scenarios)"
    ),
    _MULTIHOST + "test_nnx_batch_statistics_average_over_both_hosts": "an NNX step "
    "(test_nnx_and_jit_options.py) and the 2-process scenarios",
    _MULTIHOST + "test_a_lost_push_on_each_host_names_exactly_that_worker": "the runtime's "
    "timeouts (test_errors.py) and the missing host",
    _MULTIHOST + "test_launch_prefixes_output_stops_the_rest_and_propagates_the_exit_code": (
        "coarse_jax.launch's own process handling, no jax (the 2-process scenarios)"
    ),
    _EXAMPLES + "test_example_runs[bert]": "the bert example's model "
    "(test_value_and_update.py's lockstep test) and the runner (test_example_runs[demo])",
    _EXAMPLES + "test_example_runs[cnn]": "as above",
    _EXAMPLES + "test_example_with_the_optimizer_on_the_proxies": "value_and_update "
    "(test_value_and_update.py) and the runner (test_example_runs[demo])",
    "test_streams_backend.py::test_streams_with_chaos_give_the_default_backends_bits[7]": (
        "another chaos seed of the same path (seed 1)"
    ),
    "test_all_reduce.py::test_two_thousand_small_leaves_few_pushes": "the planner's "
    "batching, coarse's code (the other all_reduce tests)",
}


def pytest_addoption(parser):
    parser.addoption(
        "--at-newest",
        action="store_true",
        help="the subset `make test-newest` runs: the tests marked once left out, and of "
        "each parametrized test only cases enough that every value of every parameter runs "
        "(`make test` runs every combination)",
    )


def _each_value(items):
    """A greedy cover: in collection order, a case is kept when it brings a value of
    some parameter that no kept case of the same test had. Every value still runs at
    this end of the jax range, only not every combination (the other end runs those);
    what the newest jax can break is how a path traces and runs, which one case of it
    shows. Returns (kept, deselected)."""
    seen, kept, dropped = {}, [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", None)
        if not params:
            kept.append(item)
            continue
        pairs = {(name, _key(value)) for name, value in params.items()}
        have = seen.setdefault(item.nodeid.split("[", 1)[0], set())
        if pairs - have:
            have |= pairs
            kept.append(item)
        else:
            dropped.append(item)
    return kept, dropped


def _key(value):
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        path = item.nodeid.rsplit("/", 1)[-1]
        if path in ONCE or path.split("[", 1)[0] in ONCE:
            item.add_marker(pytest.mark.once)
    if config.getoption("--at-newest"):
        once = [item for item in items if item.get_closest_marker("once")]
        items[:], dropped = _each_value([item for item in items if item not in once])
        dropped += once
        if dropped:
            config.hook.pytest_deselected(items=dropped)
