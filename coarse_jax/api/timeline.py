"""`SyncedStep.timeline`: what every device did in a synchronization, as spans.

With ``Config(trace=True)`` the runtime records, per device, a span for each
phase (``push``, ``proxy ring``, ``worker ring``, ``pull``) and inside it one
per piece and step of the protocol (``push piece``, ``wait for pushes``,
``sum pushes``, ``reduce-scatter``, ``optimizer``, ``all-gather``, ``wait for
the reduced piece``, ``pull piece``, ...), with host steady-clock times and the
bytes moved (ffi/runtime/trace.h). A device's spans nest. `Timeline.to_chrome`
writes the Chrome trace-event JSON that chrome://tracing and ui.perfetto.dev
open: one process per synchronization (step, site), one thread per device.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Span:
    """One thing one device did: [begin_us, end_us) in microseconds from the first span."""

    device: int  # worker i -> i, proxy k -> p + k
    workers: int
    name: str
    piece: int  # -1: not about one piece
    bytes: int
    step: int
    site: int
    iteration: int
    begin_us: float
    end_us: float

    @property
    def who(self) -> str:
        """ "worker 0" or "proxy 1"."""
        return (
            f"worker {self.device}"
            if self.device < self.workers
            else f"proxy {self.device - self.workers}"
        )


@dataclasses.dataclass(frozen=True)
class Timeline:
    """The spans of the synchronizations since the previous `SyncedStep.timeline` call."""

    spans: tuple[Span, ...]

    @classmethod
    def from_runtime(cls, raw: Iterable[tuple[Any, ...]]) -> Timeline:
        rows = list(raw)
        t0 = min((r[8] for r in rows), default=0)
        spans = [
            Span(
                int(d),
                int(w),
                str(n),
                int(pc),
                int(b),
                int(st),
                int(si),
                int(it),
                (b0 - t0) / 1e3,
                (b1 - t0) / 1e3,
            )
            for d, w, n, pc, b, st, si, it, b0, b1 in rows
        ]
        return cls(tuple(sorted(spans, key=lambda s: (s.begin_us, -s.end_us))))

    def steps(self) -> list[tuple[int, int, int]]:
        """The (step, site, iteration) of each synchronization recorded, in order."""
        return sorted({(s.step, s.site, s.iteration) for s in self.spans})

    def of(self, step: int, site: int = 0, iteration: int = 0) -> Timeline:
        """The spans of one synchronization."""
        keep = (step, site, iteration)
        return Timeline(tuple(s for s in self.spans if (s.step, s.site, s.iteration) == keep))

    def to_chrome(self, path: str | None = None) -> dict[str, Any]:
        """The Chrome trace-event JSON object (written to ``path`` if given)."""
        events: list[dict[str, Any]] = []
        pids: dict[tuple[int, int, int], int] = {}
        for s in self.spans:
            key = (s.step, s.site, s.iteration)
            if key not in pids:
                pids[key] = len(pids)
                name = f"sync site {s.site}, step {s.step}" + (
                    f", iteration {s.iteration}" if s.iteration else ""
                )
                events.append(
                    {"ph": "M", "name": "process_name", "pid": pids[key], "args": {"name": name}}
                )
            events.append(
                {
                    "ph": "X",
                    "name": s.name if s.piece < 0 else f"{s.name} {s.piece}",
                    "cat": s.name,
                    "pid": pids[key],
                    "tid": s.device,
                    "ts": s.begin_us,
                    "dur": max(s.end_us - s.begin_us, 0.0),
                    "args": {"piece": s.piece, "bytes": s.bytes, "device": s.who},
                }
            )
        devices = sorted({(s.device, s.who) for s in self.spans})
        for pid in pids.values():
            for device, who in devices:
                events.append(
                    {
                        "ph": "M",
                        "name": "thread_name",
                        "pid": pid,
                        "tid": device,
                        "args": {"name": who},
                    }
                )
        trace = {"traceEvents": events, "displayTimeUnit": "ms"}
        if path is not None:
            with open(path, "w") as f:
                json.dump(trace, f)
        return trace

    def plot(self, path: str) -> None:
        """A PNG of the spans, one row per device, nested spans drawn thinner."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        devices = sorted({(s.device, s.who) for s in self.spans})
        row = {d: i for i, (d, _) in enumerate(devices)}
        names = sorted({s.name for s in self.spans})
        colors = {n: plt.get_cmap("tab20")(i % 20) for i, n in enumerate(names)}
        fig, ax = plt.subplots(figsize=(12, 0.5 + 0.45 * len(devices)))
        depth: dict[int, list[float]] = {}
        t0 = min((s.begin_us for s in self.spans), default=0.0)
        for s in self.spans:  # sorted by start, longest first: parents before children
            stack = [e for e in depth.get(s.device, []) if e > s.begin_us]
            level = len(stack)
            depth[s.device] = [*stack, s.end_us]
            height = 0.8 / (1 + level)
            ax.broken_barh(
                [((s.begin_us - t0) / 1e3, max(s.end_us - s.begin_us, 1e-3) / 1e3)],
                (row[s.device] - height / 2, height),
                facecolors=colors[s.name],
                edgecolor="none",
            )
        ax.set_yticks(range(len(devices)), [w for _, w in devices])
        ax.invert_yaxis()
        ax.set_xlabel("ms from the first span")
        handles = [plt.Rectangle((0, 0), 1, 1, color=colors[n]) for n in names]
        ax.legend(
            handles, names, fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.25)
        )
        ax.set_title("coarse_jax timeline (Config(trace=True))")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
