"""Reports of a `Profile` a person reads: the text table and the bandwidth plot."""

from __future__ import annotations

import math
import os

import numpy as np

from coarse_jax.profiling.links import LinkProfile, fmt_bytes
from coarse_jax.profiling.rounds import DECISION_CONFIDENCE, DECISION_MARGIN
from coarse_jax.profiling.routing import ROUTE_TIE_RTOL, routes_from_profile, threshold_bytes


def title(profile: LinkProfile) -> str:
    """One line naming what was measured: topology, workers (proxies at k:1), time scale, host."""
    topo = profile.topology if profile.topology is not None else "host devices"
    proxies = f", {profile.proxies} proxies" if profile.proxies != profile.workers else ""
    extra = f", time_scale {profile.time_scale:g}" if profile.time_scale != 1.0 else ""
    host = f" on {profile.host}" if profile.host else ""
    return f"{topo}: {profile.workers} workers{proxies}{extra}{host}"


def table(profile: LinkProfile) -> str:
    """A readable text summary: latency (us) / peak bandwidth (GB/s) of every link.

    One row per worker with its link to each of the q proxies (``*`` marks
    the local proxy; LatProxy/BwProxy as the planner picks them), then each
    proxy's neighbours in the proxies' ring (of q) and each worker's in the
    workers' ring (of p). Then what each routing decision rests on
    (`Profile.decisions`): ``measured`` (clear by the margin), ``model``
    (not clear within the budget: the emulated topology's own choice),
    ``local`` (not clear, no model: the local proxy) or ``unclear`` (a
    threshold between the medians, no model), with the evidence of every
    decision that is not ``measured``.
    """
    p, q = profile.workers, profile.proxies
    lat, bw = profile.link("wp", "latency_us"), profile.link("wp", "bandwidth_gbps")
    bidir = profile.link("wp", "bidir_bandwidth_gbps")
    routes = routes_from_profile(profile)
    span = f"{fmt_bytes(profile.sizes[0])}..{fmt_bytes(profile.sizes[-1])}"
    lines = [
        f"Profile {title(profile)}; sizes {span} ({len(profile.sizes)} sizes)",
        "worker -> proxy: latency us / peak bandwidth GB/s (one way; bidir = push+pull peak)",
    ]
    cells = [f"proxy {k}" for k in range(q)]
    lines.append("          " + "  ".join(f"{c:>18}" for c in cells) + "  lat/bw proxy  threshold")
    for i in range(p):
        row = []
        local = profile.local_proxy(i)
        for k in range(q):
            mark = "*" if k == local else " "
            row.append(f"{lat[i, k]:7.2f}/{bw[i, k]:8.3f}{mark:>1} ")
        th = threshold_bytes(profile, i)
        th_s = "-" if th is None else f"{th} B ({fmt_bytes(th)})"
        lines.append(
            f"worker {i:<3}"
            + "  ".join(f"{c:>18}" for c in row)
            + f"  {routes[i][0]:>4}/{routes[i][1]:<4}     {th_s}"
        )
        lines.append(" bidir    " + "  ".join(f"{'':7} {bidir[i, k]:8.3f}  " for k in range(q)))
    for label, dev, n, kind in (
        ("proxy ring", "proxy", q, "pp"),
        ("worker ring", "worker", p, "ww"),
    ):
        lat_m, bw_m = profile.link(kind, "latency_us"), profile.link(kind, "bandwidth_gbps")
        lines.append(f"{label}: latency us / peak bandwidth GB/s to next, previous neighbour")
        for k in range(n):
            lines.append(
                f"{dev} {k:<3} -> {(k + 1) % n}: {lat_m[k, 0]:7.2f}/{bw_m[k, 0]:8.3f}   "
                f"-> {(k - 1) % n}: {lat_m[k, 1]:7.2f}/{bw_m[k, 1]:8.3f}"
            )
    if profile.wp_spread is None:
        lines.append("measurement spread: unknown (not recorded in this profile)")
    else:
        worst = np.unravel_index(int(np.argmax(profile.wp_spread)), profile.wp_spread.shape)
        tie = (
            f"links closer than max({100 * ROUTE_TIE_RTOL:.0f}%, 2x their spread) count as tied"
            if profile.decisions is None
            else "routing decides from repeated rounds, below"
        )
        lines.append(
            "measurement spread (median repetition over the fastest, worker -> proxy): "
            f"median {100 * float(np.median(profile.wp_spread)):.1f}%, max "
            f"{100 * float(profile.wp_spread.max()):.1f}% (worker {worst[0]} -> proxy {worst[1]}, "
            f"{fmt_bytes(profile.sizes[worst[2]])}); {tie}"
        )
    lines.extend(_decision_lines(profile))
    return "\n".join(lines)


