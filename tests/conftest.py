"""8 virtual CPU devices, set before jax is imported anywhere.

`make test` is the CPU suite on every host, a GPU host too (its mesh tests
need 8 devices, which the CPU provides): jax is limited to the CPU unless
COARSE_TEST_GPU=1, which tools/gpu_check.sh sets to run the GPU cases (they
skip when jax sees no GPU).
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
if os.environ.get("COARSE_TEST_GPU") != "1":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


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
    _EXAMPLES + "test_flax_mnist_runs[flax_mnist_linen-None-True]": "state on the mesh "
    "(the same examples with state on the host)",
    _EXAMPLES + "test_flax_mnist_runs[flax_mnist_nnx-2-True]": "as above",
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
}


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        path = item.nodeid.rsplit("/", 1)[-1]
        if path in ONCE or path.split("[", 1)[0] in ONCE:
            item.add_marker(pytest.mark.once)
