"""Routing from a `Profile`: LatProxy / BwProxy per worker, the threshold S, the shard size S'.

The paper's planner (Section III-E): per worker, among the mesh's q proxies
(q = p at COARSE 1:1, fewer at COARSE k:1), the proxy with the lowest
latency (*LatProxy*) and the one with the highest bandwidth (*BwProxy*); if
they differ, the size ``S`` where ``T_LatProxy(S) = T_BwProxy(S)`` (smaller
tensors go to *LatProxy*, larger ones to *BwProxy*); and the smallest measured
size ``S'`` that reaches full bandwidth to *BwProxy* (large tensors are cut
into ``S'``-sized shards). `coarse.Config.from_profile` puts them together.

Decisions that do not follow noise
----------------------------------
A measured `Profile` carries its decisions (`Profile.decisions`), made by
`decide` from repeated, interleaved measurements (`coarse.profile` measures
every link once, then again, in a shuffled order each round, the links of the
decisions still open; links compared with each other are measured in the
same rounds). Each round gives one time per link (the fastest repetition of
one probe). For a candidate proxy ``k`` against the best one ``b`` (lowest
median cost: time at the smallest size for latency, time per byte at the
link's peak-bandwidth size for bandwidth) the per-round ratios
``cost_k / cost_b`` are paired samples, and their median has a
distribution-free confidence interval (`median_ci`: order statistics of the
sign test, `DECISION_CONFIDENCE` = 99%, which needs at least 8 rounds). The
comparison is *clear* when that interval lies entirely above ``1 +
DECISION_MARGIN`` (``k`` is worse by more than the 5% margin) or entirely
within ``1 +- DECISION_MARGIN`` (a tie: ties go to the local proxy, then the
next ones cyclically, as `_pick` orders them). A decision is clear when every
comparison it makes is. The threshold S is clear when, at the two measured
sizes around the crossing, the interval of ``T_LatProxy / T_BwProxy`` lies
on the right side of 1 at each.

A decision still unclear when the time budget is spent keeps the model's
choice: on an emulated `coarse.Topology` the choice its own link formula
gives (the same rule on the times it predicts); on the host's own devices,
which have no model, the local proxy (what a Config without a profile does),
and a threshold interpolated between the medians, marked "unclear". The
`Decision` records which, and `Profile.table()` prints it. A virtual clock
measures exactly: one round decides.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from coarse_jax.profiling.decision import Decision

if TYPE_CHECKING:
    from coarse_jax.profiling.data import Profile

# A decision is clear when the 99% confidence interval of its paired per-round
# ratios clears a 5% margin (see the module docstring): links closer than that
# are tied, and a difference counts only when its whole interval exceeds it.
DECISION_MARGIN = 0.05
DECISION_CONFIDENCE = 0.99

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


def median_ci(
    values: np.ndarray, confidence: float = DECISION_CONFIDENCE
) -> tuple[float, float, float] | None:
    """``(median, low, high)``: the median of ``values`` and a distribution-free interval.

    The interval is ``[x_(a), x_(n+1-a)]`` of the sorted values, with the
    largest ``a`` for which ``P(Binomial(n, 1/2) < a) <= (1 - confidence) / 2``
    (the sign test): it holds the true median with probability at least
    ``confidence`` whatever the noise's distribution, as long as the samples
    are independent. None when there are too few values for any interval (at
    99%, fewer than 8).

    Example:
      >>> from coarse_jax.profiling.routing import median_ci
      >>> median_ci(np.arange(1.0, 9.0))          # 8 values: the whole range at 99%
      (4.5, 1.0, 8.0)
      >>> median_ci(np.ones(7)) is None
      True
    """
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = len(x)
    tail = (1 - confidence) / 2
    cdf, a = 0.0, 0
    for j in range(n):
        cdf += math.comb(n, j) / 2.0**n
        if cdf > tail:
            break
        a = j + 1
    if a == 0 or 2 * a > n:
        return None
    return float(np.median(x)), float(x[a - 1]), float(x[n - a])


def _verdict(log_ratios: np.ndarray, exact: bool) -> tuple[str, str]:
    """("worse" | "equal" | "better" | "unclear", the interval as text) of paired log ratios."""
    if exact:
        lo = hi = float(np.median(log_ratios))
        text = f"{math.expm1(lo):+.1%}"
    else:
        ci = median_ci(log_ratios)
        if ci is None:
            return "unclear", f"{len(log_ratios)} rounds, too few for a CI"
        _, lo, hi = ci
        text = f"{math.expm1(lo):+.1%}..{math.expm1(hi):+.1%}"
    m = math.log1p(DECISION_MARGIN)
    if lo > m:
        return "worse", text
    if hi < -m:
        return "better", text
    if -m <= lo and hi <= m:
        return "equal", text
    return "unclear", text


# Samples of one link: round -> seconds. Rounds pair the measurements of different links.
Samples = Mapping[int, float]


def _paired(a: Samples, b: Samples) -> np.ndarray:
    rounds = sorted(set(a) & set(b))
    return np.log(np.array([a[r] for r in rounds]) / np.array([b[r] for r in rounds]))


def _choose(
    costs: Sequence[Samples], order: list[int], exact: bool
) -> tuple[int | None, str, list[str]]:
    """``(choice or None if unclear, evidence, verdicts)`` among one worker's q candidates.

    ``costs[k]``: candidate k's per-round cost (lower is better). The best is
    the lowest median; each other candidate is compared with it on paired
    rounds (`_verdict`); the choice is the first of ``order`` among the best
    and its ties.
    """
    med = [float(np.median(list(c.values()))) for c in costs]
    best = min(order, key=lambda k: med[k])
    tied, unclear, verdicts = [best], [], []
    for k in order:
        if k == best:
            continue
        v, text = _verdict(_paired(costs[k], costs[best]), exact)
        verdicts.append(f"{k} vs {best} {text}")
        if v == "equal":
            tied.append(k)
        elif v != "worse":
            unclear.append(k)
    rounds = min(len(c) for c in costs)
    if unclear:
        return None, f"{', '.join(map(str, unclear))} vs {best} not clear", verdicts
    choice = next(k for k in order if k in tied)
    ties = f", tied with {', '.join(str(k) for k in tied if k != choice)}" if len(tied) > 1 else ""
    return choice, f"{rounds} round{'s' * (rounds != 1)}{ties}", verdicts


def _leader(med: np.ndarray, order: list[int]) -> int:
    """The lowest of ``med``, or the first of ``order`` within the margin of it."""
    best = float(med.min())
    return next(k for k in order if med[k] <= best * (1 + DECISION_MARGIN))


def _fmt_s(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e6:.3g} us"


def _size(n: float) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}B"


def _crossing(
    t_lat: np.ndarray, t_bw: np.ndarray, sizes: tuple[int, ...]
) -> tuple[int, list[tuple[int, bool]]]:
    """``(S, [(size index, whether the LatProxy is faster there)])``: the crossing and its bracket.

    As `threshold_bytes`: linear in size between the two sizes where
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


