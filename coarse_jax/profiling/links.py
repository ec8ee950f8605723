"""The links a `Profile` measures, by kind, and the figures read from their times.

Three kinds of link: ``"wp"`` worker -> proxy (``[p, q, S]`` arrays), ``"pp"``
the proxies' ring and ``"ww"`` the workers' ring (``[q, 2, S]`` and
``[p, 2, S]``: to the next, then the previous neighbour). The bottom of
`coarse_jax.profiling`: `data` (the `Profile`), `routing` and `report` read
these definitions, and `routing` and `report` take any `LinkProfile` (the
`Profile`'s face they read), so none of them imports `data`.
"""

from __future__ import annotations

import itertools
from typing import Any, Protocol

import numpy as np

from coarse_jax.profiling.decision import Decision

LINK_KINDS = ("wp", "pp", "ww")

# (field name, which links) of every time array of a profile.
TIME_FIELDS: tuple[tuple[str, str], ...] = (
    ("wp_oneway_s", "wp"),
    ("wp_bidir_s", "wp"),
    ("pp_oneway_s", "pp"),
    ("pp_bidir_s", "pp"),
    ("ww_oneway_s", "ww"),
)

# What each kind's axes are, for the error messages.
AXES = {
    "wp": "[worker, proxy, size]",
    "pp": "[proxy, (next, prev), size]",
    "ww": "[worker, (next, prev), size]",
}

# The figures `Profile.link` reads, and the units they come in.
FIGURES = ("latency_us", "bandwidth_gbps", "bidir_bandwidth_gbps", "bandwidth_curve_gbps")


def shape(kind: str, p: int, q: int, s: int) -> tuple[int, int, int]:
    """The shape of a ``kind`` array for p workers, q proxies and s sizes."""
    return {"wp": (p, q, s), "pp": (q, 2, s), "ww": (p, 2, s)}[kind]


def checked_layout(workers: Any, proxies: Any, sizes: Any) -> tuple[int, int, tuple[int, ...]]:
    """(p, q, sizes) of a profile, checked: q divides p (0 / None: q = p, one proxy per
    worker, as older profiles imply), sizes positive and strictly ascending."""
    p = workers
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1:
        raise ValueError(f"Profile.workers: expected a positive int, got {p!r}.")
    p = int(p)
    q = proxies or p
    if isinstance(q, bool) or not isinstance(q, (int, np.integer)) or not 1 <= q <= p or p % q:
        raise ValueError(
            f"Profile.proxies: expected a positive int dividing workers={p} (COARSE k:1, "
            f"k = workers / proxies), or 0 for one proxy per worker; got {proxies!r}."
        )
    given = tuple(sizes)
    if not given:
        raise ValueError("Profile.sizes: expected at least one size (bytes), got none.")
    for s in given:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1:
            raise ValueError(
                f"Profile.sizes: expected positive ints (bytes), got {s!r} in {given!r}."
            )
    checked = tuple(int(s) for s in given)
    if any(b <= a for a, b in itertools.pairwise(checked)):
        raise ValueError(
            f"Profile.sizes: expected strictly ascending sizes, got {checked!r}; sort them "
            "(and the time arrays' last axis with them) and drop duplicates."
        )
    return p, int(q), checked


def checked_spread(value: object, p: int, q: int, s: int) -> np.ndarray:
    """``wp_spread`` as a read-only copy of finite relative spreads >= 0 of the "wp" shape."""
    spread = np.array(value, dtype=np.float64, copy=True)
    want = shape("wp", p, q, s)
    if spread.shape != want or not (np.isfinite(spread).all() and (spread >= 0).all()):
        counts = f"workers={p}" if q == p else f"workers={p}, proxies={q}"
        raise ValueError(
            f"Profile.wp_spread: expected finite relative spreads >= 0 of shape {want} "
            f"{AXES['wp']} for {counts}, or None; got shape {spread.shape}."
        )
    spread.setflags(write=False)
    return spread


