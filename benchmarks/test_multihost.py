"""Across hosts: ResNet-50 tree, 2 processes x (4 workers + 4 proxies), coarse vs ``lax.pmean``.

Launches benchmarks/multihost_bench.py with ``python -m coarse_jax.launch
--processes 2 --devices-per-process 8`` (gloo between the processes) and
reports the median time per all-reduce of each and their ratio, from one run
(the two alternate call by call). Not part of ``make test``; run with
``pytest -q -s benchmarks/test_multihost.py -p no:cacheprovider`` from outside
the repo (``make bench`` does not run it: it needs its own processes).

``test_multihost_emulated_v100``: COARSE vs AllReduce on the emulated "v100"
links x300 with the preset's 100 Gb/s inter-host link (real clock), beside
`coarse.model.predict_hosts_sync_s` (the host's own schedule plus its network
link), and each scheme on each host alone beside `predict_plan_sync_s` and
the links' bound (`coarse.model.link_bound`).
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


EMULATED_ROUNDS = 3


def _run(tmp_path: pathlib.Path, *args: str) -> dict[str, Any]:
    """Runs multihost_bench.py in 2 processes x 8 CPU devices; returns process 0's RESULT."""
    cmd = [sys.executable, "-m", "coarse_jax.launch", "--processes", "2"]
    cmd += ["--devices-per-process", "8", "--timeout", "840", str(SCRIPT), *args]
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
    return results[0]


@pytest.mark.timeout(900)
def test_multihost_emulated_v100(tmp_path: pathlib.Path, record_property: Any) -> None:
    r = _run(tmp_path, str(EMULATED_ROUNDS), "emulated")
    record_property("multihost_emulated_v100", r)
    med = r["median_s"]
    lines = [
        f"\nResNet-50 tree, {r['processes']} processes x ({r['workers_per_process']} workers + "
        f"{r['workers_per_process']} proxies), {r['bytes_per_worker'] / 2**20:.1f} MiB per worker, "
        f"emulated v100 links x{r['time_scale']:g} + {r['inter_host_gbps'] * 8:g} Gb/s "
        f"({r['inter_host_us']:g} us) inter-host link, real clock, median of {r['rounds']}:",
        f"{'scheme':<10} {'measured ms':>12} {'predicted ms':>13} {'error':>7}   "
        f"{'one host: measured':>18} {'predicted':>10} {'bound':>8}   inter-host ms",
    ]
    for scheme in ("allreduce", "coarse"):
        info = r["schemes"][scheme]
        m, pr = med[scheme], info["predicted_s"]
        lines.append(
            f"{scheme:<10} {m * 1e3:>12.1f} {pr * 1e3:>13.1f} {m / pr - 1:>+7.1%}   "
            f"{med[scheme + '_host_only'] * 1e3:>18.1f} "
            f"{info['predicted_host_only_s'] * 1e3:>10.1f} "
            f"{info['bound_host_only_s'] * 1e3:>8.1f}   {info['inter_host_s'] * 1e3:.1f}"
        )
    lines.append(f"  coarse / allreduce = {med['coarse'] / med['allreduce']:.2f}")
    lines.append("  all runs (s): " + json.dumps(r["all_s"]))
    print("\n".join(lines))


@pytest.mark.timeout(900)
def test_multihost_resnet50(tmp_path: pathlib.Path, record_property: Any) -> None:
    r = _run(tmp_path, str(ROUNDS))
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
