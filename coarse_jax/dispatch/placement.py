"""Where a step's arguments go in (the workers) and where its outputs come out.

The program spans the workers only: the mesh `coarse.make_mesh` returns,
which is where jax's guides have users place state and batches. Arrays
already on exactly the workers, uncommitted arrays and host values pass
untouched; arrays committed elsewhere (a two-tier mesh, one device) are
moved onto the workers.

Outputs stay on the workers, with one exception kept for code written for
the two-tier mesh: a step decorated with a two-tier device mesh
(`coarse_jax.mesh.two_tier_mesh`, or one built by hand) that gets an
argument committed to that whole mesh places its outputs there too, as
``jax.jit`` makes outputs follow arguments (replicated; per-example outputs
split over "data" where the mesh lists each device once), so they mix with
the user's other arrays on it. That copies each replicated output to every
proxy's device (on a COARSE k:1 mesh jax keeps one buffer per mesh position:
k on a shared proxy's device) at every call: `coarse.diagnostics.memory_report` counts
those bytes on the proxy tier, and `coarse.sync` warns once with what the
copies cost (`LegacyPlacement`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
import warnings
from collections.abc import Set as AbstractSet
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from coarse_jax.mesh import LegacyPlacement, Tiers, batch_axes, proxy_devices, workers_mesh


def _span(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
    # A typed PRNG key array's shard index also covers its key data's trailing
    # dimensions, which the key array's shape does not have: they are never split.
    return tuple(sl.indices(n) for sl, n in zip(index[: len(shape)], shape, strict=True))


def _within(inner: tuple, outer: tuple) -> tuple[slice, ...] | None:
    """``inner``'s block (spans of step 1) as an index into ``outer``'s, or None if outside."""
    pairs = list(zip(inner, outer, strict=True))
    if any(i[2] != 1 or o[2] != 1 or i[0] < o[0] or i[1] > o[1] for i, o in pairs):
        return None
    return tuple(slice(i[0] - o[0], i[1] - o[0]) for i, o in pairs)


def from_local_shards(x: jax.Array, sharding: NamedSharding) -> jax.Array | None:
    """``x`` as an array of ``sharding``, built from the buffers ``x`` has on this process,
    or None where a device's block is in none of them (or ``sharding``'s mesh lists a device
    twice).

    A buffer already on a device with the right block is used as it is (no
    copy); else the block is cut from a local buffer that holds it, that
    device's own first, and moved there. Nothing crosses processes, and
    nothing goes through jax's resharding, which refuses what this must
    take: a transfer between different device sets across processes
    (multi-controller jax), and any copy out of a mesh that lists a device
    twice (a COARSE k:1 mesh, whose tier-1 row repeats each shared proxy: jax
    can only replicate over it).
    """
    mesh = sharding.mesh
    assert isinstance(mesh, Mesh), "placement targets a concrete mesh"
    if repeats_devices(mesh):
        return None
    shards = [(s, _span(s.index, x.shape)) for s in x.addressable_shards]
    buffers = []
    for device, index in sharding.addressable_devices_indices_map(x.shape).items():
        if index is None:
            return None
        want = _span(index, x.shape)
        mine_first = sorted(shards, key=lambda t: t[0].device != device)
        found = next(
            ((s, sp, c) for s, sp in mine_first if (c := _within(want, sp)) is not None), None
        )
        if found is None:
            return None
        shard, span, cut = found
        data = shard.data if span == want else shard.data[cut]
        buffers.append(data if shard.device == device else jax.device_put(data, device))
    return jax.make_array_from_single_device_arrays(x.shape, sharding, buffers)


@dataclasses.dataclass(frozen=True)
class _Sites:
    """A mesh's device sets and the workers' shardings, computed once per mesh: the per-call
    checks below compare sets instead of building a mesh (about 20 us each) every call."""

    workers: frozenset[jax.Device]
    # The whole mesh's devices where they are more than the workers' (device
    # proxies): an argument committed there makes the outputs follow (`home`).
    everything: frozenset[jax.Device] | None
    batch: NamedSharding
    replicated: NamedSharding


@functools.lru_cache(maxsize=64)  # meshes are interned by jax: hashed by identity
def _sites(mesh: Mesh) -> _Sites:
    workers = workers_mesh(mesh)
    on_workers = frozenset(workers.devices.flat)
    everything = frozenset(mesh.devices.flat)
    return _Sites(
        workers=on_workers,
        everything=None if everything == on_workers else everything,
        batch=NamedSharding(workers, P(batch_axes(mesh))),
        replicated=NamedSharding(workers, P()),
    )


def _committed_to(x: Any) -> AbstractSet[jax.Device] | None:
    """The devices ``x`` is committed to, or None (not a concrete array, or uncommitted:
    jax.jit moves an uncommitted array wherever it is needed)."""
    if not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer) or not x.committed:
        return None
    return x.sharding.device_set


def _committed_elsewhere(x: Any, devices: AbstractSet[jax.Device]) -> bool:
    where = _committed_to(x)
    return where is not None and where != devices


def _unplaced(x: Any) -> bool:
    """A host value or uncommitted array jit would place itself (a Python number too)."""
    if isinstance(x, jax.core.Tracer):
        return False
    if isinstance(x, jax.Array):
        return not x.committed
    return isinstance(x, (np.ndarray, np.generic, bool, int, float, complex))


def _renamed(x: jax.Array, replicated: NamedSharding, last: list[Any]) -> bool:
    """``x``, committed to exactly the workers, is replicated there under another sharding
    object (a ``jax.pmap`` output, a mesh with other axis names): jit would compile again.
    ``last``: [sharding, answer] of the previous leaf (one jit's outputs share one object;
    whether a sharding is replicated on the workers does not depend on the leaf's rank)."""
    s = x.sharding
    if s is replicated:
        return False
    if s is not last[0]:
        last[:] = [s, s != replicated and s.is_equivalent_to(replicated, x.ndim)]
    return bool(last[1])


def _move(x: Any, sharding: NamedSharding) -> Any:
    moved = from_local_shards(x, sharding)
    return moved if moved is not None else jax.device_put(x, sharding)


def onto_workers(mesh: Mesh, trees: list[tuple[Any, bool]]) -> tuple[Mesh | None, list[Any]]:
    """(`home` of the trees, the trees with every array committed off the workers moved onto
    them), in one look at each leaf: what `coarse.sync` does with a call's arguments.

    ``trees``: (tree, whether it is the batch). An array committed to other
    devices (the whole two-tier mesh, say, from ``jax.device_put(x,
    NamedSharding(mesh, P("data")))``, or one device) is moved onto the
    workers, split over "data" if it is the batch, else replicated; arrays on
    exactly the workers pass untouched (no copy), as do the batch's host values
    and uncommitted arrays; other host values and uncommitted arrays are put on
    the workers, replicated, where the outputs will be (one process); a tree
    with nothing to move is passed on as it is. Where
    the workers already hold the right slices (the batch split over "data"
    and replicated over "tier", or a replicated array), those buffers are
    reused as they are. Otherwise each worker's block is cut from a buffer
    this process holds: across hosts no transfer between processes, and on a
    COARSE k:1 mesh no copy through jax.
    """
    sites = _sites(mesh)
    home_mesh = None
    out = []
    # State passed as host values or uncommitted arrays (a first call's params, a
    # TrainState's Python step count) is put where the step's outputs will be, so
    # the next call, with those outputs, runs the same executable: jax.jit compiles
    # once per argument placement. One process only: there a host value is this
    # process's own. The batch is left to jit, which splits host data each call.
    settle = sites.replicated.is_fully_addressable
    seen: list[Any] = [None, False]  # _renamed's last answer
    for tree, batch in trees:
        moves = False
        for x in jax.tree.leaves(tree):
            where = _committed_to(x)
            if where is None:
                moves = moves or (settle and not batch and _unplaced(x))
                continue
            if where == sites.workers:
                moves = moves or (settle and not batch and _renamed(x, sites.replicated, seen))
                continue
            moves = True
            if where == sites.everything:
                home_mesh = mesh
        if moves:
            sharding = sites.batch if batch else sites.replicated

            def move(x: Any, sharding: NamedSharding = sharding, batch: bool = batch) -> Any:
                where = _committed_to(x)
                if where is not None and where != sites.workers:
                    return _move(x, sharding)
                if settle and not batch:
                    if where is None and _unplaced(x):
                        return jax.device_put(x, sharding)
                    if where is not None and _renamed(x, sharding, seen):
                        return jax.device_put(x, sharding)  # its buffers, no copy
                return x

            tree = jax.tree.map(move, tree)
        out.append(tree)
    return home_mesh, out


def abstract_off_workers(tree: Any, mesh: Mesh) -> Any:
    """``tree`` with arrays committed off the workers as shapes (what `onto_workers` would move):
    for lowering the program without moving anything."""
    devices = _sites(mesh).workers

    def shape(x: Any) -> Any:
        if not _committed_elsewhere(x, devices):
            return x
        return jax.ShapeDtypeStruct(x.shape, x.dtype)

    return jax.tree.map(shape, tree)


def home(mesh: Mesh, args: Any) -> Mesh | None:
    """``mesh`` if some argument is committed to exactly its devices (more than the workers),
    else None: where the outputs go (`place`)."""
    everything = _sites(mesh).everything
    if everything is None:
        return None
    if any(_committed_to(x) == everything for x in jax.tree.leaves(args)):
        return mesh
    return None


def repeats_devices(mesh: Mesh) -> bool:
    devices = list(mesh.devices.flat)
    return len(set(devices)) != len(devices)


def _replicate_onto_repeating_mesh(x: jax.Array, sharding: NamedSharding) -> jax.Array:
    """``x`` (replicated on the workers) replicated over ``sharding``'s mesh, which lists a
    device twice (COARSE k:1).

    jax refuses several buffers on one device in `make_array_from_single_device_arrays`,
    and resharding out of or into such a mesh; it builds one from a single buffer
    (``device_put``) on one process, and from a callback across processes (where a
    ``device_put`` onto a global sharding would be a transfer between hosts). The
    source is the replica on this process's first worker.
    """
    local = x.addressable_shards[0].data
    if jax.process_count() == 1:
        return jax.device_put(local, sharding)
    if jnp.issubdtype(local.dtype, jax.dtypes.prng_key):
        bits = jax.random.key_data(local)
        impl = jax.random.key_impl(local)
        placed = jax.make_array_from_callback(bits.shape, sharding, lambda idx: bits[idx])
        return jax.random.wrap_key_data(placed, impl=impl)
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: local[idx])


