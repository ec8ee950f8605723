"""What only jax's internals tell: the coordination service's client, jit's cache size,
the axis name a trace failed on, and where the user's code made an equation."""

from __future__ import annotations

import re
import types
from collections.abc import Iterator, Sequence
from typing import Any

from coarse_jax._jax_compat.internals import _distributed, _source_info


def distributed_client() -> Any:
    """The ``jax.distributed`` coordination service's client, or None before ``initialize``.

    Why internal: its barrier (``wait_at_barrier``) is the only way to meet
    every process with a timeout before an XLA collective; ``jax.distributed``
    exposes ``initialize`` and ``shutdown`` only. Checked on 0.10.2, 0.12.0.1.
    """
    return _distributed.global_state.client


def jit_cache_size(jitted: Any) -> int | None:
    """How many executables ``jax.jit``'s function ``jitted`` compiled (one per argument
    type and placement it met), or None where this jax does not say.

    Why internal: jit's C++ cache is counted only by the private ``_cache_size``
    (what jax's own tests read); ``jax_log_compiles`` logs text. Checked on 0.10.2,
    0.12.0.1.
    """
    size = getattr(jitted, "_cache_size", None)
    try:
        return int(size()) if callable(size) else None
    except Exception:  # pragma: no cover - a jax that changed it
        return None


# jax's frames hold the axis name being bound under these locals:
# lax.psum/pmean/all_gather(axis_name), core.pvary(axes), axis_index(axis_name).
_AXIS_LOCALS = ("axis_name", "axes", "axis_names")
_UNBOUND_AXIS = re.compile(r"unbound axis name: ([^\s.]+)")


def _tracebacks(err: BaseException) -> Iterator[types.TracebackType]:
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:  # jax keeps the unfiltered trace as a cause
        seen.add(id(e))
        if e.__traceback__ is not None:
            yield e.__traceback__
        e = e.__cause__ or e.__context__


def unbound_axis_name(err: BaseException, known: Sequence[str]) -> str | None:
    """The axis name, not one of ``known``, that ``err`` (raised while tracing) failed on.

    Why internal: an unbound axis name fails deep in jax with a bare ``AssertionError``
    (``core.pvary``) or a ``NameError``, and only jax's own frames hold the name, in
    their locals (``axis_name``, ``axes``). Checked on 0.10.2, 0.12.0.1.
    """
    match = _UNBOUND_AXIS.search(str(err))
    if match and match.group(1) not in known:
        return match.group(1)
    # A name a jax.vmap binds around the failure is bound (its frame holds it as
    # axis_name too): an error there is another error, not an unbound name.
    known = [*known, *_vmap_bound_names(err)]
    for tb in _tracebacks(err):
        t: types.TracebackType | None = tb
        while t is not None:
            frame = t.tb_frame
            if "/jax/" in frame.f_code.co_filename.replace("\\", "/"):
                for key in _AXIS_LOCALS:
                    value = frame.f_locals.get(key)
                    names = [value] if isinstance(value, str) else value
                    if isinstance(names, (tuple, list)):
                        for name in names:
                            if isinstance(name, str) and name not in known:
                                return name
            t = t.tb_next
    return None


def _vmap_bound_names(err: BaseException) -> list[str]:
    """The axis names that ``jax.vmap`` frames (``vmap_f``) in ``err``'s traceback bind."""
    found = []
    for tb in _tracebacks(err):
        t: types.TracebackType | None = tb
        while t is not None:
            frame = t.tb_frame
            path = frame.f_code.co_filename.replace("\\", "/")
            if "/jax/" in path and frame.f_code.co_name.startswith("vmap"):
                name = frame.f_locals.get("axis_name")
                if isinstance(name, str):
                    found.append(name)
            t = t.tb_next
    return found


def user_location(eqn: Any) -> str:
    """Where the user's code made a jaxpr equation: ``"file.py:12 (fn)"``, or ``""``.

    Errors about an equation found by walking a traced step (a coarse call
    inside a ``lax.cond`` only some devices take, `coarse_jax.dispatch.uniform`)
    point at the user's line. The equation's ``source_info`` holds a traceback
    whose user frame only ``source_info_util.summarize`` picks out (it skips
    jax's own frames); no public API reads it. Checked on 0.10.2, 0.12.0.1.
    """
    try:
        return str(_source_info.summarize(eqn.source_info))
    except Exception:
        return ""
