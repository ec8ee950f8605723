"""`RuntimeStore`: the handle of one runtime store, the proxies' master parameters,
optimizer state and snapshots for one `coarse.value_and_update` call site
(ffi/runtime/param_store.h).

The runtime keeps each store by id in the extension of the platform that
runs it; a handle is that pair (and the store's name, for its errors), and
its methods are the only Python code that calls the extension's ``store_*``
functions. `coarse_jax.api._stores.ProxyStore`, the one Python record of a
store, holds its handle, so the API layer talks to a store through typed
methods and never to the module.
"""

from __future__ import annotations

import dataclasses

from coarse_jax._ffi.extension import runtime_module

# (optimizer step count, plan leaf ids, [slot][leaf] f32 bytes), slot 0 the master.
Exported = tuple[int, list[int], list[list[bytes]]]


@dataclasses.dataclass(frozen=True)
class RuntimeStore:
    """One runtime store: ``id`` in the extension of ``platform`` ("cpu", "cuda"), named
    ``name`` in the runtime's errors.

    A handle holds no state of its own: two handles of one (platform, id) reach
    the same store, and a handle outlives nothing (dropping the store is
    `drop`, which its `ProxyStore`'s finalizer calls).
    """

    platform: str
    id: int
    name: str

    def export(self, *, snapshot: bool = False, for_writer: bool = False) -> Exported | None:
        """The committed state (or, with ``snapshot``, the newest complete snapshot); None
        if the store holds none. ``for_writer``: the snapshot writer takes that snapshot."""
        got = runtime_module(self.platform).store_export(
            self.id, snapshot=snapshot, for_writer=for_writer
        )
        if got is None:
            return None
        count, leaves, values = got
        return int(count), list(leaves), values

    def load(self, count: int, leaves: list[int], values: list[list[bytes]]) -> None:
        """The next update starts from this state (creating the store if it has none)."""
        runtime_module(self.platform).store_load(self.id, self.name, count, leaves, values)

    def reset(self) -> None:
        """The next update seeds the store from the params it gets."""
        runtime_module(self.platform).store_reset(self.id)

    def drop(self) -> None:
        """Frees the store (master, state, snapshots)."""
        runtime_module(self.platform).store_drop(self.id)

    def proxy_bytes(self) -> list[int]:
        """The store's bytes on each proxy (both buffers); empty before its first update."""
        return [int(b) for b in runtime_module(self.platform).store_bytes(self.id)]

    def attach_writer(self) -> None:
        """A writer takes the snapshots: an update defers a due snapshot rather than copy
        over one the writer has not taken. Creates the store if no update has yet: a
        step's first call may not have reached its update when its writer attaches."""
        runtime_module(self.platform).store_attach_writer(self.id, self.name)

    def snapshot_now(self) -> int:
        """Snapshots the committed state now (between steps); returns its step count."""
        return int(runtime_module(self.platform).store_snapshot_now(self.id))

    def snapshot_serial(self) -> int:
        """How many snapshots completed (0: none valid now)."""
        return int(runtime_module(self.platform).store_snapshot_serial(self.id))

    def snapshot_due(self) -> bool:
        """Whether the next update takes a snapshot (between steps)."""
        return bool(runtime_module(self.platform).store_snapshot_due(self.id))
