"""`Profile`: link measurements of one mesh, and the planner that turns them into a `Config`.

The paper's profiler (Section III-E, "Dynamic Partitioning") measures, for every
client (worker), the latency and bandwidth to each proxy, then:

* picks the proxy with the lowest latency (*LatProxy*) and the one with the
  highest bandwidth (*BwProxy*);
* if they differ, finds the size ``S`` where ``T_LatProxy(S) = T_BwProxy(S)``:
  smaller tensors go to *LatProxy*, larger ones to *BwProxy*;
* finds the smallest measured size ``S'`` that reaches full bandwidth to
  *BwProxy*: large tensors are cut into ``S'``-sized shards.

This module holds the data (`Profile`, saved as JSON) and that planner
(`routes_from_profile`, `threshold_bytes`, `shard_bytes_from_profile`,
`config_from_profile`). Taking the measurements is `coarse_jax.profiler`'s job.

Units: times are seconds, sizes bytes, latencies microseconds, bandwidths GB/s
(1e9 bytes/s), as in `coarse.Topology`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
from typing import Any

import numpy as np

from coarse_jax.config import Config

FORMAT = "coarse_jax.profile/1"

# Fraction of a link's peak bandwidth that counts as "full bandwidth" when
# choosing the shard size: measured curves approach their peak asymptotically,
# so demanding 100% would always pick the largest size measured.
FULL_BANDWIDTH_FRACTION = 0.95

# Relative tolerance under which two latencies/bandwidths count as a tie, so
# float rounding in size/time does not pick a remote proxy over the local one.
_TIE_RTOL = 1e-9
# Route choices treat measurements within 10% of the best as equal: a small
# probe's time is mostly host overhead (thread wake-ups), which varies by
# that much between identical links.
ROUTE_TIE_RTOL = 0.10

# (field name, shape as a function of p and S, what the axes are) for the error messages.
_ARRAY_FIELDS: tuple[tuple[str, str], ...] = (
    ("wp_oneway_s", "wp"),
    ("wp_bidir_s", "wp"),
    ("pp_oneway_s", "ring"),
    ("pp_bidir_s", "ring"),
    ("ww_oneway_s", "ring"),
)


def _shape(kind: str, p: int, s: int) -> tuple[int, int, int]:
    return (p, p, s) if kind == "wp" else (p, 2, s)


@dataclasses.dataclass(frozen=True, eq=False)
class Profile:
    """Measured transfer times of one mesh's links: ``p`` workers and ``p`` proxies.

    Every time array's last axis follows ``sizes``. Ring arrays (``pp_*``,
    ``ww_*``) have shape ``[p, 2, S]``: index 0 of the middle axis is the link
    from device ``k`` to its ring neighbour ``(k + 1) % p``, index 1 to
    ``(k - 1) % p``.

    Equality: ``==`` compares every field exactly (arrays with
    ``np.array_equal``); use `allclose` to compare measurements up to a
    tolerance (e.g. after a JSON round trip through other tools). Profiles are
    not hashable (they hold arrays); the arrays are read-only.

    Attributes:
      workers: p.
      sizes: transfer sizes measured, bytes, strictly ascending.
      wp_oneway_s: ``[p, p, S]`` median seconds to move ``sizes[j]`` bytes from
        worker ``i`` to proxy ``k``, one direction.
      wp_bidir_s: ``[p, p, S]`` seconds until both a push worker ``i`` -> proxy
        ``k`` and a pull proxy ``k`` -> worker ``i`` of that size, run
        concurrently, are done.
      pp_oneway_s: ``[p, 2, S]`` proxy ``k`` to its ring neighbours, one direction.
      pp_bidir_s: ``[p, 2, S]`` proxy ``k`` to and from its ring neighbours, concurrently.
      ww_oneway_s: ``[p, 2, S]`` worker ``k`` to its ring neighbours (the
        workers' AllReduce ring), one direction.
      topology: name of the emulated topology measured, ``None`` for the host's
        real devices.
      time_scale: the emulated topology's ``time_scale`` during the
        measurement. Times are stored as measured (wall clock), not divided by it.
      host: free text describing where it was measured.
      wp_spread: ``[p, p, S]`` how noisy each ``wp_oneway_s`` measurement was:
        the median repetition's excess over the fastest, relative to it
        (outliers dropped; `coarse_jax.profiler.robust_time`); ``None`` when
        unknown (a profile written by hand or by an older version). Routing
        treats links whose difference is within this noise as tied.

    Raises:
      ValueError: a field with the wrong shape, order or range (the message
        names the field, what was expected and what it got).
      TypeError: ``host`` is not a str.

    Example:
      >>> prof = Profile.load("v100.json")
      >>> print(prof.table())
      >>> cfg = config_from_profile(prof, leading_bytes=64 << 10)
    """

    workers: int
    sizes: tuple[int, ...]
    wp_oneway_s: np.ndarray
    wp_bidir_s: np.ndarray
    pp_oneway_s: np.ndarray
    pp_bidir_s: np.ndarray
    ww_oneway_s: np.ndarray
    topology: str | None = None
    time_scale: float = 1.0
    host: str = ""
    wp_spread: np.ndarray | None = None

    def __post_init__(self) -> None:
        p = self.workers
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1:
            raise ValueError(f"Profile.workers: expected a positive int, got {p!r}.")
        object.__setattr__(self, "workers", int(p))
        sizes = tuple(self.sizes)
        if not sizes:
            raise ValueError("Profile.sizes: expected at least one size (bytes), got none.")
        for s in sizes:
            if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1:
                raise ValueError(
                    f"Profile.sizes: expected positive ints (bytes), got {s!r} in {sizes!r}."
                )
        sizes = tuple(int(s) for s in sizes)
        if any(b <= a for a, b in itertools.pairwise(sizes)):
            raise ValueError(
                f"Profile.sizes: expected strictly ascending sizes, got {sizes!r}; sort them "
                "(and the time arrays' last axis with them) and drop duplicates."
            )
        object.__setattr__(self, "sizes", sizes)
        for name, kind in _ARRAY_FIELDS:
            expected = _shape(kind, p, len(sizes))
            try:
                # Copy so the caller's buffer cannot change a frozen profile behind its back.
                arr = np.array(getattr(self, name), dtype=np.float64, copy=True)
            except (TypeError, ValueError) as e:
                raise ValueError(
                    f"Profile.{name}: expected a numeric array of shape {expected}, got "
                    f"something numpy cannot read as one ({e})."
                ) from None
            if arr.shape != expected:
                axes = "[worker, proxy, size]" if kind == "wp" else "[device, (next, prev), size]"
                raise ValueError(
                    f"Profile.{name}: expected shape {expected} {axes} for workers={p} and "
                    f"{len(sizes)} sizes, got {arr.shape}."
                )
            if not (np.isfinite(arr).all() and (arr > 0).all()):
                bad = np.argwhere(~(np.isfinite(arr) & (arr > 0)))[0]
                raise ValueError(
                    f"Profile.{name}: expected finite times > 0 s, got "
                    f"{arr[tuple(bad)]!r} at index {tuple(int(v) for v in bad)}; re-measure "
                    "that link (a zero or negative time means the timer did not cover the transfer)."
                )
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        if self.topology is not None and not isinstance(self.topology, str):
            raise ValueError(
                f"Profile.topology: expected a topology name (str) or None, got {self.topology!r}."
            )
        scale = self.time_scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
            raise ValueError(f"Profile.time_scale: expected a number > 0, got {scale!r}.")
        object.__setattr__(self, "time_scale", float(scale))
        if not isinstance(self.host, str):
            raise TypeError(f"Profile.host: expected free text (str), got {self.host!r}.")
        if self.wp_spread is not None:
            spread = np.array(self.wp_spread, dtype=np.float64, copy=True)
            want = _shape("wp", p, len(sizes))
            if spread.shape != want or not (np.isfinite(spread).all() and (spread >= 0).all()):
                raise ValueError(
                    f"Profile.wp_spread: expected finite relative spreads >= 0 of shape {want} "
                    f"[worker, proxy, size], or None; got shape {spread.shape}."
                )
            spread.setflags(write=False)
            object.__setattr__(self, "wp_spread", spread)

    # ---------------------------------------------------------------- equality

    def _scalars(self) -> tuple[Any, ...]:
        return (self.workers, self.sizes, self.topology, self.time_scale, self.host)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Profile):
            return NotImplemented
        if (self.wp_spread is None) != (other.wp_spread is None):
            return False
        if self.wp_spread is not None and not np.array_equal(self.wp_spread, other.wp_spread):
            return False
        return self._scalars() == other._scalars() and all(
            np.array_equal(getattr(self, n), getattr(other, n)) for n, _ in _ARRAY_FIELDS
        )

    __hash__ = None  # type: ignore[assignment]  # holds arrays; see the class docstring

    def allclose(self, other: Profile, rtol: float = 1e-9, atol: float = 0.0) -> bool:
        """Whether ``other`` has the same mesh, sizes and labels, and times within tolerance.

        Args:
          other: the profile to compare with.
          rtol, atol: as in `numpy.allclose`, applied to every time array.
        """
        if not isinstance(other, Profile):
            raise TypeError(f"Profile.allclose: expected a Profile, got {type(other).__name__}.")
        if self.workers != other.workers or self.sizes != other.sizes:
            return False
        if (self.topology, self.host) != (other.topology, other.host):
            return False
        if not math.isclose(self.time_scale, other.time_scale, rel_tol=rtol, abs_tol=atol):
            return False
        return all(
            np.allclose(getattr(self, n), getattr(other, n), rtol=rtol, atol=atol)
            for n, _ in _ARRAY_FIELDS
        )

    # ---------------------------------------------------------------- derived

    def _sizes_f(self) -> np.ndarray:
        return np.asarray(self.sizes, dtype=np.float64)

    def _peak_gbps(self, times: np.ndarray, bytes_per_transfer: float = 1.0) -> np.ndarray:
        return (bytes_per_transfer * self._sizes_f() / times).max(axis=-1) / 1e9

    def wp_bandwidth_curve_gbps(self) -> np.ndarray:
        """``[p, p, S]`` one-way worker -> proxy bandwidth at each size, GB/s."""
        return self._sizes_f() / self.wp_oneway_s / 1e9

    def pp_bandwidth_curve_gbps(self) -> np.ndarray:
        """``[p, 2, S]`` one-way proxy -> ring neighbour bandwidth at each size, GB/s."""
        return self._sizes_f() / self.pp_oneway_s / 1e9

    def ww_bandwidth_curve_gbps(self) -> np.ndarray:
        """``[p, 2, S]`` one-way worker -> ring neighbour bandwidth at each size, GB/s."""
        return self._sizes_f() / self.ww_oneway_s / 1e9

    def wp_latency_us(self) -> np.ndarray:
        """``[p, p]`` worker -> proxy one-way time at the smallest size, microseconds."""
        return self.wp_oneway_s[..., 0] * 1e6

    def wp_bandwidth_gbps(self) -> np.ndarray:
        """``[p, p]`` worker -> proxy one-way peak over sizes of size/time, GB/s."""
        return self._peak_gbps(self.wp_oneway_s)

    def bidir_bandwidth_gbps(self) -> np.ndarray:
        """``[p, p]`` worker <-> proxy peak of 2 * size / time (push and pull together), GB/s."""
        return self._peak_gbps(self.wp_bidir_s, 2.0)

    def pp_latency_us(self) -> np.ndarray:
        """``[p, 2]`` proxy -> (next, previous) ring neighbour one-way time at the smallest size, us."""
        return self.pp_oneway_s[..., 0] * 1e6

    def pp_bandwidth_gbps(self) -> np.ndarray:
        """``[p, 2]`` proxy -> (next, previous) ring neighbour one-way peak bandwidth, GB/s."""
        return self._peak_gbps(self.pp_oneway_s)

    def pp_bidir_bandwidth_gbps(self) -> np.ndarray:
        """``[p, 2]`` proxy <-> ring neighbour peak of 2 * size / time, GB/s."""
        return self._peak_gbps(self.pp_bidir_s, 2.0)

    def ww_latency_us(self) -> np.ndarray:
        """``[p, 2]`` worker -> (next, previous) ring neighbour one-way time at the smallest size, us."""
        return self.ww_oneway_s[..., 0] * 1e6

    def ww_bandwidth_gbps(self) -> np.ndarray:
        """``[p, 2]`` worker -> (next, previous) ring neighbour one-way peak bandwidth, GB/s."""
        return self._peak_gbps(self.ww_oneway_s)

    # ---------------------------------------------------------------- JSON

    def to_json_dict(self) -> dict[str, Any]:
        """The profile as plain JSON values (arrays as nested lists), with its ``format`` tag."""
        out: dict[str, Any] = {
            "format": FORMAT,
            "workers": self.workers,
            "sizes": list(self.sizes),
            "topology": self.topology,
            "time_scale": self.time_scale,
            "host": self.host,
        }
        for name, _ in _ARRAY_FIELDS:
            out[name] = getattr(self, name).tolist()
        if self.wp_spread is not None:
            out["wp_spread"] = self.wp_spread.tolist()
        return out

    @staticmethod
    def from_json_dict(data: Any, source: str = "profile") -> Profile:
        """Inverse of `to_json_dict`.

        Args:
          data: the decoded JSON object.
          source: names the origin (a path) in error messages.

        Raises:
          ValueError: not a ``coarse_jax.profile/1`` object, a missing field, or
            values `Profile` rejects.
        """
        if not isinstance(data, dict):
            # A file holding the wrong JSON is bad content, like a wrong "format": one error type.
            raise ValueError(  # noqa: TRY004
                f"{source}: expected a JSON object with \"format\": {FORMAT!r}, got a "
                f"{type(data).__name__}; was it written by Profile.save?"
            )
        fmt = data.get("format")
        if fmt != FORMAT:
            raise ValueError(
                f"{source}: expected \"format\": {FORMAT!r}, got {fmt!r}; write it with "
                "Profile.save (or re-run the profiler with this version of coarse_jax)."
            )
        required = ["workers", "sizes"] + [n for n, _ in _ARRAY_FIELDS]
        missing = [k for k in required if k not in data]
        if missing:
            raise ValueError(
                f"{source}: missing field(s) {missing} of {FORMAT!r}; the file is truncated or "
                "was not written by Profile.save."
            )
        try:
            return Profile(
                workers=data["workers"],
                sizes=tuple(data["sizes"]),
                **{n: data[n] for n, _ in _ARRAY_FIELDS},
                topology=data.get("topology"),
                time_scale=data.get("time_scale", 1.0),
                host=data.get("host", ""),
                wp_spread=data.get("wp_spread"),
            )
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the profile as JSON to ``path`` (see `load`)."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json_dict(), f, indent=1)
            f.write("\n")

    @staticmethod
    def load(path: str | os.PathLike[str]) -> Profile:
        """Read a profile written by `save`.

        Raises:
          ValueError: the file is not JSON, or not a valid ``coarse_jax.profile/1`` profile.
          OSError: the file cannot be read.
        """
        with open(path, encoding="utf-8") as f:
            text = f.read()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"Profile.load({os.fspath(path)!r}): expected JSON written by Profile.save, "
                f"got invalid JSON ({e})."
            ) from None
        return Profile.from_json_dict(data, source=f"Profile.load({os.fspath(path)!r})")

    # ---------------------------------------------------------------- reports

    def _title(self) -> str:
        topo = self.topology if self.topology is not None else "host devices"
        extra = f", time_scale {self.time_scale:g}" if self.time_scale != 1.0 else ""
        host = f" on {self.host}" if self.host else ""
        return f"{topo}: {self.workers} workers{extra}{host}"

    def table(self) -> str:
        """A readable text summary: latency (us) / peak bandwidth (GB/s) of every link.

        One row per worker with its link to each proxy (``*`` marks the local
        proxy; LatProxy/BwProxy as the planner picks them), then each proxy's
        and each worker's ring neighbours.
        """
        p = self.workers
        lat, bw = self.wp_latency_us(), self.wp_bandwidth_gbps()
        bidir = self.bidir_bandwidth_gbps()
        routes = routes_from_profile(self)
        span = f"{_fmt_bytes(self.sizes[0])}..{_fmt_bytes(self.sizes[-1])}"
        lines = [
            f"Profile {self._title()}; sizes {span} ({len(self.sizes)} sizes)",
            "worker -> proxy: latency us / peak bandwidth GB/s (one way; bidir = push+pull peak)",
        ]
        cells = [f"proxy {k}" for k in range(p)]
        lines.append("          " + "  ".join(f"{c:>18}" for c in cells) + "  lat/bw proxy  threshold")
        for i in range(p):
            row = []
            for k in range(p):
                mark = "*" if k == i else " "
                row.append(f"{lat[i, k]:7.2f}/{bw[i, k]:8.3f}{mark:>1} ")
            th = threshold_bytes(self, i)
            th_s = "-" if th is None else f"{th} B ({_fmt_bytes(th)})"
            lines.append(
                f"worker {i:<3}" + "  ".join(f"{c:>18}" for c in row)
                + f"  {routes[i][0]:>4}/{routes[i][1]:<4}     {th_s}"
            )
            lines.append(
                " bidir    " + "  ".join(f"{'':7} {bidir[i, k]:8.3f}  " for k in range(p))
            )
        for label, dev, lat_m, bw_m in (
            ("proxy ring", "proxy", self.pp_latency_us(), self.pp_bandwidth_gbps()),
            ("worker ring", "worker", self.ww_latency_us(), self.ww_bandwidth_gbps()),
        ):
            lines.append(f"{label}: latency us / peak bandwidth GB/s to next, previous neighbour")
            for k in range(p):
                lines.append(
                    f"{dev} {k:<3} -> {(k + 1) % p}: {lat_m[k, 0]:7.2f}/{bw_m[k, 0]:8.3f}   "
                    f"-> {(k - 1) % p}: {lat_m[k, 1]:7.2f}/{bw_m[k, 1]:8.3f}"
                )
        if self.wp_spread is None:
            lines.append("measurement spread: unknown (not recorded in this profile)")
        else:
            worst = np.unravel_index(int(np.argmax(self.wp_spread)), self.wp_spread.shape)
            lines.append(
                "measurement spread (median repetition over the fastest, worker -> proxy): "
                f"median {100 * float(np.median(self.wp_spread)):.1f}%, max "
                f"{100 * float(self.wp_spread.max()):.1f}% (worker {worst[0]} -> proxy {worst[1]}, "
                f"{_fmt_bytes(self.sizes[worst[2]])}); links closer than "
                f"max({100 * ROUTE_TIE_RTOL:.0f}%, 2x their spread) count as tied"
            )
        return "\n".join(lines)

    def plot(self, path: str | os.PathLike[str]) -> None:
        """Write a PNG of bandwidth (GB/s) against transfer size (log x) to ``path``.

        One subplot per worker (a line per proxy, the local one solid and
        thicker), then one for the proxy ring and one for the worker ring.

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
        p = self.workers
        n = p + 2
        cols = min(n, 4)
        rows = math.ceil(n / cols)
        fig = Figure(figsize=(4.2 * cols, 3.3 * rows), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(rows, cols, squeeze=False).reshape(-1)
        sizes = np.asarray(self.sizes)
        wp = self.wp_bandwidth_curve_gbps()
        routes = routes_from_profile(self)
        for i in range(p):
            ax = axes[i]
            for k in range(p):
                tags = [t for t, v in (("lat", routes[i][0]), ("bw", routes[i][1])) if v == k]
                label = f"proxy {k}" + (" (local)" if k == i else "")
                label += f" [{'+'.join(tags)}]" if tags else ""
                # Equal remote links draw on top of each other: keep the
                # proxies the planner picked visible above the rest.
                ax.plot(
                    sizes, wp[i, k], marker="o", markersize=3,
                    linewidth=2.2 if k == i else 1.2, linestyle="-" if k == i else "--",
                    label=label, zorder=3 if tags else 2,
                )
            th = threshold_bytes(self, i)
            if th is not None:
                ax.axvline(th, color="grey", linewidth=0.8, linestyle=":", label="threshold")
            ax.set_title(f"worker {i} -> proxies")
        for ax, title, curve, dev in (
            (axes[p], "proxy ring", self.pp_bandwidth_curve_gbps(), "proxy"),
            (axes[p + 1], "worker ring", self.ww_bandwidth_curve_gbps(), "worker"),
        ):
            for k in range(p):
                ax.plot(sizes, curve[k, 0], marker="o", markersize=3, label=f"{dev} {k}->{(k + 1) % p}")
                if p > 2:  # with p <= 2 "previous" is the same neighbour as "next"
                    ax.plot(sizes, curve[k, 1], marker="x", markersize=3, linestyle="--",
                            label=f"{dev} {k}->{(k - 1) % p}")
            ax.set_title(title)
        for ax in axes[:n]:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("transfer size (bytes)")
            ax.set_ylabel("bandwidth (GB/s)")
            ax.set_ylim(bottom=0)
            ax.grid(True, which="major", alpha=0.3)
            ax.legend(fontsize="x-small", loc="upper left")
        for ax in axes[n:]:
            ax.set_visible(False)
        fig.suptitle(f"COARSE link profile: {self._title()}")
        fig.savefig(path, format="png", dpi=100)


def _fmt_bytes(n: float) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}B"


# -------------------------------------------------------------------- planner


def _pick(values: np.ndarray, local: int, best: str, spread: np.ndarray | None = None) -> int:
    """Index of the best value (``best``: "min" or "max").

    Values within `ROUTE_TIE_RTOL` of the best, or within twice the larger of
    the two measurements' relative ``spread`` (their noise), are ties. Ties go
    to ``local`` first: it shares the worker's switch and disturbs no other
    worker's links. Then to ``local + 1``, ``local + 2``, ...
    (mod p): on a symmetric machine this gives every worker a different
    remote proxy, where "lowest index" would send every worker's large
    tensors to the same proxy and queue them on its one port.
    """
    p = len(values)
    best_k = int(np.argmin(values) if best == "min" else np.argmax(values))
    target = values[best_k]
    noise = np.zeros(p) if spread is None else np.maximum(spread, spread[best_k])
    rtol = np.maximum(ROUTE_TIE_RTOL, 2 * noise)
    tied = set(np.flatnonzero(np.abs(values - target) <= rtol * np.abs(target)).tolist())
    return next((local + k) % p for k in range(p) if (local + k) % p in tied)


def _check_worker(profile: Profile, worker: int, fn: str) -> None:
    if isinstance(worker, bool) or not isinstance(worker, (int, np.integer)):
        raise TypeError(f"{fn}: worker must be an int index, got {worker!r}.")
    if not 0 <= worker < profile.workers:
        raise ValueError(
            f"{fn}: worker must be in 0..{profile.workers - 1} (the profile's workers), got {worker}."
        )


def _route(profile: Profile, worker: int) -> tuple[int, int]:
    spread = profile.wp_spread
    lat = _pick(profile.wp_latency_us()[worker], worker, "min",
                None if spread is None else spread[worker, :, 0])
    # Bandwidth: the noise of each link's measurement at its peak size.
    peak_at = np.argmax(profile.wp_bandwidth_curve_gbps()[worker], axis=-1)
    bw = _pick(profile.wp_bandwidth_gbps()[worker], worker, "max",
               None if spread is None else spread[worker, np.arange(profile.workers), peak_at])
    return lat, bw


def routes_from_profile(profile: Profile) -> tuple[tuple[int, int], ...]:
    """Per worker ``(LatProxy, BwProxy)``, as `Config.routes` takes them.

    LatProxy has the lowest one-way latency (time at the smallest size),
    BwProxy the highest peak one-way bandwidth. Ties (within 10%, or within
    twice the measurements' spread where the profile recorded it, so noise
    never decides) go to the worker's local proxy (same index), then to the
    next indices cyclically.
    """
    return tuple(_route(profile, i) for i in range(profile.workers))


def threshold_bytes(profile: Profile, worker: int) -> int | None:
    """Size ``S`` where ``T_LatProxy(S) = T_BwProxy(S)`` for ``worker``; ``None`` if the proxies agree.

    Tensors smaller than ``S`` go to the LatProxy. ``S`` is linearly
    interpolated (in size) between the two measured sizes where
    ``T_Lat - T_Bw`` changes sign (the first such change), rounded to the
    nearest byte. Edge cases:

    * ``T_Bw <= T_Lat`` already at the smallest size: the smallest size
      (nothing measured is latency-bound).
    * ``T_Lat < T_Bw`` at every size: the largest size (everything measured is
      latency-bound). With BwProxy chosen by peak measured bandwidth this cannot
      happen (at the BwProxy's peak size its time is the lower one); the guard
      keeps the answer defined for hand-edited profiles.

    Args:
      profile: the measurements.
      worker: the worker's index.

    Raises:
      ValueError: ``worker`` is not an index of the profile's workers.
      TypeError: ``worker`` is not an int.
    """
    _check_worker(profile, worker, "threshold_bytes")
    lat, bw = _route(profile, int(worker))
    if lat == bw:
        return None
    diff = profile.wp_oneway_s[worker, lat] - profile.wp_oneway_s[worker, bw]
    sizes = profile.sizes
    if diff[0] >= 0:
        return sizes[0]
    crossed = np.flatnonzero(diff >= 0)
    if crossed.size == 0:
        return sizes[-1]
    j = int(crossed[0])
    d0, d1 = float(diff[j - 1]), float(diff[j])  # d0 < 0 <= d1
    s0, s1 = sizes[j - 1], sizes[j]
    return round(s0 + (s1 - s0) * (-d0) / (d1 - d0))


def shard_bytes_from_profile(
    profile: Profile, worker: int, fraction: float = FULL_BANDWIDTH_FRACTION
) -> int:
    """Smallest measured size reaching ``fraction`` of the peak bandwidth to ``worker``'s BwProxy.

    Args:
      profile: the measurements.
      worker: the worker's index.
      fraction: what counts as "full bandwidth", in (0, 1]; default 0.95.

    Raises:
      ValueError: ``worker`` out of range or ``fraction`` outside (0, 1].
      TypeError: ``worker`` is not an int.
    """
    _check_worker(profile, worker, "shard_bytes_from_profile")
    if not 0 < fraction <= 1:
        raise ValueError(
            f"shard_bytes_from_profile: fraction must be in (0, 1], got {fraction!r}."
        )
    _, bw = _route(profile, int(worker))
    curve = profile.wp_bandwidth_curve_gbps()[worker, bw]
    # The tolerance keeps the peak itself (fraction=1) from failing on rounding.
    reached = np.flatnonzero(curve >= fraction * curve.max() * (1 - _TIE_RTOL))
    return profile.sizes[int(reached[0])]


def config_from_profile(profile: Profile, **overrides: Any) -> Config:
    """A `Config` planned from ``profile`` (paper Section III-E), with ``overrides`` on top.

    * ``routes``: `routes_from_profile`.
    * ``latency_threshold_bytes``: the largest `threshold_bytes` over workers
      (one value serves the whole mesh). When no worker has a threshold
      (LatProxy == BwProxy everywhere) it is 0: the value cannot matter since
      both routes are the same proxy.
    * ``shard_bytes``: the largest `shard_bytes_from_profile` over workers (at
      least 4, `Config`'s minimum), so every worker's shards reach full bandwidth.

    ``profile`` itself is kept (for ``leading_bytes="auto"`` and re-profiling).
    ``profile.topology`` is only a name, so ``Config.topology`` is left at its
    default; pass ``topology=coarse.Topology...`` to run on the emulated links.

    Args:
      profile: the measurements.
      **overrides: `Config` fields to set instead of (or besides) the planned ones.

    Raises:
      ValueError: an override that is not a `Config` field, or a value `Config` rejects.

    Example:
      >>> cfg = config_from_profile(Profile.load("v100.json"), leading_bytes=1 << 20)
    """
    fields = {f.name for f in dataclasses.fields(Config)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(
            f"config_from_profile: unknown Config field(s) {unknown}; expected some of "
            f"{sorted(fields)}."
        )
    thresholds = [threshold_bytes(profile, i) for i in range(profile.workers)]
    known = [t for t in thresholds if t is not None]
    cfg = Config(
        shard_bytes=max(4, max(shard_bytes_from_profile(profile, i) for i in range(profile.workers))),
        latency_threshold_bytes=max(known) if known else 0,
        routes=routes_from_profile(profile),
        profile=profile,
    )
    return dataclasses.replace(cfg, **overrides)