def place(tree: Any, mesh: Mesh, batch: bool) -> Any:
    """``tree`` (outputs on the workers) placed on the whole ``mesh``: replicated, or split
    over its batch axes (``batch``) where the mesh lists each device once.

    Built from this process's buffers (`from_local_shards`): the workers'
    are reused, each proxy's device gets a copy. A per-example output stays
    on the workers on a mesh that lists a device twice (COARSE k:1), where
    no array can be split over "data".
    """
    repeats = repeats_devices(mesh)
    if batch and repeats:
        return tree
    sharding = NamedSharding(mesh, P(batch_axes(mesh)) if batch else P())

    def put(x: Any) -> Any:
        if not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer):
            return x
        if repeats:
            return _replicate_onto_repeating_mesh(x, sharding)
        moved = from_local_shards(x, sharding)
        return moved if moved is not None else jax.device_put(x, sharding)

    return jax.tree.map(put, tree)


def bytes_on_a_proxy(
    tiers: Tiers, home_mesh: Mesh | None, args: Any, outputs: Any, workers: int
) -> tuple[int, int]:
    """The bytes of ``args`` that this process's first proxy device holds (the user placed them
    there), and of the step's ``outputs`` (replicated, per-example, NNX state: shapes) it will
    hold where they follow the two-tier mesh ``home_mesh`` (`home`; None: they do not)."""
    proxies = proxy_devices(tiers)
    if not proxies:  # proxies in host memory: no device to land on
        return 0, 0
    proxy = proxies[0]
    arg_bytes = sum(
        s.data.nbytes
        for x in jax.tree.leaves(args)
        if isinstance(x, jax.Array)
        for s in x.addressable_shards
        if s.device == proxy
    )
    if home_mesh is None:
        return arg_bytes, 0
    replicated, per_example, new_state = outputs
    # jax keeps one buffer per mesh position: a shared proxy's device (k:1), k of them.
    copies = list(np.asarray(home_mesh.devices).flat).count(proxy)
    out_bytes = copies * sum(
        x.size * x.dtype.itemsize for x in jax.tree.leaves((replicated, new_state))
    )
    if not repeats_devices(home_mesh):
        out_bytes += sum(x.size * x.dtype.itemsize // workers for x in jax.tree.leaves(per_example))
    return arg_bytes, out_bytes


class TwoTierOutputs:
    """Places a step's outputs where its arguments were (`home`), and warns once per step, with
    the measured cost, when that is a two-tier mesh."""

    def __init__(self, step: str) -> None:
        self._step = step
        self._warned = False

    def place(self, results: tuple[Any, Any, Any], home_mesh: Mesh) -> tuple[Any, Any, Any]:
        """(replicated, per_example, new_state) placed on ``home_mesh``."""
        if self._warned:
            return self._place(results, home_mesh)
        # Measured once: the step's own work first, then the placement alone.
        jax.block_until_ready(results)
        start = time.perf_counter()
        placed = self._place(results, home_mesh)
        jax.block_until_ready(placed)
        seconds = time.perf_counter() - start
        self._warned = True
        workers = _sites(home_mesh).workers
        copied = sum(
            s.data.nbytes
            for x in jax.tree.leaves(placed)
            if isinstance(x, jax.Array)
            for s in x.addressable_shards
            if s.device not in workers
        )
        warnings.warn(
            f"coarse.sync({self._step}): an argument is placed on the two-tier mesh (workers and "
            f"proxies), so the step's outputs follow it there: every call copies "
            f"{copied / 2**20:.2f} MiB onto the proxies' devices, measured at "
            f"{seconds * 1e3:.2f} ms on this call, and keeps a replica of your state on every "
            "proxy. Fix: decorate the step with the mesh coarse.make_mesh returned (the "
            "workers) and place state and batches on it (NamedSharding(mesh, P()), "
            "NamedSharding(mesh, P('data'))): no copy, nothing on the proxies.",
            LegacyPlacement,
            stacklevel=3,
        )
        return placed

    @staticmethod
    def _place(results: tuple[Any, Any, Any], home_mesh: Mesh) -> tuple[Any, Any, Any]:
        replicated, per_example, new_state = results
        replicated, new_state = place((replicated, new_state), home_mesh, False)
        return replicated, place(per_example, home_mesh, True), new_state