Link = tuple[int, int, int]  # (worker, proxy, size index)


def decide(
    samples: Callable[[int, int, int], Samples],
    sizes: tuple[int, ...],
    local: list[int],
    proxies: int,
    *,
    exact: bool,
    model_s: np.ndarray | None,
    model_name: str | None,
    settled: Mapping[tuple[int, str], Decision],
    final: bool,
    why: str = "",
) -> tuple[dict[tuple[int, str], Decision], set[Link]]:
    """Every worker's routing decisions from per-round samples, and the links still to measure.

    Args:
      samples: ``samples(worker, proxy, size index)``: that link's seconds per round.
      sizes: the sizes measured, ascending.
      local: each worker's local proxy.
      proxies: q.
      exact: the samples are exact (a virtual clock): one round decides.
      model_s: ``[p, q, S]`` seconds the topology's model predicts, or None
        (the host's own devices).
      model_name: the topology's name, for the evidence.
      settled: decisions made earlier, kept as they are.
      final: the budget is spent: decide unclear ones by the fallback (the
        model's choice, or the local proxy) instead of leaving them open.
      why: why the measurements stopped, for the fallback's evidence.

    Returns:
      ``(decisions, links)``: the decisions made (with ``settled``), keyed by
      (worker, kind); the (worker, proxy, size index) links whose next round
      would help an open decision (empty when ``final``).
    """
    p, q = len(local), proxies
    out = dict(settled)
    needed: set[Link] = set()
    size_arr = np.asarray(sizes, np.float64)

    def fallback(
        i: int, kind: str, costs_model: list[dict[int, float]] | None, evidence: str
    ) -> Decision:
        order = [(local[i] + d) % q for d in range(q)]
        if costs_model is not None:
            choice, _, _ = _choose(costs_model, order, exact=True)
            assert choice is not None  # exact costs: never unclear
            return Decision(
                i, kind, choice, "model", f"{evidence}; the {model_name} model's choice{why}"
            )
        return Decision(i, kind, local[i], "local", f"{evidence}; the local proxy{why}")

    for i in range(p):
        order = [(local[i] + d) % q for d in range(q)]
        med = np.array(
            [[float(np.median(list(samples(i, k, j).values()))) for j in range(len(sizes))]
             for k in range(q)]
        )  # fmt: skip
        # Latency: time at the smallest size.
        if (i, "latency") not in out:
            costs = [samples(i, k, 0) for k in range(q)]
            choice, ev, verdicts = _choose(costs, order, exact)
            text = (
                f"at {_size(sizes[0])}: "
                + ", ".join(f"proxy {k} {_fmt_s(med[k, 0])}" for k in range(q))
                + f"; {ev} ({'; '.join(verdicts)}, margin {DECISION_MARGIN:.0%})"
            )
            if choice is not None:
                out[i, "latency"] = Decision(i, "latency", choice, "measured", text)
            elif final:
                model = None
                if model_s is not None:
                    model = [{0: float(model_s[i, k, 0])} for k in range(q)]
                out[i, "latency"] = fallback(i, "latency", model, "not clear: " + text)
            else:
                needed |= {(i, k, 0) for k in range(q)}
        # Bandwidth: time at the size where the links' bandwidth peaks (the best link's peak).
        if (i, "bandwidth") not in out:
            j = int(np.argmax((size_arr / med).max(axis=0)))
            costs = [samples(i, k, j) for k in range(q)]
            choice, ev, verdicts = _choose(costs, order, exact)
            text = (
                f"at {_size(sizes[j])}: "
                + ", ".join(f"proxy {k} {sizes[j] / med[k, j] / 1e9:.3g} GB/s" for k in range(q))
                + f"; {ev} ({'; '.join(verdicts)}, margin {DECISION_MARGIN:.0%})"
            )
            if choice is not None:
                out[i, "bandwidth"] = Decision(i, "bandwidth", choice, "measured", text)
            elif final:
                model = None
                if model_s is not None:
                    jm = int(np.argmax((size_arr / model_s[i]).max(axis=0)))
                    model = [{0: float(model_s[i, k, jm])} for k in range(q)]
                out[i, "bandwidth"] = fallback(i, "bandwidth", model, "not clear: " + text)
            else:
                needed |= {(i, k, j) for k in range(q)}
        if (i, "threshold") in out:
            continue
        settled_both = (i, "latency") in out and (i, "bandwidth") in out
        if not settled_both:
            # Measure the crossing of the links leading so far alongside (the medians' best,
            # ties within the margin to the local proxy first), so it is not left to the end.
            j = int(np.argmax((size_arr / med).max(axis=0)))
            lat_t, bw_t = (_leader(med[:, jj], order) for jj in (0, j))
            if lat_t != bw_t:
                _, bracket = _crossing(med[lat_t], med[bw_t], sizes)
                needed |= {(i, k, jj) for jj, _ in bracket for k in (lat_t, bw_t)}
            continue
        lat, bw = out[i, "latency"].choice, out[i, "bandwidth"].choice
        assert lat is not None and bw is not None
        if lat == bw:
            basis = "measured" if out[i, "bandwidth"].basis == "measured" else "local"
            if "model" in (out[i, "latency"].basis, out[i, "bandwidth"].basis):
                basis = "model"
            out[i, "threshold"] = Decision(
                i, "threshold", None, basis, f"proxy {lat} takes every size: no threshold"
            )
            continue
        S, bracket = _crossing(med[lat], med[bw], sizes)
        clear, texts = True, []
        for j, lat_faster in bracket:
            l_s = _paired(samples(i, lat, j), samples(i, bw, j))  # log(T_lat / T_bw) per round
            _, text = _verdict(l_s, exact)
            if exact:
                r = float(np.median(l_s))
                clear &= r < 0 if lat_faster else r >= 0
            else:
                ci = median_ci(l_s)  # only the side of 1 matters: S lies between the sizes
                clear &= ci is not None and (ci[2] < 0 if lat_faster else ci[1] > 0)
            texts.append(f"T{lat}/T{bw} at {_size(sizes[j])} {text}")
        text = (
            f"proxy {lat} below, {bw} from S; crossing between the medians; "
            + "; ".join(texts)
            + f" ({min(len(samples(i, lat, j)) for j, _ in bracket)} rounds)"
        )
        if clear:
            out[i, "threshold"] = Decision(i, "threshold", S, "measured", text)
        elif final:
            if model_s is not None:
                S_model, _ = _crossing(model_s[i, lat], model_s[i, bw], sizes)
                out[i, "threshold"] = Decision(
                    i,
                    "threshold",
                    S_model,
                    "model",
                    f"not clear: {text}; the {model_name} model's crossing{why}",
                )
            else:
                out[i, "threshold"] = Decision(
                    i, "threshold", S, "unclear", f"not clear: {text}; no model{why}"
                )
        else:
            needed |= {(i, k, j) for j, _ in bracket for k in (lat, bw)}
    return out, (set() if final else needed)


