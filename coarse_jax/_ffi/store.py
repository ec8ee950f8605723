"""The extension's calls on one runtime store: the proxies' master parameters, optimizer
state and snapshots for one `coarse.value_and_update` call site (ffi/runtime/param_store.h).

The runtime keeps each store by id in the extension of the platform that
runs it. These functions are the only Python code that calls the
extension's ``store_*`` functions; `coarse_jax.api._stores.ProxyStore`, the
one Python object of a store, calls them, so the API layer talks to a store
through typed methods and never to the module.
"""

from __future__ import annotations

from coarse_jax._ffi.extension import runtime_module

# (optimizer step count, plan leaf ids, [slot][leaf] f32 bytes), slot 0 the master.
Exported = tuple[int, list[int], list[list[bytes]]]


def export(platform: str, store: int, *, snapshot: bool, for_writer: bool) -> Exported | None:
    """The committed state (or, with ``snapshot``, the newest complete snapshot); None if
    the store holds none. ``for_writer``: the snapshot writer takes that snapshot."""
    got = runtime_module(platform).store_export(store, snapshot=snapshot, for_writer=for_writer)
    if got is None:
        return None
    count, leaves, values = got
    return int(count), list(leaves), values


def load(
    platform: str, store: int, name: str, count: int, leaves: list[int], values: list[list[bytes]]
) -> None:
    """The next update starts from this state (creating the store if it has none)."""
    runtime_module(platform).store_load(store, name, count, leaves, values)


def reset(platform: str, store: int) -> None:
    """The next update seeds the store from the params it gets."""
    runtime_module(platform).store_reset(store)


def drop(platform: str, store: int) -> None:
    """Frees the store (master, state, snapshots)."""
    runtime_module(platform).store_drop(store)


def proxy_bytes(platform: str, store: int) -> list[int]:
    """The store's bytes on each proxy (both buffers); empty before its first update."""
    return [int(b) for b in runtime_module(platform).store_bytes(store)]


def attach_writer(platform: str, store: int, name: str) -> None:
    """A writer takes the snapshots: an update defers a due snapshot rather than copy over
    one the writer has not taken. Creates the store (named ``name``) if no update has yet:
    a step's first call may not have reached its update when its writer attaches."""
    runtime_module(platform).store_attach_writer(store, name)


def snapshot_now(platform: str, store: int) -> int:
    """Snapshots the committed state now (between steps); returns its step count."""
    return int(runtime_module(platform).store_snapshot_now(store))


def snapshot_serial(platform: str, store: int) -> int:
    """How many snapshots completed (0: none valid now)."""
    return int(runtime_module(platform).store_snapshot_serial(store))


def snapshot_due(platform: str, store: int) -> bool:
    """Whether the next update takes a snapshot (between steps)."""
    return bool(runtime_module(platform).store_snapshot_due(store))
