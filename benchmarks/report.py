"""Turns pytest-benchmark JSON into a markdown table and a PNG.

Usage::

    python benchmarks/report.py results.json [more.json ...] \\
        [--markdown out.md] [--plot out.png] [--json-out merged.json]

Reads ``--benchmark-json`` output of any of the suites in this directory:

* ``test_goals.py`` records each of issue 39's goals (``extra_info["goal"]``):
  they get a table of their own after the others;
* ``test_sync_suite.py`` records impl, workers, tree, bytes, median and bus
  bandwidth in ``extra_info``, which is used as is;
* ``test_sync_resnet50.py`` (param ``impl``) and ``test_emulated_v100.py``
  (param ``scheme``) name only the implementation: their tree is ResNet-50
  and their worker count 4 (the modules' ``WORKERS``), taken from the test
  name. The emulated suite's rows are times on links slowed x300, so their
  bus bandwidth is in that slowed time (its ``extra_info`` also holds the
  unscaled figure).

Rows are grouped by suite (the test file), tree and worker count; "x pmean" is
the median time over pmean's in the same group ("-" where the group has no
pmean, e.g. the emulated suite). Bus bandwidth follows NCCL: bytes / time *
2 (p - 1) / p, 0 for p = 1. Several JSON files (``make bench`` writes one per
process, see its comment in the Makefile) are merged; ``--json-out`` writes the
merged file. The markdown is also printed to stdout.

The PNG (matplotlib, Agg) has one column per group of rows sharing suite and
tree: on top the median time per implementation, grouped by worker count (log
scale), below the bus bandwidth per implementation against worker count.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

IMPL_ORDER = ("coarse_ffi", "coarse_reference", "pmean", "dense", "allreduce", "coarse")
TREE_ORDER = ("resnet50", "vit_b16", "bert_base")
LEGACY_WORKERS = 4  # WORKERS in test_sync_resnet50.py and test_emulated_v100.py


@dataclass
class Row:
    suite: str
    tree: str
    workers: int
    impl: str
    median_s: float
    nbytes: int | None
    rounds: int
    ratio: float | None = None

    @property
    def busbw_gbs(self) -> float | None:
        if self.nbytes is None:
            return None
        p = self.workers
        return self.nbytes / self.median_s * 2 * (p - 1) / p / 1e9 if p > 1 else 0.0


def _tree_bytes(tree: str) -> int | None:
    """float32 bytes of a named tree, from model_shapes (benchmarks/) when it can be imported."""
    try:
        from model_shapes import SHAPES
    except ImportError:
        return None
    shapes = SHAPES.get(tree)
    return None if shapes is None else 4 * sum(math.prod(s) for _, s in shapes)


def _suite(bench: dict[str, Any]) -> str:
    path = bench.get("fullname", "").split("::")[0]
    stem = Path(path).stem if path else bench.get("group") or "?"
    return stem.removeprefix("test_")


def _param(bench: dict[str, Any], *names: str) -> Any:
    params = bench.get("params") or {}
    for n in names:
        if n in params:
            return params[n]
    return None


def parse(bench: dict[str, Any]) -> Row:
    extra = bench.get("extra_info") or {}
    name = bench.get("name", "")
    suite = _suite(bench)
    impl = extra.get("impl") or _param(bench, "impl", "scheme")
    if impl is None:  # an unparametrized name: the id in brackets, if any
        match = re.search(r"\[(.*)\]", name)
        impl = match.group(1) if match else name
    tree = extra.get("tree") or _param(bench, "tree")
    if tree is None:
        tree = next((t for t in TREE_ORDER if t in name), None)
        if tree is None and "emulated" in suite:  # test_emulated_v100.py syncs ResNet-50
            tree = "resnet50"
        tree = tree or "?"
    workers = extra.get("workers") or _param(bench, "workers") or LEGACY_WORKERS
    nbytes = extra.get("bytes") or _tree_bytes(tree)
    stats = bench["stats"]
    return Row(
        suite=suite,
        tree=tree,
        workers=int(workers),
        impl=str(impl),
        median_s=float(extra.get("median_s") or stats["median"]),
        nbytes=int(nbytes) if nbytes else None,
        rounds=int(stats.get("rounds", 0)),
    )


def _order(seq: tuple[str, ...], value: str) -> tuple[int, str]:
    return (seq.index(value) if value in seq else len(seq), value)


def load(paths: list[Path]) -> tuple[list[Row], dict[str, Any]]:
    merged: dict[str, Any] = {}
    benches: list[dict[str, Any]] = []
    for path in paths:
        data = json.loads(path.read_text())
        if not merged:
            merged = {k: v for k, v in data.items() if k != "benchmarks"}
        benches.extend(data.get("benchmarks", []))
    merged["benchmarks"] = benches
    rows = [parse(b) for b in benches if not _goal(b)]
    pmean = {(r.suite, r.tree, r.workers): r.median_s for r in rows if r.impl == "pmean"}
    for r in rows:
        base = pmean.get((r.suite, r.tree, r.workers))
        r.ratio = r.median_s / base if base else None
    rows.sort(
        key=lambda r: (
            r.suite != "sync_suite",
            r.suite,
            _order(TREE_ORDER, r.tree),
            r.workers,
            _order(IMPL_ORDER, r.impl),
        )
    )
    return rows, merged


def _goal(bench: dict[str, Any]) -> dict[str, Any] | None:
    """A goal of test_goals.py (its ``extra_info["goal"]``), or None."""
    return (bench.get("extra_info") or {}).get("goal")


def goals_markdown(benches: list[dict[str, Any]]) -> str:
    """Issue 39's goals measured by test_goals.py: one row each, "" if none ran."""
    goals = [g for g in map(_goal, benches) if g]
    return "\n".join(["", *goal_rows(goals)]) + "\n" if goals else ""


