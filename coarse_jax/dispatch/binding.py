"""One call bound to a `coarse.sync` step's signature (`CallBinding`), and the checks of
its arguments: the options' positions and names, the batch's leading axis, and the
structure a step with proxies' state keeps (`check_structure`).

`coarse_jax.dispatch.arguments.Arguments` makes a `CallBinding` at each call;
`coarse.sync` checks it with these.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

# (structure, ((shape, dtype) of every leaf)) of one argument: computed at every
# call, so it stays as cheap as the flatten itself (paths only for messages).
Signature = tuple[Any, tuple[tuple[tuple[int, ...], str], ...]]


def _shape_dtype(x: Any) -> tuple[tuple[int, ...], str]:
    if isinstance(x, jax.Array):  # its dtype is already jax's (about 10x faster than below)
        return x.shape, str(x.dtype)
    return tuple(jnp.shape(x)), str(jnp.result_type(x))


def signature_of(tree: Any) -> Signature:
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple(_shape_dtype(x) for x in leaves)


def _by_path(sig: Signature) -> dict[str, tuple[tuple[int, ...], str]]:
    treedef, leaves = sig
    skeleton = jax.tree.unflatten(treedef, list(range(len(leaves))))
    paths = jax.tree_util.tree_flatten_with_path(skeleton)[0]
    return {jax.tree_util.keystr(path) or "<root>": leaves[i] for path, i in paths}


def describe_change(first: Signature, now: Signature, limit: int = 4) -> str:
    """What differs between two signatures, by leaf path, in a line or two."""
    before, after = _by_path(first), _by_path(now)

    def show(items: list[str]) -> str:
        more = f" and {len(items) - limit} more" if len(items) > limit else ""
        return ", ".join(items[:limit]) + more

    parts = []
    gone = [p for p in before if p not in after]
    new = [p for p in after if p not in before]
    changed = [
        f"{p} {before[p][1]}{list(before[p][0])} -> {after[p][1]}{list(after[p][0])}"
        for p in before
        if p in after and before[p] != after[p]
    ]
    if gone:
        parts.append(f"leaves gone: {show(gone)}")
    if new:
        parts.append(f"new leaves: {show(new)}")
    if changed:
        parts.append(f"changed: {show(changed)}")
    if not parts:  # same paths, shapes and dtypes: the containers differ (a list for a tuple)
        parts.append(f"containers differ: {str(first[0])[:80]} -> {str(now[0])[:80]}")
    return "; ".join(parts)


def indices(value: int | Sequence[int] | None, what: str, step: str) -> tuple[int, ...]:
    if value is None:
        return ()
    nums = (value,) if isinstance(value, int) else tuple(value)
    for v in nums:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(
                f"coarse.sync({step}): {what} must be an int or a sequence of ints (positions), "
                f"got {value!r}."
            )
    return nums


def names(value: str | Sequence[str] | None, what: str, step: str) -> tuple[str, ...]:
    if value is None:
        return ()
    got = (value,) if isinstance(value, str) else tuple(value)
    for v in got:
        if not isinstance(v, str) or not v.isidentifier():
            raise TypeError(
                f"coarse.sync({step}): {what} must be a parameter name or a sequence of names "
                f"(strings), got {value!r}."
            )
    return got


def positions(nums: tuple[int, ...], n: int, what: str, step: str) -> set[int]:
    for b in nums:
        if not -n <= b < n:
            raise ValueError(
                f"coarse.sync({step}): {what} {nums!r} names argument {b}, but the step was "
                f"called with {n} positional arguments. Fix: pass {what} positions of its "
                "arguments, or name keyword arguments with the *_argnames options."
            )
    return {b % n for b in nums}


@dataclasses.dataclass(frozen=True)
class CallBinding:
    """How one call's arguments map onto the compiled program; part of its cache key.

    Positions ``0 .. n_pos - 1`` are passed positionally, the rest by the
    names in ``kwnames``, in that order.
    """

    n: int
    n_pos: int
    kwnames: tuple[str, ...]
    batch: tuple[int, ...]  # sharded over "data"
    static: tuple[tuple[int, Any], ...]  # (position, value): compiled in, as jax.jit's
    donate: tuple[int, ...]
    graph: tuple[int, ...]  # NNX graph nodes, passed as their state
    graphdef: Any  # their graph definition (static), or None
    outer_trace: bool  # called while an outer jax transformation traces it
    # (what, signature) of the non-batch arguments: jax.jit retraces on it.
    structure: tuple[tuple[str, Signature], ...]

    def dynamic(self) -> list[int]:
        static = {i for i, _ in self.static}
        return [i for i in range(self.n) if i not in static]

    def call(self, fn: Callable[..., Any], args: Sequence[Any]) -> Any:
        """``fn`` called with ``args`` (all positions) as the user passed them."""
        kwargs = dict(zip(self.kwnames, args[self.n_pos :], strict=True))
        return fn(*args[: self.n_pos], **kwargs)


def check_structure(
    first: tuple[tuple[str, Signature], ...], now: tuple[tuple[str, Signature], ...], step: str
) -> None:
    """The non-batch arguments have the ``first`` call's structure and shapes (a step whose
    proxies hold state laid out for them), else a ValueError naming what changed."""
    if now == first:
        return
    was, got = dict(first), dict(now)
    diffs = [
        f"{what}: {describe_change(was[what], got[what])}"
        for what in was
        if what in got and was[what] != got[what]
    ]
    gone = [what for what in was if what not in got]
    new = [what for what in got if what not in was]
    if gone or new:
        diffs.append(f"arguments {gone or ''} -> {new or ''}")
    raise ValueError(
        f"coarse.sync({step}): the step's arguments changed structure or shapes "
        f"({'; '.join(diffs)[:600]}), but its proxies hold master parameters and optimizer "
        "state laid out for the first call's (coarse.value_and_update). Fix: keep the "
        "state's structure fixed during training, or decorate a new function with "
        "coarse.sync for the new tree."
    )


def label(i: int, n_pos: int, kwnames: tuple[str, ...]) -> str:
    return f"argument {i}" if i < n_pos else f"keyword argument {kwnames[i - n_pos]!r}"


def _splits(value: Any, p: int) -> bool:
    """Whether every leaf of ``value`` has a leading axis divisible by ``p`` (and one leaf)."""
    leaves = jax.tree.leaves(value)
    return bool(leaves) and all(jnp.ndim(x) and jnp.shape(x)[0] % p == 0 for x in leaves)


def check_batch(
    full: Sequence[Any], binding: CallBinding, p: int, step: str, chosen: bool = True
) -> None:
    """Every batch leaf has a leading axis divisible by the ``p`` workers. ``chosen``: the
    user named the batch (``batch_argnums`` / ``batch_argnames``); else it is the default,
    the last argument, and one that cannot be a batch at all (a PRNG key, a scalar: no
    leading axis) is a step's ``rng`` or the like, not a batch of the wrong size: the
    error then says how to name the batch, with the argument before it that splits, if
    one does."""
    for i in binding.batch:
        for x in jax.tree.leaves(full[i]):
            shape = x.shape if isinstance(x, jax.Array) else jnp.shape(x)
            if shape and shape[0] % p == 0:
                continue
            what = label(i, binding.n_pos, binding.kwnames)
            key = isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
            got = f"got a leaf of shape {jnp.shape(x)}" + (" (a PRNG key)" if key else "")
            fix = f"use a global batch size that is a multiple of {p}"
            if not chosen and (not shape or key):
                others = [
                    j
                    for j in range(binding.n_pos)
                    if j != i and j not in dict(binding.static) and j not in binding.graph
                    if _splits(full[j], p)
                ]
                name = f"batch_argnums={others[-1]}" if others else "batch_argnums=<its position>"
                raise ValueError(
                    f"coarse.sync({step}): {what} is taken as the batch (without "
                    "batch_argnums, the batch is the last argument without a default) and must "
                    f"have a leading axis divisible by the {p} workers, {got}. Fix: name the "
                    f"batch, coarse.sync(mesh, {name}) (or batch_argnames=...); every other "
                    f"argument is replicated. If {what} is the batch, {fix}."
                )
            raise ValueError(
                f"coarse.sync({step}): batch {what} must have a leading axis divisible by the "
                f"{p} workers, {got}. Fix: {fix}."
            )