def _check_worker(profile: Profile, worker: int, fn: str) -> None:
    if isinstance(worker, bool) or not isinstance(worker, (int, np.integer)):
        raise TypeError(f"{fn}: worker must be an int index, got {worker!r}.")
    if not 0 <= worker < profile.workers:
        raise ValueError(
            f"{fn}: worker must be in 0..{profile.workers - 1} (the profile's workers), "
            f"got {worker}."
        )


def _route(profile: Profile, worker: int) -> tuple[int, int]:
    if profile.decisions is not None:
        lat_d, bw_d = (profile.decision(worker, kind) for kind in ("latency", "bandwidth"))
        assert lat_d is not None and bw_d is not None  # checked by Profile
        assert lat_d.choice is not None and bw_d.choice is not None
        return lat_d.choice, bw_d.choice
    spread = profile.wp_spread
    local = profile.local_proxy(worker)
    lat = _pick(
        profile.wp_latency_us()[worker],
        local,
        "min",
        None if spread is None else spread[worker, :, 0],
    )
    # Bandwidth: the noise of each link's measurement at its peak size.
    peak_at = np.argmax(profile.wp_bandwidth_curve_gbps()[worker], axis=-1)
    bw = _pick(
        profile.wp_bandwidth_gbps()[worker],
        local,
        "max",
        None if spread is None else spread[worker, np.arange(profile.proxies), peak_at],
    )
    return lat, bw


def routes_from_profile(profile: Profile) -> tuple[tuple[int, int], ...]:
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


def threshold_bytes(profile: Profile, worker: int) -> int | None:
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
        raise ValueError(f"shard_bytes_from_profile: fraction must be in (0, 1], got {fraction!r}.")
    _, bw = _route(profile, int(worker))
    curve = profile.wp_bandwidth_curve_gbps()[worker, bw]
    # The tolerance keeps the peak itself (fraction=1) from failing on rounding.
    reached = np.flatnonzero(curve >= fraction * curve.max() * (1 - _TIE_RTOL))
    return profile.sizes[int(reached[0])]