def _decision_lines(profile: LinkProfile) -> list[str]:
    """What each routing decision rests on, and the evidence where it is not the measurements."""
    if profile.decisions is None:
        return ["routing decisions: from the times alone (this profile records none)"]
    model = profile.topology or "topology"
    lines = [
        f"routing decisions: measured = clear by {DECISION_MARGIN:.0%} at "
        f"{DECISION_CONFIDENCE:.0%} confidence over repeated, interleaved rounds; model = not "
        f"clear within the budget, the {model} model's choice; local = not clear, no model"
    ]
    unclear = []
    for i in range(profile.workers):
        parts = []
        for kind in ("latency", "bandwidth", "threshold"):
            d = profile.decision(i, kind)
            assert d is not None
            value = "none" if d.choice is None else (
                f"{d.choice} B" if kind == "threshold" else f"proxy {d.choice}"
            )  # fmt: skip
            parts.append(f"{kind} {value} ({d.basis})")
            if d.basis != "measured":
                unclear.append(f"  worker {i} {kind}: {d.detail}")
        lines.append(f"worker {i:<3} " + ", ".join(parts))
    if unclear:
        lines.append(f"{len(unclear)} decision(s) not clear from the measurements:")
        lines.extend(unclear)
    else:
        lines.append("every decision is clear from the measurements")
    return lines


def plot(profile: LinkProfile, path: str | os.PathLike[str]) -> None:
    """Write a PNG of bandwidth (GB/s) against transfer size (log x) to ``path``.

    One subplot per worker (a line per each of the q proxies, the local one
    solid and thicker), then one for the proxy ring and one for the worker ring.

    Raises:
      ImportError: matplotlib is not installed.
    """
    # The object-oriented API with the Agg canvas draws without pyplot, so
    # it neither needs a display nor changes the caller's global backend.
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(
            "Profile.plot needs matplotlib; install it (pip install matplotlib) or use "
            "Profile.table() for a text summary."
        ) from e
    p, q = profile.workers, profile.proxies
    n = p + 2
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(4.2 * cols, 3.3 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False).reshape(-1)
    sizes = np.asarray(profile.sizes)
    wp = profile.link("wp", "bandwidth_curve_gbps")
    routes = routes_from_profile(profile)
    for i in range(p):
        ax = axes[i]
        local = profile.local_proxy(i)
        for k in range(q):
            tags = [t for t, v in (("lat", routes[i][0]), ("bw", routes[i][1])) if v == k]
            label = f"proxy {k}" + (" (local)" if k == local else "")
            label += f" [{'+'.join(tags)}]" if tags else ""
            # Equal remote links draw on top of each other: keep the
            # proxies the planner picked visible above the rest.
            ax.plot(
                sizes,
                wp[i, k],
                marker="o",
                markersize=3,
                linewidth=2.2 if k == local else 1.2,
                linestyle="-" if k == local else "--",
                label=label,
                zorder=3 if tags else 2,
            )
        th = threshold_bytes(profile, i)
        if th is not None:
            ax.axvline(th, color="grey", linewidth=0.8, linestyle=":", label="threshold")
        ax.set_title(f"worker {i} -> proxies")
    for ax, name, curve, dev, ring in (
        (axes[p], "proxy ring", profile.link("pp", "bandwidth_curve_gbps"), "proxy", q),
        (axes[p + 1], "worker ring", profile.link("ww", "bandwidth_curve_gbps"), "worker", p),
    ):
        for k in range(ring):
            ax.plot(
                sizes, curve[k, 0], marker="o", markersize=3, label=f"{dev} {k}->{(k + 1) % ring}"
            )
            if ring > 2:  # in a ring of 2 or fewer "previous" is the same neighbour as "next"
                ax.plot(
                    sizes,
                    curve[k, 1],
                    marker="x",
                    markersize=3,
                    linestyle="--",
                    label=f"{dev} {k}->{(k - 1) % ring}",
                )
        ax.set_title(name)
    for ax in axes[:n]:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("transfer size (bytes)")
        ax.set_ylabel("bandwidth (GB/s)")
        ax.set_ylim(bottom=0)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize="x-small", loc="upper left")
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.suptitle(f"COARSE link profile: {title(profile)}")
    fig.savefig(path, format="png", dpi=100)