def checked_times(name: str, kind: str, value: object, p: int, q: int, s: int) -> np.ndarray:
    """``value`` as a read-only copy of finite times > 0 of ``kind``'s shape, or a ValueError
    naming the field ``name``, what it expected and what it got."""
    expected = shape(kind, p, q, s)
    try:
        # Copy so the caller's buffer cannot change a frozen profile behind its back.
        arr = np.array(value, dtype=np.float64, copy=True)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"Profile.{name}: expected a numeric array of shape {expected}, got "
            f"something numpy cannot read as one ({e})."
        ) from None
    if arr.shape != expected:
        counts = f"workers={p}" if q == p else f"workers={p}, proxies={q}"
        raise ValueError(
            f"Profile.{name}: expected shape {expected} {AXES[kind]} for {counts} and "
            f"{s} sizes, got {arr.shape}."
        )
    if not (np.isfinite(arr).all() and (arr > 0).all()):
        bad = np.argwhere(~(np.isfinite(arr) & (arr > 0)))[0]
        raise ValueError(
            f"Profile.{name}: expected finite times > 0 s, got "
            f"{arr[tuple(bad)]!r} at index {tuple(int(v) for v in bad)}; re-measure "
            "that link (a zero or negative time means the timer did not cover the "
            "transfer)."
        )
    arr.setflags(write=False)
    return arr


def figure(
    oneway_s: np.ndarray, bidir_s: np.ndarray | None, sizes: tuple[int, ...], what: str
) -> np.ndarray:
    """One figure (`FIGURES`) of a kind's links from their one-way (and both-way) times.

    ``latency_us``: the one-way time at the smallest size, microseconds.
    ``bandwidth_gbps``: the one-way peak over sizes of size / time, GB/s.
    ``bidir_bandwidth_gbps``: the peak of 2 * size / time of both directions
    at once (push and pull together). ``bandwidth_curve_gbps``: size / time
    at every size (the last axis follows ``sizes``).
    """
    sizes_f = np.asarray(sizes, dtype=np.float64)
    if what == "latency_us":
        return oneway_s[..., 0] * 1e6
    if what == "bandwidth_curve_gbps":
        return sizes_f / oneway_s / 1e9
    if what == "bandwidth_gbps":
        return (sizes_f / oneway_s).max(axis=-1) / 1e9
    assert what == "bidir_bandwidth_gbps" and bidir_s is not None, what
    return (2.0 * sizes_f / bidir_s).max(axis=-1) / 1e9


def crossing(
    t_lat: np.ndarray, t_bw: np.ndarray, sizes: tuple[int, ...]
) -> tuple[int, list[tuple[int, bool]]]:
    """``(S, [(size index, whether the LatProxy is faster there)])``: the crossing and its bracket.

    As `coarse_jax.profiling.routing.threshold_bytes`: linear in size between the two sizes where
    ``t_lat - t_bw`` changes sign; the smallest size if ``t_bw`` is already
    no slower there, the largest if ``t_lat`` is faster everywhere.
    """
    diff = np.asarray(t_lat) - np.asarray(t_bw)
    if diff[0] >= 0:
        return sizes[0], [(0, False)]
    crossed = np.flatnonzero(diff >= 0)
    if crossed.size == 0:
        return sizes[-1], [(len(sizes) - 1, True)]
    j = int(crossed[0])
    d0, d1 = float(diff[j - 1]), float(diff[j])  # d0 < 0 <= d1
    s0, s1 = sizes[j - 1], sizes[j]
    return round(s0 + (s1 - s0) * (-d0) / (d1 - d0)), [(j - 1, True), (j, False)]


def fmt_bytes(n: float) -> str:
    """``n`` bytes as a short label: 1KiB, 4MiB, 512B."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}B"


class LinkProfile(Protocol):
    """What `routing` and `report` read of a `Profile` (see there for each member)."""

    @property
    def workers(self) -> int: ...

    @property
    def proxies(self) -> int: ...

    @property
    def sizes(self) -> tuple[int, ...]: ...

    @property
    def wp_oneway_s(self) -> np.ndarray: ...

    @property
    def wp_spread(self) -> np.ndarray | None: ...

    @property
    def decisions(self) -> tuple[Decision, ...] | None: ...

    @property
    def topology(self) -> str | None: ...

    @property
    def time_scale(self) -> float: ...

    @property
    def host(self) -> str: ...

    def decision(self, worker: int, kind: str) -> Decision | None: ...

    def local_proxy(self, worker: int) -> int: ...

    def link(self, kind: str, what: str) -> np.ndarray: ...
