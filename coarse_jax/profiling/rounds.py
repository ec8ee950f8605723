"""Routing decisions from repeated, interleaved rounds of measurement (`decide`).

A measured `Profile` carries its decisions (`Profile.decisions`), made by
`decide` from repeated, interleaved measurements (`coarse.diagnostics.profile` measures
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
next ones cyclically, as `coarse_jax.profiling.routing` orders them). A decision is clear when every
comparison it makes is. The threshold S is clear when, at the two measured
sizes around the crossing, the interval of ``T_LatProxy / T_BwProxy`` lies
on the right side of 1 at each.

A decision still unclear when the time budget is spent keeps the model's
choice: on an emulated `coarse.EmulatedTopology` the choice its own link formula
gives (the same rule on the times it predicts); on the host's own devices,
which have no model, the local proxy (what a Config without a profile does),
and a threshold interpolated between the medians, marked "unclear". The
`Decision` records which, and `Profile.table()` prints it. A virtual clock
measures exactly: one round decides.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from coarse_jax.profiling.decision import Decision
from coarse_jax.profiling.links import crossing, fmt_bytes

# A decision is clear when the 99% confidence interval of its paired per-round
# ratios clears a 5% margin (see the module docstring): links closer than that
# are tied, and a difference counts only when its whole interval exceeds it.
DECISION_MARGIN = 0.05
DECISION_CONFIDENCE = 0.99


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
      >>> from coarse_jax.profiling.rounds import median_ci
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
                f"at {fmt_bytes(sizes[0])}: "
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
                f"at {fmt_bytes(sizes[j])}: "
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
                _, bracket = crossing(med[lat_t], med[bw_t], sizes)
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
        S, bracket = crossing(med[lat], med[bw], sizes)
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
            texts.append(f"T{lat}/T{bw} at {fmt_bytes(sizes[j])} {text}")
        text = (
            f"proxy {lat} below, {bw} from S; crossing between the medians; "
            + "; ".join(texts)
            + f" ({min(len(samples(i, lat, j)) for j, _ in bracket)} rounds)"
        )
        if clear:
            out[i, "threshold"] = Decision(i, "threshold", S, "measured", text)
        elif final:
            if model_s is not None:
                S_model, _ = crossing(model_s[i, lat], model_s[i, bw], sizes)
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
