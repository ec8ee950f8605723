"""Whether a call's params need the proxies' check, decided per call (issue 51).

The proxies of a `coarse.value_and_update` hold the master parameters, so every
call must pass the params the step returned last time; the runtime compares
them with the master rounded to their dtype (``ffi/runtime/phases/update_pieces.cc``).
On a GPU the comparison's verdict is a read the host waits for: XLA's launch
thread stops until the device has run the backward pass. A training loop passes
back the very arrays the step returned (``params, loss = step(params, batch)``),
and jax arrays are immutable: their values are then what the store holds, and
there is nothing to compare. So, per call:

* while a program is traced, each value_and_update says which step inputs its
  params are and which step outputs its new params are, by tracer identity
  (`io_map`);
* before a call, its params are vouched for when, leaf by leaf, every store's
  inputs are the objects the previous call returned (held by weak reference,
  so nothing is kept alive);
* vouched, the step runs its program compiled without the check
  (attribute ``opt_check_params = 0``); otherwise the one with it, which
  refuses other params at once, as before.

Never vouched: a step also run inside the user's own jit (those calls update
the store without passing here; from the first such trace on, every call is
checked), params that are not step arguments passed straight through or new
params that are not step outputs (a cast, an NNX module), a call after one whose
program had no map. The first call seeds the store, as the first after
``reset_optimizer`` or ``load_optimizer_state`` does: nothing to check.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax

# Per store id: (its params' step inputs as (argument, leaf) pairs, its new
# params' step outputs as leaf indices of the result); None: some store's
# params or new params are not found among the step's inputs or outputs.
IoMap = dict[int, tuple[tuple[tuple[int, int], ...], tuple[int, ...]]] | None


def io_map(
    updates: list[tuple[int, list[Any], list[Any]]], inputs: Sequence[Any], out: Any
) -> IoMap:
    """Where each update's params come from and its new params go, in one trace.

    Args:
      updates: per value_and_update of the trace, (store id, its params' leaves,
        its new params' leaves), tracers.
      inputs: the step's passed arguments as traced (pytrees of tracers).
      out: what the step's function returned.
    """
    where_in = {
        id(x): (k, j) for k, tree in enumerate(inputs) for j, x in enumerate(jax.tree.leaves(tree))
    }
    where_out = {id(x): j for j, x in enumerate(jax.tree.leaves(out))}
    found: dict[int, tuple[tuple[tuple[int, int], ...], tuple[int, ...]]] = {}
    for store, params, new in updates:
        ins = tuple(where_in.get(id(x)) for x in params)
        outs = tuple(where_out.get(id(x)) for x in new)
        if None in ins or None in outs or store in found:
            return None
        found[store] = (ins, outs)  # type: ignore[assignment]
    return found


class ParamsCheck:
    """One step's memory of what it returned, and its per-call decision."""

    def __init__(self) -> None:
        self._maps: dict[Hashable, IoMap] = {}
        self._returned: dict[int, list[weakref.ref[Any]]] = {}
        self._outside = False  # the step was traced inside the user's jit
        # The next call seeds the store (reset, load; or no call was dispatched yet,
        # though a trace, memory_report's say, made the stores).
        self._seeds = True

    def traced(self, key: Hashable, found: IoMap) -> None:
        """Called by the program's body: the map of the program of ``key``."""
        self._maps[key] = found

    def outer_trace(self) -> None:
        """The step is being traced inside the user's jit: check every call from now on."""
        self._outside = True
        self._returned.clear()

    def seeds_next(self) -> None:
        """The next call seeds the store (reset_optimizer, load_optimizer_state)."""
        self._seeds = True

    def needed(
        self,
        key: Hashable,
        stores: Sequence[int],
        arguments: Sequence[Any],
        trace: Callable[[], Any],
    ) -> bool:
        """Whether this call runs the check. ``stores``: the step's store ids (none before
        its first trace: the first call seeds); ``arguments``: the passed arguments as
        given; ``trace``: traces the program of ``key`` (to learn its map)."""
        if self._outside:
            return True
        if not stores or self._seeds:
            return False
        if key not in self._maps:
            trace()
        found = self._maps.get(key)
        if found is None or set(found) != set(stores):
            return True
        flat: dict[int, list[Any]] = {}
        for store, (ins, _) in found.items():
            held = self._returned.get(store)
            if held is None or len(held) != len(ins):
                return True
            for (k, j), ref in zip(ins, held, strict=True):
                if k not in flat:
                    flat[k] = jax.tree.leaves(arguments[k])
                if flat[k][j] is not ref():
                    return True
        return False

    def dispatched(self) -> None:
        """A call was dispatched: the store is (being) seeded, and nothing is vouched for
        until `returned` names the call's outputs (if anything raises in between, the
        next call is checked)."""
        self._seeds = False
        self._returned.clear()

    def returned(self, key: Hashable, result: Any) -> None:
        """After a call of the program of ``key``: remember what it returned."""
        found = self._maps.get(key)
        self._returned.clear()
        if not found or self._outside:
            return
        leaves = jax.tree.leaves(result)
        try:
            for store, (_, outs) in found.items():
                self._returned[store] = [weakref.ref(leaves[j]) for j in outs]
        except TypeError:  # a leaf without weak references: check next time
            self._returned.clear()
