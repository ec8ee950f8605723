"""How a call's arguments map onto a `coarse.sync` step's program, as ``jax.jit`` maps them.

One call is bound to the step's signature once (`Arguments.binding`): keyword
arguments become positions, defaults a keyword skips over are compiled in,
and ``batch_*``, ``static_*`` and ``donate_*`` name positions (``*_argnums``)
or parameters (``*_argnames``). The result, a
`coarse_jax.dispatch.binding.CallBinding`, is part of the compiled program's
cache key; the program calls the step's function with the same positional
and keyword arguments the user passed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax

from coarse_jax.dispatch import nnx, static_leaves
from coarse_jax.dispatch.binding import CallBinding, indices, label, names, positions, signature_of

_EMPTY = inspect.Parameter.empty
_ROLES_KEPT = 64  # call shapes whose positions `Arguments.binding` remembers
_REPEATS_KEPT = 16  # calls whose whole binding `Arguments.repeat` remembers
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class Arguments:
    """A step's argument options, bound against its function's signature at every call."""

    def __init__(
        self,
        fn: Callable[..., Any],
        step: str,
        *,
        batch_argnums: int | Sequence[int] | None,
        batch_argnames: str | Sequence[str] | None,
        static_argnums: int | Sequence[int] | None,
        static_argnames: str | Sequence[str] | None,
        donate_argnums: int | Sequence[int] | None,
        donate_argnames: str | Sequence[str] | None,
    ) -> None:
        self._step = step
        # batch_argnums=() (or batch_argnames=()) says the step has no batch: every
        # argument is replicated. Only None (not given) means the default, the last.
        self._batch_given = batch_argnums is not None or batch_argnames is not None
        self.batch_argnums = indices(batch_argnums, "batch_argnums", step)
        self.static_argnums = indices(static_argnums, "static_argnums", step)
        self.donate_argnums = indices(donate_argnums, "donate_argnums", step)
        self.batch_argnames = names(batch_argnames, "batch_argnames", step)
        self.static_argnames = names(static_argnames, "static_argnames", step)
        self.donate_argnames = names(donate_argnames, "donate_argnames", step)
        try:
            self._sig: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin, say: keyword arguments by name only
            self._sig = None
        self._check_names()
        # A call's shape (`binding`'s key) -> its (static, batch, donated, NNX) positions.
        self._roles: dict[tuple[Any, ...], tuple[tuple[int, ...], ...]] = {}
        self._repeats: dict[tuple[Any, ...], CallBinding] = {}

    def _check_names(self) -> None:
        if self._sig is None:
            return
        params = self._sig.parameters
        if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return
        for what in ("batch_argnames", "static_argnames", "donate_argnames"):
            for name in getattr(self, what):
                if name not in params:
                    raise ValueError(
                        f"coarse.sync({self._step}): {what} names {name!r}, which is no parameter "
                        f"of the step (it has {list(params)}). Fix: name one of its parameters."
                    )

    def named(
        self, binding: CallBinding, passed: Sequence[int], values: Sequence[Any]
    ) -> list[tuple[str, Any]]:
        """(label, value) of a program's arguments as messages name them: ``argument 2
        (scale)``, ``batch argument 1``; ``values``: the arguments at ``passed``, then
        the NNX state when ``binding`` has graph nodes."""
        params = self._positional_params()
        labels = []
        for i in passed:
            text = ("batch " if i in binding.batch else "") + label(
                i, binding.n_pos, binding.kwnames
            )
            if i < binding.n_pos and i < len(params):
                text += f" ({params[i].name})"
            labels.append(text)
        if binding.graph:
            labels.append("the NNX state")
        return list(zip(labels, values, strict=True))

    def _positional_params(self) -> list[inspect.Parameter]:
        if self._sig is None:
            return []
        return [p for p in self._sig.parameters.values() if p.kind in _POSITIONAL]

    def bind(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], int, tuple[str, ...], tuple[int, ...]]:
        """(all arguments in order, how many are positional, the keywords' names, positions
        filled from defaults).

        A keyword argument that names a positional parameter takes that
        parameter's position (so ``*_argnums`` count it as ``jax.jit``'s
        do); a default between it and the positional arguments is filled in
        (and compiled in, as the function's own constant would be).
        Keyword-only and ``**kwargs`` arguments stay keywords, in the
        signature's order, then by name.
        """
        if not kwargs:
            return args, len(args), (), ()
        if self._sig is None:
            kwnames = tuple(sorted(kwargs))
            return (*args, *(kwargs[k] for k in kwnames)), len(args), kwnames, ()
        try:
            self._sig.bind(*args, **kwargs)
        except TypeError as err:
            raise TypeError(
                f"coarse.sync({self._step}): the call does not fit the step's signature "
                f"{self._sig}: {err}. Fix: call the step as you would call the function."
            ) from None
        rest = dict(kwargs)
        out = list(args)
        filled: list[int] = []
        positional = self._positional_params()
        named = [j for j, p in enumerate(positional) if p.name in rest]
        if named:
            for j in range(len(args), max(named) + 1):
                p = positional[j]
                if p.name in rest:
                    out.append(rest.pop(p.name))
                else:  # bind() succeeded, so it has a default
                    out.append(p.default)
                    filled.append(j)
        params = self._sig.parameters
        kwonly = [
            k for k, p in params.items() if p.kind == inspect.Parameter.KEYWORD_ONLY and k in rest
        ]
        kwnames = tuple(kwonly + sorted(k for k in rest if k not in kwonly))
        return (*out, *(rest[k] for k in kwnames)), len(out), kwnames, tuple(filled)

    def _has_default(self, i: int, n_pos: int, kwnames: tuple[str, ...]) -> bool:
        if self._sig is None:
            return False
        if i < n_pos:
            positional = self._positional_params()
            return i < len(positional) and positional[i].default is not _EMPTY
        p = self._sig.parameters.get(kwnames[i - n_pos])
        return p is not None and p.default is not _EMPTY

    def _named(self, wanted: tuple[str, ...], n_pos: int, kwnames: tuple[str, ...]) -> set[int]:
        found = {n_pos + k for k, name in enumerate(kwnames) if name in wanted}
        for j, p in enumerate(self._positional_params()[:n_pos]):
            if p.name in wanted:
                found.add(j)
        return found

    @property
    def batch_chosen(self) -> bool:
        """Whether the user named the batch (``batch_*``), not the default (check_batch)."""
        return self._batch_given

    def binding(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[CallBinding, tuple[Any, ...], Any]:
        """(the call's binding, all its arguments in order, the state of its NNX arguments)."""
        step = self._step
        full, n_pos, kwnames, filled = self.bind(args, kwargs)
        n = len(full)
        if n == 0:
            raise TypeError(f"coarse.sync({step}): the step needs at least a batch argument.")
        graph_at = nnx.graph_positions(full)
        # Which positions are static, batch and donated depends on the call's
        # shape only (these keys), not its values: worked out once per shape,
        # so a call in a training loop pays a dict lookup.
        key = (n, n_pos, kwnames, filled, graph_at)
        roles = self._roles.get(key)
        if roles is None:
            roles = self._work_out_roles(full, n_pos, kwnames, filled, graph_at)
            if len(self._roles) < _ROLES_KEPT:
                self._roles[key] = roles
        static, batch, donate, graph = roles
        for i in static:
            try:
                hash(full[i])
            except TypeError:
                raise TypeError(
                    f"coarse.sync({step}): static argument {i} must be hashable (it is "
                    f"part of the compiled program's key, as in jax.jit), got "
                    f"{type(full[i]).__name__}. Fix: pass a hashable value (a tuple, not a "
                    "list) or make it a regular argument."
                ) from None
        graphdef, graph_state = nnx.split(tuple(full[i] for i in graph)) if graph else (None, None)
        full = self._hold(full, n_pos, kwnames, static, graph)
        kept = [i for i in range(n) if i not in static and i not in batch and i not in graph]
        structure = tuple((label(i, n_pos, kwnames), signature_of(full[i])) for i in kept)
        if graph:
            what = f"the NNX state of argument(s) {list(graph)}"
            structure += ((what, signature_of(graph_state)),)
        outer = any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(full))
        binding = CallBinding(
            n=n,
            n_pos=n_pos,
            kwnames=kwnames,
            batch=batch,
            static=tuple((i, full[i]) for i in static),
            donate=donate,
            graph=graph,
            graphdef=graphdef,
            outer_trace=outer,
            structure=structure,
        )
        return binding, full, graph_state

    def _hold(
        self,
        full: tuple[Any, ...],
        n_pos: int,
        kwnames: tuple[str, ...],
        static: tuple[int, ...],
        graph: tuple[int, ...],
    ) -> tuple[Any, ...]:
        """``full`` with the non-array leaves of every passed argument compiled in
        (`coarse_jax.dispatch.static_leaves`: an Equinox Module's functions and flags)."""
        params = self._positional_params()
        out = list(full)
        for i, value in enumerate(full):
            if i in static or i in graph or not static_leaves.needs_hold(value):
                continue
            what = label(i, n_pos, kwnames)
            if i < n_pos and i < len(params):
                what += f" ({params[i].name})"
            out[i] = static_leaves.hold(value, what, self._step)
        return tuple(out)

    def _work_out_roles(
        self,
        full: tuple[Any, ...],
        n_pos: int,
        kwnames: tuple[str, ...],
        filled: tuple[int, ...],
        graph_at: tuple[int, ...],
    ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(static, batch, donated, NNX positions) of a call of this shape, sorted; raises
        where the options contradict each other for it."""
        step = self._step
        n = len(full)
        static = positions(self.static_argnums, n_pos, "static_argnums", step)
        static |= self._named(self.static_argnames, n_pos, kwnames)
        for j in filled:  # defaults a keyword skipped over: constants, as in the function
            try:
                hash(full[j])
            except TypeError:
                continue
            static.add(j)
        graph = tuple(i for i in graph_at if i not in static)
        if self._batch_given:
            batch = positions(self.batch_argnums, n_pos, "batch_argnums", step)
            batch |= self._named(self.batch_argnames, n_pos, kwnames)
            if not batch and self.batch_argnames:
                raise TypeError(
                    f"coarse.sync({step}): batch_argnames={self.batch_argnames!r} names no "
                    f"argument of this call (keywords passed: {list(kwnames)}). Fix: pass the "
                    "batch by that name, or name it with batch_argnums."
                )
        else:
            batch = {self._default_batch(n, n_pos, kwnames, static, graph)}
        donate = positions(self.donate_argnums, n_pos, "donate_argnums", step)
        donate |= self._named(self.donate_argnames, n_pos, kwnames)
        for what, group in (("batch", batch), ("donate", donate)):
            both = sorted(group & static)
            if both:
                raise ValueError(
                    f"coarse.sync({step}): the {what} and static arguments both name argument(s) "
                    f"{both}; a static argument is compiled in, not passed. Fix: name it in one "
                    "of them."
                )
        if set(graph) & batch:
            raise TypeError(
                f"coarse.sync({step}): argument {sorted(set(graph) & batch)[0]} is an "
                "NNX object but batch_argnums names it: the batch must be arrays. Fix: pass "
                "batch_argnums for the batch's position."
            )
        return tuple(sorted(static)), tuple(sorted(batch)), tuple(sorted(donate)), graph

    def _default_batch(
        self,
        n: int,
        n_pos: int,
        kwnames: tuple[str, ...],
        static: set[int],
        graph: tuple[int, ...],
    ) -> int:
        """The last argument, in the signature's order, that is not static, not an NNX object,
        and whose parameter has no default; else the last one that is not static."""
        free = [i for i in range(n) if i not in static]
        arrays = [i for i in free if i not in graph and not self._has_default(i, n_pos, kwnames)]
        if arrays:
            return arrays[-1]
        return free[-1] if free else n - 1

    def repeat(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallBinding | None:
        """The binding of a call exactly like a remembered one, or None.

        A training loop calls its step with the same tree of arrays every
        time: then the binding (binding, roles, structure, the batch check,
        placement) is the one worked out before, found by one look at each
        leaf (about 7 of the 28 µs `coarse.sync` spent around a 1 KiB sync).
        Exactly like: positional arguments only, every leaf a concrete
        `jax.Array` with the same shape, dtype, weak type, sharding and
        commitment, so everything the binding and the placement read is the
        same.
        """
        if kwargs or not self._repeats:
            return None
        key = _repeat_key(args)
        return None if key is None else self._repeats.get(key)

    def remember(self, args: tuple[Any, ...], kwargs: dict[str, Any], binding: CallBinding) -> None:
        """Keeps ``binding`` for `repeat`: a call that `coarse.sync` passed on as it came (no
        argument moved, no static or NNX argument, no outer trace)."""
        if kwargs or binding.static or binding.graph or binding.outer_trace:
            return
        if len(self._repeats) < _REPEATS_KEPT and (key := _repeat_key(args)) is not None:
            self._repeats[key] = binding


def _repeat_key(args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    leaves, treedef = jax.tree.flatten(args)
    key: list[Any] = [treedef]
    for x in leaves:
        if not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer):
            return None
        # A typed PRNG key array has no weak_type (never weakly typed).
        weak = getattr(x, "weak_type", False)
        key.append((x.shape, x.dtype, weak, x.sharding, x.committed))
    return tuple(key)
