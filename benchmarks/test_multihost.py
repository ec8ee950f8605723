"""Across hosts: ResNet-50 tree, 2 processes x (4 workers + 4 proxies), coarse vs ``lax.pmean``.

Launches benchmarks/multihost_bench.py with ``python -m coarse_jax.launch
--processes 2 --devices-per-process 8`` (gloo between the processes) and
reports the median time per all-reduce of each and their ratio, from one run
(the two alternate call by call). Not part of ``make test``; run with
``pytest -q -s benchmarks/test_multihost.py -p no:cacheprovider`` from outside
the repo (``make bench`` does not run it: it needs its own processes).

Not measured here: the emulated "v100" links with a 100 Gb/s inter-host link
beside `coarse.model`'s prediction (see docs: the emulator is per process and
has no inter-host link yet).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest

SCRIPT = pathlib.Path(__file__).with_name("multihost_bench.py")
ROUNDS = 10


@pytest.mark.timeout(900)
def test_multihost_resnet50(tmp_path: pathlib.Path, record_property: Any) -> None:
    cmd = [sys.executable, "-m", "coarse_jax.launch", "--processes", "2"]
    cmd += ["--devices-per-process", "8", "--timeout", "840", str(SCRIPT), str(ROUNDS)]
    proc = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=880, check=False
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    results = [
        json.loads(line.split("RESULT ", 1)[1])
        for line in proc.stdout.splitlines()
        if line.startswith("[p0] RESULT ")
    ]
    assert len(results) == 1, proc.stdout[-3000:]
    r = results[0]
    record_property("multihost_resnet50", r)
    med = r["median_s"]
    print(
        f"\nResNet-50 tree, {r['processes']} processes x ({r['workers_per_process']} workers + "
        f"{r['workers_per_process']} proxies), {r['bytes_per_worker'] / 2**20:.1f} MiB per "
        f"worker, median of {r['rounds']}:\n"
        f"  coarse  {med['coarse'] * 1e3:9.1f} ms   busbw {r['busbw_GBps']['coarse']:.2f} GB/s\n"
        f"  pmean   {med['pmean'] * 1e3:9.1f} ms   busbw {r['busbw_GBps']['pmean']:.2f} GB/s\n"
        f"  coarse / pmean = {r['coarse_over_pmean']:.2f}\n"
        f"  breakdown: each process's 4+4 devices alone (no inter-host step) "
        f"{med['coarse_host_only'] * 1e3:.1f} ms"
    )
