"""Benchmark setup: 8 CPU devices (4 workers + 4 proxies) and a closing summary.

XLA reads ``--xla_force_host_platform_device_count`` only when jax creates its
CPU backend, so the flag is added here, before any benchmark module imports jax.

``--xla_disable_hlo_passes=cse_barrier_expander`` is added with it, for the
rematerialization rows of test_memory.py and test_model_size.py: XLA:CPU's
``cse_barrier_expander`` pass removes the optimization barriers that
``jax.checkpoint`` puts around the recomputation, and CSE then merges the
recomputation back into the forward pass, so remat saves no memory on
XLA:CPU. With the pass off the recomputation stays (and runs, with the same
gradients). A program without optimization barriers, every other benchmark's,
compiles the same either way.

``examples/`` and ``tests/`` go on ``sys.path`` (after this folder) so that the
benchmarks time with the examples' clock, ``common.clock``, and measure against
the tests' oracle step (``helpers``): one helper per job.
"""

from __future__ import annotations

import os
import pathlib
import sys
from typing import Any

import pytest

_DEVICE_FLAG = "--xla_force_host_platform_device_count"
if _DEVICE_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_DEVICE_FLAG}=8".strip()
REMAT_FLAG = "--xla_disable_hlo_passes=cse_barrier_expander"
if "--xla_disable_hlo_passes" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {REMAT_FLAG}".strip()
EXAMPLES = str(pathlib.Path(__file__).resolve().parent.parent / "examples")
TESTS = str(pathlib.Path(__file__).resolve().parent.parent / "tests")
for _folder in (EXAMPLES, TESTS):
    if _folder not in sys.path:
        sys.path.append(_folder)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--bench-trees",
        default=None,
        help="test_sync_suite.py: comma-separated trees (resnet50,bert_base,vit_b16); "
        "default $COARSE_BENCH_TREES or all.",
    )
    parser.addoption(
        "--bench-workers",
        default=None,
        help="test_sync_suite.py: comma-separated worker counts (of 1,2,4); "
        "default $COARSE_BENCH_WORKERS or all.",
    )


# impl -> {"bytes", "median_s", "busbw_gbs"}, filled by the benchmarks.
RESULTS_KEY = pytest.StashKey[dict[str, dict[str, float]]]()


@pytest.fixture(scope="session")
def sync_results(pytestconfig: pytest.Config) -> dict[str, dict[str, float]]:
    """Where each benchmark leaves its median time and bus bandwidth for the summary."""
    return pytestconfig.stash.setdefault(RESULTS_KEY, {})


EMULATED_KEY = pytest.StashKey[dict[str, dict[str, Any]]]()


@pytest.fixture(scope="session")
def emulated_results(pytestconfig: pytest.Config) -> dict[str, dict[str, Any]]:
    """Where the emulated-V100 benchmarks (real clock) leave measured and predicted times."""
    return pytestconfig.stash.setdefault(EMULATED_KEY, {})


def _emulated_summary(tr: Any, results: dict[str, Any]) -> None:
    tr.section("emulated v100 links x300 (ResNet-50 tree, 4 workers)")
    tr.write_line(
        f"{'scheme':<10} {'measured ms':>12} {'predicted ms':>13} {'error':>7} "
        f"{'bound ms':>9} {'/ bound':>8} {'busbw GB/s':>11}  bound set by; rounds ms"
    )
    for name, r in results.items():
        err = r["median_s"] / r["predicted_s"] - 1
        rounds = ", ".join(f"{t * 1e3:.1f}" for t in r["rounds_s"])
        tr.write_line(
            f"{name:<10} {r['median_s'] * 1e3:>12.1f} {r['predicted_s'] * 1e3:>13.1f} "
            f"{err:>+7.1%} {r['bound_s'] * 1e3:>9.1f} {r['median_s'] / r['bound_s'] - 1:>+8.1%} "
            f"{r['busbw']:>11.2f}  {r['bound_by']}; {rounds}"
        )


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Prints median time per implementation, its ratio to pmean, and bus bandwidth."""
    emulated = config.stash.get(EMULATED_KEY, {})
    if emulated:
        _emulated_summary(terminalreporter, emulated)
    results = config.stash.get(RESULTS_KEY, {})
    if not results:
        return
    # Each ratio is to lax.pmean over the same number of workers (p devices).
    base = {r.get("workers", 4): r["median_s"] for n, r in results.items() if n.startswith("pmean")}
    tr = terminalreporter
    tr.section("gradient sync summary (ResNet-50 tree; time relative to pmean, lower is better)")
    tr.write_line(
        f"{'impl':<18} {'p':>2} {'MiB':>8} {'median ms':>10} {'x pmean':>8} {'busbw GB/s':>11}"
    )
    for name, r in results.items():
        p = r.get("workers", 4)
        ratio = f"{r['median_s'] / base[p]:.2f}" if p in base else "-"
        tr.write_line(
            f"{name:<18} {p:>2} {r['bytes'] / 2**20:>8.1f} {r['median_s'] * 1e3:>10.2f} "
            f"{ratio:>8} {r['busbw_gbs']:>11.2f}"
        )
