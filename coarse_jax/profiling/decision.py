"""`Decision`: one routing decision of a measured profile, and what it rests on.

Its own module, below both `coarse_jax.profiling.data` (the `Profile` that
stores decisions) and `coarse_jax.profiling.routing` (which makes them), so
neither imports the other for it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

DECISION_KINDS = ("latency", "bandwidth", "threshold")
DECISION_BASES = ("measured", "model", "local", "unclear")


@dataclasses.dataclass(frozen=True)
class Decision:
    """One routing decision of a measured `Profile`, and what it rests on.

    `coarse.profile` decides, per worker, its latency proxy, its bandwidth
    proxy and the threshold between them (the size where their transfer
    times cross), from repeated, interleaved measurements
    (`coarse_jax.profiling.routing`). A decision the measurements make clear
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
