"""The examples' step table: each example's coarse step against its pmean step, one run.

Runs ``examples/<name>/main.py --impl both`` (coarse and jit + pmean in one
process, the same data and steps) for a short run and reads the median step
time of each from its ``metrics.jsonl``; step 0 (compilation) is not timed.
Prints coarse / pmean per example (issue 27's goal: at most 1.3). The
proxies run no XLA program (the runtime's service), so the model runs on the
workers alone, as pmean's does; the proxies' threads share the machine's
cores with them.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
STEPS = {"demo": 150, "cnn": 60, "resnet18": 40, "bert": 60}
_ROWS: dict[str, tuple[float, float]] = {}


def median_steps(
    name: str, workdir: pathlib.Path, steps: int | None = None, extra: tuple[str, ...] = ()
) -> dict[str, float]:
    """{impl: median step seconds} of one ``--impl both`` run of an example (its STEPS)."""
    script = [sys.executable, str(EXAMPLES / name / "main.py"), "--workdir", str(workdir)]
    proc = subprocess.run(
        [*script, "--impl", "both", "--steps", str(steps or STEPS[name]), *extra],
        cwd=workdir,  # the installed coarse_jax, not the source tree
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = {}
    for line in (workdir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("summary"):
            out[record["impl"]] = float(record["median_step_s"])
    return out


@pytest.mark.parametrize("name", list(STEPS))
def test_example_step(benchmark: Any, name: str, tmp_path: pathlib.Path) -> None:
    medians = benchmark.pedantic(lambda: median_steps(name, tmp_path), rounds=1, iterations=1)
    coarse_s, pmean_s = medians["coarse"], medians["pmean"]
    benchmark.extra_info.update(
        {"coarse_median_step_s": coarse_s, "pmean_median_step_s": pmean_s, "steps": STEPS[name]}
    )
    _ROWS[name] = (coarse_s, pmean_s)
    if len(_ROWS) == len(STEPS):
        lines = ["", "examples, median step (default Config, 4 workers, 8 CPU devices):"]
        head = f"{'example':<10} {'steps':>6} {'coarse ms':>10} {'pmean ms':>9} {'x pmean':>8}"
        lines.append(head)
        for ex, (c, p) in _ROWS.items():
            lines.append(f"{ex:<10} {STEPS[ex]:>6} {c * 1e3:>10.1f} {p * 1e3:>9.1f} {c / p:>8.2f}")
        print("\n".join(lines))
