"""Routing from a `Profile`: LatProxy / BwProxy per worker, the threshold S, the shard size S'.

The paper's planner (Section III-E): per worker, among the mesh's q proxies
(q = p at COARSE 1:1, fewer at COARSE k:1), the proxy with the lowest
latency (*LatProxy*) and the one with the highest bandwidth (*BwProxy*); if
they differ, the size ``S`` where ``T_LatProxy(S) = T_BwProxy(S)`` (smaller
tensors go to *LatProxy*, larger ones to *BwProxy*); and the smallest measured
size ``S'`` that reaches full bandwidth to *BwProxy* (large tensors are cut
into ``S'``-sized shards). `coarse.Config.from_profile` puts them together.

A measured profile carries its own decisions, made from repeated rounds
(`coarse_jax.profiling.rounds`); routing follows them, and decides from the
times alone only for a profile without them (written by hand or by an older
version).
"""

from __future__ import annotations

import numpy as np

from coarse_jax.profiling.links import LinkProfile, crossing

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


def _pick(values: np.ndarray, local: int, best: str, spread: np.ndarray | None = None) -> int:
    """Index of the best of one worker's q proxies' ``values`` (``best``: "min" or "max").

    Values within `ROUTE_TIE_RTOL` of the best, or within twice the larger of
    the two measurements' relative ``spread`` (their noise), are ties. Ties go
    to ``local`` (the worker's local proxy) first: it shares the worker's
    switch and disturbs no other group's links. Then to ``local + 1``,
    ``local + 2``, ... (mod q): on a symmetric machine this spreads the
    workers evenly over the remote proxies (each proxy is the next one of
    one group), where "lowest index" would send every worker's large
    tensors to the same proxy and queue them on its one port.
    """
    q = len(values)
    best_k = int(np.argmin(values) if best == "min" else np.argmax(values))
    target = values[best_k]
    noise = np.zeros(q) if spread is None else np.maximum(spread, spread[best_k])
    rtol = np.maximum(ROUTE_TIE_RTOL, 2 * noise)
    tied = set(np.flatnonzero(np.abs(values - target) <= rtol * np.abs(target)).tolist())
    return next((local + k) % q for k in range(q) if (local + k) % q in tied)


def _check_worker(profile: LinkProfile, worker: int, fn: str) -> None:
    if isinstance(worker, bool) or not isinstance(worker, (int, np.integer)):
        raise TypeError(f"{fn}: worker must be an int index, got {worker!r}.")
    if not 0 <= worker < profile.workers:
        raise ValueError(
            f"{fn}: worker must be in 0..{profile.workers - 1} (the profile's workers), "
            f"got {worker}."
        )


def _route(profile: LinkProfile, worker: int) -> tuple[int, int]:
    if profile.decisions is not None:
        lat_d, bw_d = (profile.decision(worker, kind) for kind in ("latency", "bandwidth"))
        assert lat_d is not None and bw_d is not None  # checked by Profile
        assert lat_d.choice is not None and bw_d.choice is not None
        return lat_d.choice, bw_d.choice
    spread = profile.wp_spread
    local = profile.local_proxy(worker)
    lat = _pick(
        profile.link("wp", "latency_us")[worker],
        local,
        "min",
        None if spread is None else spread[worker, :, 0],
    )
    # Bandwidth: the noise of each link's measurement at its peak size.
    peak_at = np.argmax(profile.link("wp", "bandwidth_curve_gbps")[worker], axis=-1)
    bw = _pick(
        profile.link("wp", "bandwidth_gbps")[worker],
        local,
        "max",
        None if spread is None else spread[worker, np.arange(profile.proxies), peak_at],
    )
    return lat, bw


def routes_from_profile(profile: LinkProfile) -> tuple[tuple[int, int], ...]:
    """Per worker ``(LatProxy, BwProxy)``, as `Config.routes` takes them.

    Both are among the profile's q proxies (numbered ``0 .. q - 1``, as
    ``Config.routes_for(p, q)`` checks them). A measured profile's own
    decisions (`Profile.decisions`: clear by the margin, or the model's
    choice; see the module docstring) give them. A profile without
    decisions (written by hand or by an older version) is routed from its
    times alone: LatProxy has the lowest one-way
    latency (time at the smallest size), BwProxy the highest peak one-way
    bandwidth. Ties (within 10%, or within twice the measurements' spread
    where the profile recorded it, so noise never decides) go to the
    worker's local proxy (``i // k``, k = p / q; `Profile.local_proxy`),
    then to the next indices cyclically.

    Args:
      profile: the measurements.

    Returns:
      One ``(LatProxy, BwProxy)`` pair per worker.
    """
    return tuple(_route(profile, i) for i in range(profile.workers))


def threshold_bytes(profile: LinkProfile, worker: int) -> int | None:
    """Size ``S`` where ``T_LatProxy(S) = T_BwProxy(S)`` for ``worker``; None if they agree.

    A measured profile's decision gives it (`Profile.decisions`: measured
    when the crossing is clear, else the model's); a profile without
    decisions computes it as follows.

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
    decided = profile.decision(int(worker), "threshold")
    if decided is not None:
        return decided.choice
    lat, bw = _route(profile, int(worker))
    if lat == bw:
        return None
    times = profile.wp_oneway_s[worker]
    return crossing(times[lat], times[bw], profile.sizes)[0]


def shard_bytes_from_profile(
    profile: LinkProfile, worker: int, fraction: float = FULL_BANDWIDTH_FRACTION
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
        raise ValueError(f"shard_bytes_from_profile: fraction must be in (0, 1], got {fraction!r}.")
    _, bw = _route(profile, int(worker))
    curve = profile.link("wp", "bandwidth_curve_gbps")[worker, bw]
    # The tolerance keeps the peak itself (fraction=1) from failing on rounding.
    reached = np.flatnonzero(curve >= fraction * curve.max() * (1 - _TIE_RTOL))
    return profile.sizes[int(reached[0])]
