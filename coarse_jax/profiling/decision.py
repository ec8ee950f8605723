"""`Decision`: one routing decision of a measured profile, and what it rests on.

Its own module, at the bottom of `coarse_jax.profiling`: `data` (the
`Profile` that stores decisions, checked by `checked_decisions`), `rounds`
(which makes them) and `routing` (which follows them) all read it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

DECISION_KINDS = ("latency", "bandwidth", "threshold")
DECISION_BASES = ("measured", "model", "local", "unclear")


@dataclasses.dataclass(frozen=True)
class Decision:
    """One routing decision of a measured `Profile`, and what it rests on.

    `coarse.diagnostics.profile` decides, per worker, its latency proxy, its bandwidth
    proxy and the threshold between them (the size where their transfer
    times cross), from repeated, interleaved measurements
    (`coarse_jax.profiling.rounds`). A decision the measurements make clear
    by the stated margin is ``"measured"``; one they leave unclear within the
    time budget keeps the model's choice for the emulated topology
    (``"model"``: the choice its own link formula gives) or, on the host's
    own devices, where there is no model, the worker's local proxy
    (``"local"``, as a Config without a profile routes). A threshold left
    unclear where there is no model is interpolated between the medians and
    marked ``"unclear"``.

    Attributes:
      worker: the worker's index.
      kind: "latency" (LatProxy), "bandwidth" (BwProxy) or "threshold" (S).
      choice: the proxy's index, or for "threshold" the size S in bytes
        (``None`` when the worker's two proxies are the same).
      basis: "measured", "model", "local" or "unclear".
      detail: the evidence, for people (medians, confidence interval, margin).

    Raises:
      ValueError: an unknown ``kind`` or ``basis``, or a ``choice`` that is
        not an int >= 0 (or None for a threshold).
    """

    worker: int
    kind: str
    choice: int | None
    basis: str
    detail: str = ""

    def __post_init__(self) -> None:
        if self.kind not in DECISION_KINDS:
            raise ValueError(f"Decision.kind: expected one of {DECISION_KINDS}, got {self.kind!r}.")
        if self.basis not in DECISION_BASES:
            raise ValueError(
                f"Decision.basis: expected one of {DECISION_BASES}, got {self.basis!r}."
            )
        for name in ("worker", "choice"):
            v = getattr(self, name)
            if v is None and name == "choice" and self.kind == "threshold":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(
                    f"Decision.{name}: expected an int >= 0 (a {self.kind} decision's "
                    f"{'proxy or bytes' if name == 'choice' else 'worker index'}), got {v!r}."
                )
            object.__setattr__(self, name, int(v))
        if not isinstance(self.detail, str):
            raise ValueError(f"Decision.detail: expected text (str), got {self.detail!r}.")


def checked_decisions(decisions: Any, p: int, q: int) -> tuple[Decision, ...]:
    """A profile's ``decisions`` as Decisions: exactly one per worker and kind, proxies among
    the q."""
    try:
        out = tuple(d if isinstance(d, Decision) else Decision(**d) for d in decisions)
    except TypeError as e:
        raise ValueError(
            "Profile.decisions: expected Decisions (or dicts of worker, kind, choice, basis, "
            f"detail), or None; got {decisions!r} ({e})."
        ) from None
    want = {(i, kind) for i in range(p) for kind in DECISION_KINDS}
    got = [(d.worker, d.kind) for d in out]
    if sorted(got) != sorted(want):
        raise ValueError(
            f"Profile.decisions: expected one decision per worker 0..{p - 1} and kind "
            f"{DECISION_KINDS}, got {sorted(got)}; pass decisions=None to route from the "
            "times alone."
        )
    for d in out:
        if d.kind != "threshold" and d.choice is not None and d.choice >= q:
            raise ValueError(
                f"Profile.decisions: worker {d.worker}'s {d.kind} proxy must be in "
                f"0..{q - 1} (the profile's proxies), got {d.choice}."
            )
    return out
