"""CUDA kernels' throughput beside a device-to-device copy of the same bytes, on one GPU.

For each size and dtype, one call of ``_coarse_lab_cuda.bench_kernels`` times, with
CUDA events, the median of ``ITERS`` runs of:

* ``copy``:   ``cudaMemcpyAsync`` device to device of the packed buffer;
* ``pack``:   leaves -> one buffer (same dtype, so it moves the copy's bytes);
* ``unpack``: the inverse;
* ``reduce``: ``out = 0.5 * (a + b)`` (reads two buffers, writes one);
* ``adam``:   (float32 rows) the proxy optimizer's adam update in place, as the
  proxies run it: gradient, weight and two state slots read and written.

Bandwidth counts bytes read plus bytes written; each kernel is reported as a
fraction of the copy's bandwidth (the goal: >= 90% from 64 MiB up). A
separate case packs 2,000 small leaves in one launch. pytest-benchmark's own
timing wraps the whole measuring call; the figures that matter are in
``extra_info`` and in the table printed at the end (and written to
``$COARSE_BENCH_OUT/kernels_gpu.md`` when that is set).

Skips without a GPU. Run on a GPU host: ``pytest -q benchmarks/test_kernels_gpu.py -s``.
"""

from __future__ import annotations

import os
import sys

import pytest

# The tests' GPU check (skip without a GPU, fail if the CUDA module is missing).
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
)
from helpers import gpu_or_skip

from coarse_jax._lab import lab_cuda

ITERS = 50
MIB = 1 << 20
SIZES_MIB = [1, 16, 64, 256, 1024]
DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2}
ROWS: list[dict] = []


def _measure(benchmark, nelems, dtype, num_leaves, label):
    device, _ = gpu_or_skip()
    result = benchmark.pedantic(
        lab_cuda().bench_kernels, args=(nelems, dtype, num_leaves, ITERS), rounds=1, iterations=1
    )
    copy_gbs = result["copy_bytes"] / result["copy_us"] / 1e3
    row = {"case": label, "dtype": dtype, "leaves": num_leaves, "gpu": device.device_kind}
    for name in ("copy", "pack", "unpack", "reduce", "adam"):
        if f"{name}_us" not in result:
            continue
        gbs = result[f"{name}_bytes"] / result[f"{name}_us"] / 1e3
        row[f"{name}_us"] = result[f"{name}_us"]
        row[f"{name}_gbs"] = gbs
        row[f"{name}_of_copy"] = gbs / copy_gbs
    benchmark.extra_info.update(row)
    ROWS.append(row)
    return row


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("mib", SIZES_MIB)
def test_kernel_bandwidth(benchmark, mib, dtype):
    _measure(benchmark, mib * MIB // DTYPES[dtype], dtype, 1, f"{mib} MiB")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pack_2000_small_leaves(benchmark, dtype):
    # 2,000 leaves of 1,000 elements (a BERT-sized count of biases and norms).
    _measure(benchmark, 2000 * 1000, dtype, 2000, "2000 leaves x 1000")


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    if not ROWS:
        return
    lines = [
        (
            f"GPU: {ROWS[0]['gpu']}; median of {ITERS} runs (CUDA events); GB/s = (bytes read + "
            "bytes written) / time; % = of the copy's GB/s"
        ),
        "",
        "| case | dtype | copy GB/s | pack GB/s (%) | unpack GB/s (%) | reduce GB/s (%) "
        "| adam GB/s (%) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in ROWS:
        lines.append(
            f"| {r['case']} | {r['dtype']} | {r['copy_gbs']:.0f} | "
            + " | ".join(
                f"{r[f'{k}_gbs']:.0f} ({100 * r[f'{k}_of_copy']:.0f}%)" if f"{k}_gbs" in r else "-"
                for k in ("pack", "unpack", "reduce", "adam")
            )
            + " |"
        )
    text = "\n".join(lines)
    print("\n" + text)
    out = os.environ.get("COARSE_BENCH_OUT")
    if out:
        with open(os.path.join(out, "kernels_gpu.md"), "w") as f:
            f.write(text + "\n")
