"""Argument checks and unit helpers shared by the performance models."""

from __future__ import annotations

# Relative tolerance when comparing candidate times: float noise must not decide
# between splits that the model says are equally fast.
TIE_RTOL = 1e-12


def check_p(p: int) -> None:
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"p must be an int >= 1, got {p!r}.")


def check_nonneg(value: float, what: str) -> None:
    # `not value >= 0` also rejects NaN.
    if not value >= 0:
        raise ValueError(f"{what} must be >= 0, got {value!r}.")


def check_bw(gbps: float, what: str) -> None:
    if not gbps > 0:
        raise ValueError(f"{what} must be > 0 GB/s (math.inf allowed), got {gbps!r}.")


def xfer_s(nbytes: float, gbps: float) -> float:
    """Seconds to move ``nbytes`` at ``gbps`` GB/s; 0 for an infinite link."""
    if nbytes == 0:
        return 0.0  # avoids 0/inf ambiguity and keeps exact zeros exact
    return nbytes / (gbps * 1e9)


def ring_factor(p: int) -> float:
    """Fraction of the buffer each ring member sends: 2(p-1)/p."""
    return 2.0 * (p - 1) / p