def goal_rows(goals: list[dict[str, Any]]) -> list[str]:
    """The goals as markdown table lines (a header, then one row each)."""
    lines = [
        "| goal | coarse / baseline (median of runs) | runs: lowest-highest | at most | | load |",
        "|---|---:|---|---:|---|---:|",
    ]
    for g in goals:
        met = "met" if g["ratio"] <= g["limit"] else "missed"
        lines.append(
            f"| {g['goal']} | {g['ratio']:.2f}x | {g['runs']}: {g['lo']:.2f}-{g['hi']:.2f} | "
            f"{g['limit']}x | {met} | {g['load']:.1f} |"
        )
    return lines


def markdown(rows: list[Row]) -> str:
    lines = [
        "| suite | tree | workers | impl | MiB | median ms | x pmean | busbw GB/s | rounds |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        mib = f"{r.nbytes / 2**20:.1f}" if r.nbytes else "-"
        ratio = f"{r.ratio:.2f}" if r.ratio is not None else "-"
        bw = f"{r.busbw_gbs:.2f}" if r.busbw_gbs is not None else "-"
        lines.append(
            f"| {r.suite} | {r.tree} | {r.workers} | {r.impl} | {mib} | "
            f"{r.median_s * 1e3:.1f} | {ratio} | {bw} | {r.rounds} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[Row], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in rows:
        groups[(r.suite, r.tree)].append(r)
    keys = list(groups)
    fig, axes = plt.subplots(
        2, len(keys), figsize=(4.6 * len(keys), 8), squeeze=False, constrained_layout=True
    )
    impls = sorted({r.impl for r in rows}, key=lambda i: _order(IMPL_ORDER, i))
    colors = {impl: f"C{i}" for i, impl in enumerate(impls)}
    for col, key in enumerate(keys):
        grp = groups[key]
        title = key[1] if key[0] == "sync_suite" else f"{key[1]} ({key[0]})"
        workers = sorted({r.workers for r in grp})
        here = [i for i in impls if any(r.impl == i for r in grp)]
        width = 0.8 / len(here)
        ax = axes[0][col]
        for j, impl in enumerate(here):
            by_p = {r.workers: r for r in grp if r.impl == impl}
            xs = [k + (j - (len(here) - 1) / 2) * width for k, p in enumerate(workers) if p in by_p]
            ys = [by_p[p].median_s * 1e3 for p in workers if p in by_p]
            ax.bar(xs, ys, width, label=impl, color=colors[impl])
        ax.set_xticks(range(len(workers)), [f"p={p}" for p in workers])
        ax.set_yscale("log")
        ax.set_ylabel("median ms per sync (log)")
        ax.set_title(title)
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8)
        ax = axes[1][col]
        for impl in here:
            pts = sorted((r.workers, r.busbw_gbs) for r in grp if r.impl == impl)
            pts = [(p, bw) for p, bw in pts if bw is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=impl, color=colors[impl])
        ax.set_xticks(workers)
        ax.set_xlabel("workers p")
        ax.set_ylabel("bus bandwidth GB/s")
        ax.set_title(f"{title}: busbw")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("gradient sync: median time and bus bandwidth per implementation")
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", type=Path, help="pytest-benchmark JSON file(s)")
    parser.add_argument("--markdown", type=Path, help="write the table here")
    parser.add_argument("--plot", type=Path, help="write the PNG here")
    parser.add_argument("--json-out", type=Path, help="write the merged JSON here")
    args = parser.parse_args(argv)
    rows, merged = load(args.json)
    if not rows and not goals_markdown(merged["benchmarks"]):
        raise SystemExit("report.py: no benchmarks in the given JSON.")
    table = markdown(rows) + goals_markdown(merged["benchmarks"])
    print(table, end="")
    if args.markdown:
        args.markdown.write_text(table)
    if args.plot and rows:
        plot(rows, args.plot)
    if args.json_out:
        args.json_out.write_text(json.dumps(merged, indent=1))


if __name__ == "__main__":
    main()
