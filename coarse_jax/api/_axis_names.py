"""An axis name a step uses that its program does not have: a coarse error naming both.

Code written for ``jax.pmap`` names its own axis (``pmap(..., axis_name="batch")``,
``nn.BatchNorm(axis_name="batch")``, ``lax.pmean(x, "batch")``). A coarse step's
workers are split over the mesh axis ``"data"`` (``("host", "data")`` across hosts),
so such a name is unbound inside the step, and jax fails with a bare
``AssertionError`` from ``pvary`` or a ``NameError`` that names no step. This module
reads the name from jax's frames and says what to change.

Decision: the name is refused, not aliased. jax has no axis aliases, and binding the
program's axis under the user's name would change the name every coarse call inside
the step reduces over; one name everywhere (``"data"``) is also what the
user's model then uses with ``coarse.all_reduce`` and the `Flax guide <flax.md>`.
"""

from __future__ import annotations

import re
import types
from collections.abc import Iterator, Sequence

# jax's frames hold the name being bound under these locals (0.10.2 to 0.12):
# lax.psum/pmean/all_gather(axis_name), core.pvary(axes), axis_index(axis_name).
_LOCALS = ("axis_name", "axes", "axis_names")
_UNBOUND = re.compile(r"unbound axis name: ([^\s.]+)")


def _tracebacks(err: BaseException) -> Iterator[types.TracebackType]:
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:  # jax keeps the unfiltered trace as a cause
        seen.add(id(e))
        if e.__traceback__ is not None:
            yield e.__traceback__
        e = e.__cause__ or e.__context__


def _names(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            if isinstance(v, str):
                yield v


def unknown_axis(err: BaseException, known: Sequence[str]) -> str | None:
    """The axis name ``err`` failed on that is not one of ``known``, or None."""
    match = _UNBOUND.search(str(err))
    if match and match.group(1) not in known:
        return match.group(1)
    for tb in _tracebacks(err):
        t: types.TracebackType | None = tb
        while t is not None:
            frame = t.tb_frame
            if "/jax/" in frame.f_code.co_filename.replace("\\", "/"):
                for key in _LOCALS:
                    for name in _names(frame.f_locals.get(key)):
                        if name not in known:
                            return name
            t = t.tb_next
    return None


def refusal(name: str, batch: Sequence[str], step: str) -> ValueError:
    """The error for a step that used axis ``name``; ``batch``: the program's batch axes."""
    axes = " and ".join(repr(a) for a in batch)
    use = batch[0] if len(batch) == 1 else tuple(batch)
    return ValueError(
        f"coarse.sync({step}): the step uses the axis name {name!r} (a lax.pmean/psum, "
        f"lax.axis_index, or a model's axis_name=, as a pmap program names its axis), but a "
        f"coarse step's workers are split over the mesh axis {axes}. Fix: name the axis "
        f"{use!r} where the step and its model use {name!r}, e.g. "
        f"nn.BatchNorm(axis_name={use!r}), lax.pmean(x, {use!r}), "
        f"DynamicScale().value_and_grad(..., axis_name={use!r})."
    )
