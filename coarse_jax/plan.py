"""`coarse.plan`: what happens to each leaf of a gradient tree.

The plan fixes, before anything runs, every decision the runtime follows:

* the dual-sync split: the first leaves of the tree (the model's first layers,
  needed first by the next forward pass) up to ``Config.leading_bytes`` are
  reduced among the workers; the rest goes through the proxies;
* the sync order: proxy leaves are pushed in backward order (last leaf first),
  which is also the one global order every proxy walks;
* pieces: a leaf larger than ``shard_bytes`` is cut into equal shards, smaller
  leaves are batched into pieces of up to ``shard_bytes``;
* routes: a piece smaller than ``latency_threshold_bytes`` goes to the worker's
  latency proxy, a larger one to its bandwidth proxy.

The runtime receives the plan as FFI attributes of each custom call
(`Plan.ffi_attrs`). Building it is linear in the number of leaves.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from coarse_jax.config import Config
from coarse_jax.mesh import num_proxies
from coarse_jax.model.paper import best_split

SUPPORTED_DTYPES = (np.dtype("float32"), np.dtype(jax.numpy.bfloat16), np.dtype("float16"))


@dataclasses.dataclass(frozen=True)
class LeafPlan:
    """One leaf: where it sits in the tree and how it is synchronized.

    Attributes:
      name: the leaf's key path, e.g. ``"['params']['Dense_0']['kernel']"``.
      shape: its shape.
      dtype: its dtype (float32, bfloat16 or float16).
      sync: ``"proxy"`` or ``"worker"`` (the worker ring of the leading layers).
      sync_id: its position in sync order: proxy leaves first, then leading
        leaves.
      group: pieces never mix leaves of different groups (see `plan`).

    Example:
      >>> leaf = coarse.plan({"w": jnp.zeros((4, 4))}, mesh).leaves[0]
      >>> leaf.name, leaf.sync, leaf.size, leaf.nbytes
      ("['w']", 'proxy', 16, 64)
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    sync: str  # "proxy" or "worker"
    sync_id: int  # position in sync order: proxy leaves first, then leading leaves
    group: int  # pieces never mix leaves of different groups (see `plan`)

    @property
    def size(self) -> int:
        """The number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """The bytes in the leaf's own dtype."""
        return self.size * self.dtype.itemsize


@dataclasses.dataclass(frozen=True)
class PiecePlan:
    """The unit that is routed, queued on a proxy and ring-reduced.

    A shard of one large leaf, or several small leaves batched together.

    Attributes:
      index: its position in the plan's global order.
      nelems: elements (f32 values in flight).
      nbytes: bytes of the leaves' own dtypes it holds.
      segments: ``(sync_id, leaf offset, length, piece offset)`` per leaf part.
      dest: the proxy each worker sends it to.

    Example:
      >>> p = coarse.plan({"w": jnp.zeros((1024, 512))}, mesh, coarse.Config(shard_bytes=1 << 20))
      >>> [(pc.nbytes, pc.dest) for pc in p.pieces]
      [(1048576, (0, 1, 2, 3)), (1048576, (0, 1, 2, 3))]
    """

    index: int
    nelems: int
    nbytes: int
    segments: tuple[tuple[int, int, int, int], ...]  # (sync_id, leaf_off, len, piece_off)
    dest: tuple[int, ...]  # proxy per worker


@dataclasses.dataclass(frozen=True)
class BucketPlan:
    """One push: consecutive proxy leaves [first_leaf, first_leaf + num_leaves).

    Attributes:
      first_leaf: the first leaf's position in sync order.
      num_leaves: how many consecutive proxy leaves it pushes.
      first_piece: the first piece it fills.
      num_pieces: how many pieces it fills.

    Example:
      >>> p = coarse.plan({"a": jnp.zeros((8,)), "b": jnp.zeros((8,))}, mesh)
      >>> [(b.num_leaves, b.num_pieces) for b in p.buckets]
      [(2, 1)]
    """

    first_leaf: int
    num_leaves: int
    first_piece: int
    num_pieces: int


@dataclasses.dataclass(frozen=True)
class Plan:
    """The decisions for one tree on one mesh, made by `coarse.plan`.

    Fixed before anything runs: which leaves the workers reduce among
    themselves (the leading layers, a prefix of the flatten order up to
    ``Config.leading_bytes``) and which go through the proxies, in backward
    order (last leaf first, the one global order every proxy walks); how
    leaves are cut into shards of ``shard_bytes`` or batched into pieces; and
    which proxy each worker sends each piece to (pieces under
    ``latency_threshold_bytes`` to its latency proxy, the rest to its
    bandwidth proxy). Building it is linear in the number of leaves.

    Attributes:
      workers: the number of workers p.
      config: the `Config` it was planned with.
      leaves: one entry per leaf, in tree-flatten order (name, shape, dtype,
        ``sync`` = ``"proxy"`` or ``"worker"``).
      sync_order: tree indices in sync order: proxy leaves first, then the
        leading leaves.
      num_proxy_leaves: how many leaves go through the proxies.
      pieces: the units routed, queued on a proxy and ring-reduced (their
        size and destination proxy per worker).
      buckets: the pushes: runs of consecutive proxy leaves pushed together.
      mean: whether the runtime scales sums by 1/p.
      proxies: the number of proxies q (each serves p / q workers); 0 when
        built by hand means p.

    Example:
      >>> tree = {"a": jnp.zeros((16,)), "b": jnp.zeros((1024, 1024))}   # flatten order: a, b
      >>> p = coarse.plan(tree, mesh, coarse.Config(shard_bytes=1 << 20, leading_bytes=64))
      >>> p.workers, len(p.pieces), p.total_bytes, p.proxy_bytes
      (4, 4, 4194368, 4194304)
      >>> [p.leaves[i].name for i in p.leading_leaves]   # the first 64 bytes: worker ring
      ["['a']"]
    """

    workers: int
    config: Config
    leaves: tuple[LeafPlan, ...]  # in tree-flatten order
    sync_order: tuple[int, ...]  # sync_id -> tree index
    num_proxy_leaves: int
    pieces: tuple[PiecePlan, ...]
    buckets: tuple[BucketPlan, ...]
    mean: bool = True
    proxies: int = 0

    def __post_init__(self) -> None:
        if not self.proxies:
            object.__setattr__(self, "proxies", self.workers)

    @property
    def proxy_leaves(self) -> tuple[int, ...]:
        """Tree indices of the proxy-synced leaves, in sync order."""
        return self.sync_order[: self.num_proxy_leaves]

    @property
    def leading_leaves(self) -> tuple[int, ...]:
        """Tree indices of the worker-synced (leading) leaves, in sync order."""
        return self.sync_order[self.num_proxy_leaves :]

    @property
    def total_bytes(self) -> int:
        """Bytes of every leaf of the tree."""
        return sum(leaf.nbytes for leaf in self.leaves)

    @property
    def proxy_bytes(self) -> int:
        """Bytes of the leaves that go through the proxies."""
        return sum(self.leaves[i].nbytes for i in self.proxy_leaves)

    def ffi_attrs(self) -> dict[str, Any]:
        """The plan as FFI attributes (read by ffi/plan_attrs.cc), cached.

        Returns:
          A dict from attribute name to a numpy scalar or array, as each
          custom call of the step receives it.

        Example:
          >>> attrs = coarse.plan({"w": jnp.zeros((8,))}, mesh).ffi_attrs()
          >>> int(attrs["workers"]), int(attrs["num_proxy_leaves"])
          (4, 1)
        """
        cached = getattr(self, "_attrs", None)
        if cached is not None:
            return cached
        p = self.workers
        segs = np.array(
            [
                (sid, off, n, pc.index, poff)
                for pc in self.pieces
                for (sid, off, n, poff) in pc.segments
            ],
            dtype=np.int64,
        ).reshape(-1)
        attrs: dict[str, Any] = {
            "workers": np.int64(p),
            "proxies": np.int64(self.proxies),
            "timeout_ms": np.int64(max(1, round(self.config.timeout_s * 1000))),
            "mean": np.int64(1 if self.mean else 0),
            "num_proxy_leaves": np.int64(self.num_proxy_leaves),
            "piece_nelems": np.array([pc.nelems for pc in self.pieces], dtype=np.int64),
            "piece_nbytes": np.array([pc.nbytes for pc in self.pieces], dtype=np.int64),
            "leading_nbytes": np.int64(sum(self.leaves[i].nbytes for i in self.leading_leaves)),
            "piece_dest": np.array(
                [d for pc in self.pieces for d in pc.dest], dtype=np.int64
            ).reshape(-1),
            "segments": segs,
            "leaf_nelems": np.array([self.leaves[i].size for i in self.sync_order], dtype=np.int64),
            "leaf_names": "\n".join(self.leaves[i].name for i in self.sync_order),
        }
        if self.config.topology is not None:
            attrs.update(self.config.topology.ffi_attrs())
        if self.config.trace:
            attrs["trace"] = np.int64(1)
        digest = hashlib.blake2b(digest_size=8)
        for key in sorted(attrs):
            value = attrs[key]
            digest.update(key.encode())
            digest.update(value.encode() if isinstance(value, str) else np.asarray(value).tobytes())
        attrs["plan_key"] = np.int64(int.from_bytes(digest.digest(), "little") & ((1 << 63) - 1))
        object.__setattr__(self, "_attrs", attrs)
        return attrs

    def summary(self, max_rows: int = 30) -> str:
        """A table a person can read: one row per leaf (first ``max_rows``), then totals.

        Args:
          max_rows: the most leaf rows shown; the totals count every leaf.

        Returns:
          The table as a string, giving per leaf its shape, dtype, bytes, how it is
          synchronized (worker ring, or proxy piece / shards) and the
          destination proxy per worker; then the totals, the shard size, the
          latency threshold and the routes.

        Example:
          >>> print(coarse.plan({"w": jnp.zeros((4, 4))}, mesh).summary())
          leaf      shape   dtype   bytes  sync   dest proxy per worker
          ---...
          ['w']     (4, 4)  float32    64  proxy, piece 0    0,1,2,3
          ---...
          1 leaves, 0.00 MiB: 0.00 MiB via 4 proxies in 1 pieces (1 pushes per worker), ...
          shard 4194304 B, latency threshold 2097152 B, routes (lat, bw) per worker: ...
        """
        p = self.workers
        pieces_of: dict[int, list[PiecePlan]] = {}
        for pc in self.pieces:
            for sid, *_ in pc.segments:
                pieces_of.setdefault(sid, []).append(pc)
        header = (
            f"{'leaf':<40} {'shape':<18} {'dtype':<8} {'bytes':>10}  {'sync':<22} "
            "dest proxy per worker"
        )
        rows = [header, "-" * len(header)]
        for sid, tree_index in enumerate(self.sync_order[:max_rows]):
            leaf = self.leaves[tree_index]
            if leaf.sync == "worker":
                how, dest = "worker ring", "-"
            else:
                own = pieces_of.get(sid, [])
                n = len(own)
                if n > 1:
                    how = f"proxy, {n} shards"
                else:
                    batched = len(own[0].segments) if own else 1
                    how = f"proxy, piece {own[0].index}" + (
                        f" (+{batched - 1})" if batched > 1 else ""
                    )
                dests = sorted({pc.dest for pc in own})
                dest = " ".join(",".join(str(d) for d in route) for route in dests)
            name = leaf.name if len(leaf.name) <= 40 else "..." + leaf.name[-37:]
            rows.append(
                f"{name:<40} {leaf.shape!s:<18} {leaf.dtype.name:<8} {leaf.nbytes:>10}  "
                f"{how:<22} {dest}"
            )
        if len(self.sync_order) > max_rows:
            rows.append(f"... {len(self.sync_order) - max_rows} more leaves")
        routes = self.config.routes_for(p, self.proxies)
        rows.append("-" * len(header))
        rows.append(
            f"{len(self.leaves)} leaves, {self.total_bytes / 2**20:.2f} MiB: "
            f"{self.proxy_bytes / 2**20:.2f} MiB via {self.proxies} proxies in "
            f"{len(self.pieces)} pieces "
            f"({len(self.buckets)} pushes per worker), "
            f"{(self.total_bytes - self.proxy_bytes) / 2**20:.2f} MiB via the worker ring "
            f"({len(self.leading_leaves)} leaves)"
        )
        rows.append(
            f"shard {self.config.shard_bytes} B, latency threshold "
            f"{self.config.latency_threshold_bytes} B, routes (lat, bw) per worker: "
            + " ".join(f"w{i}:{lat},{bw}" for i, (lat, bw) in enumerate(routes))
        )
        return "\n".join(rows)


def auto_leading_bytes(leaf_bytes: list[int], config: Config, workers: int) -> int:
    """``leading_bytes="auto"``: the split m of the paper's model (III-F).

    m (bytes through proxies) minimizes T_train = max(T_FP + T_BP + T_sync(GPU),
    T_FP + T_sync(proxy)) over the layer boundaries of the tree (leading bytes
    are a prefix of the flatten order). BW_proxy and BW_GPU are the profile's
    mean proxy-ring and worker-ring link bandwidths, converted to the time the
    step runs in (an emulated topology's time_scale stretches both).
    """
    profile, times = config.profile, config.step_times_s
    assert profile is not None and times is not None, "Config checks 'auto' has both"
    t_fp, t_bp = times
    run_scale = config.topology.time_scale if config.topology is not None else 1.0
    to_run_time = profile.time_scale / run_scale
    bw_proxy = float(profile.pp_bandwidth_gbps().mean()) * to_run_time
    bw_gpu = float(profile.ww_bandwidth_gbps().mean()) * to_run_time
    n = sum(leaf_bytes)
    prefix = [0]
    for b in leaf_bytes:
        prefix.append(prefix[-1] + b)
    m, _ = best_split(n, workers, bw_proxy, bw_gpu, t_fp, t_bp, candidates=[n - x for x in prefix])
    return int(n - m)


def _leaf_name(path: tuple[Any, ...]) -> str:
    name = jax.tree_util.keystr(path)
    return name or "<root>"


def _dtype_fix(dt: Any) -> str:
    """The "Fix:" line for a dtype the proxies do not synchronize, fitted to its kind."""
    name = getattr(dt, "name", str(dt))
    if not isinstance(dt, np.dtype):  # jax's extended dtypes: a typed PRNG key
        return (
            f"it is a {name} array, which cannot be summed. Fix: keep keys out of the "
            "synchronized tree (pass them as another argument), or reduce their raw bits, "
            "jax.random.key_data(key), where that is what you mean."
        )
    if dt == np.float64:
        return (
            "the proxies keep float32, bfloat16 and float16 values (float64 comes from "
            "JAX_ENABLE_X64). Fix: cast the tree to float32 for the step, e.g. "
            "jax.tree.map(lambda x: x.astype(jnp.float32), params), or reduce float64 values "
            "with lax.psum(x, 'data') inside the step."
        )
    if jnp.issubdtype(dt, jnp.complexfloating):
        return (
            "the proxies hold real values only. Fix: synchronize the real and imaginary parts "
            "as two float32 leaves (jnp.real(x), jnp.imag(x)) and combine them after."
        )
    if jnp.issubdtype(dt, jnp.floating) and dt.itemsize < 2:  # float8 / float4 (ml_dtypes)
        return (
            "too narrow to sum across workers without losing the result. Fix: keep the "
            "synchronized copy in bfloat16 or float32 and cast to it inside the step, "
            "x.astype(jnp.bfloat16)."
        )
    if not jnp.issubdtype(dt, jnp.inexact):
        return (
            "only float32, bfloat16 and float16 values can be synchronized. Fix: "
            "differentiate/reduce only floating leaves (keep step counters, masks and other "
            "integer or boolean leaves out of the tree, or pass them as other arguments), or "
            "reduce integers with lax.psum(x, 'data') inside the step."
        )
    return (
        "only float32, bfloat16 and float16 values can be synchronized. Fix: cast it to "
        "float32 for the step."
    )


def check_dtype(name: str, dtype: Any, where: str) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError:  # an extended dtype (a PRNG key) numpy does not know
        dt = None
    if dt is None or dt not in SUPPORTED_DTYPES:
        shown = dtype if dt is None else dt
        raise TypeError(
            f"{where}: leaf {name} has dtype {getattr(shown, 'name', shown)}; {_dtype_fix(shown)}"
        )
    return dt


def plan(
    tree: Any,
    mesh_or_workers: Any,
    config: Config | None = None,
    *,
    groups: Any = None,
    mean: bool = True,
    names: list[str] | None = None,
    where: str = "coarse.plan",
    proxies: int | None = None,
) -> Plan:
    """Decides how each leaf of ``tree`` is synchronized.

    Args:
      tree: a pytree of arrays or ``jax.ShapeDtypeStruct`` values (only shapes and dtypes
        are read).
      mesh_or_workers: the coarse mesh (or its number of workers).
      proxies: with a number of workers, the number of proxies q (default:
        as many as workers); a mesh says it itself.
      config: a `Config`; default ``Config()``.
      groups: optional pytree of ints shaped like ``tree``: leaves of different
        groups never share a piece (``value_and_grad`` keeps the loss, known
        after the forward pass, apart from gradients known later).
      mean: the runtime scales sums by 1/p when true.
      names: optional leaf names (flatten order) for the summary and errors;
        default: the leaves' key paths.
      where: the caller named in errors.

    Returns:
      A `Plan`; ``plan.summary()`` prints it.

    Raises:
      TypeError: a leaf is not float32, bfloat16 or float16.
      ValueError: the routes or ``Config.topology`` do not fit the mesh.

    Example:
      >>> params = {"dense0": jnp.zeros((64, 256)), "dense1": jnp.zeros((256, 10))}
      >>> p = coarse.plan(params, mesh, coarse.Config(leading_bytes=1 << 16))
      >>> [p.leaves[i].name for i in p.leading_leaves]   # the first layer: worker ring
      ["['dense0']"]
      >>> print(p.summary())  # doctest: +ELLIPSIS
      leaf ... dest proxy per worker
      ...
      ['dense0']     (64, 256) float32 65536  worker ring  -
      ...
    """
    config = config or Config()
    if isinstance(mesh_or_workers, int):
        workers = mesh_or_workers
        proxies = workers if proxies is None else proxies
    else:
        workers = mesh_or_workers.shape["data"]
        proxies = num_proxies(mesh_or_workers)
    routes = config.routes_for(workers, proxies)
    topo = config.topology
    if topo is not None and (topo.workers, topo.proxies) != (workers, proxies):
        raise ValueError(
            f"Config.topology: describes {topo.workers} workers and {topo.proxies} proxies, the "
            f"mesh has {workers} and {proxies}. Fix: coarse.Topology.preset(name, "
            f"workers={workers}, proxies={proxies})."
        )
    paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    group_leaves = [0] * len(paths_leaves) if groups is None else treedef.flatten_up_to(groups)  # type: ignore[attr-defined]

    shapes = []
    for t, (path, leaf) in enumerate(paths_leaves):
        name = names[t] if names is not None else _leaf_name(path)
        shapes.append(
            (name, tuple(int(d) for d in np.shape(leaf)), check_dtype(name, leaf.dtype, where))
        )

    # Dual-sync split: leading leaves are a prefix of the flatten order.
    leading_bytes = config.leading_bytes
    if leading_bytes == "auto":
        leading_bytes = auto_leading_bytes(
            [math.prod(s) * dt.itemsize for _, s, dt in shapes], config, workers
        )
    n_leading, acc = 0, 0
    for _, shape, dt in shapes:
        nbytes = math.prod(shape) * dt.itemsize
        if acc + nbytes > leading_bytes:
            break
        acc += nbytes
        n_leading += 1
    proxy_tree_ids = list(range(len(shapes) - 1, n_leading - 1, -1))  # backward order
    leading_tree_ids = list(range(n_leading - 1, -1, -1))
    sync_order = tuple(proxy_tree_ids + leading_tree_ids)
    sync_id_of = {t: s for s, t in enumerate(sync_order)}
    leaves = tuple(
        LeafPlan(
            name=name,
            shape=shape,
            dtype=dt,
            sync="worker" if t < n_leading else "proxy",
            sync_id=sync_id_of[t],
            group=int(group_leaves[t]),
        )
        for t, (name, shape, dt) in enumerate(shapes)
    )

    pieces: list[PiecePlan] = []
    buckets: list[BucketPlan] = []

    def add_piece(segments: list[tuple[int, int, int, int]], nelems: int, nbytes: int) -> None:
        kind = 0 if nbytes < config.latency_threshold_bytes else 1
        dest = tuple(route[kind] for route in routes)
        pieces.append(PiecePlan(len(pieces), nelems, nbytes, tuple(segments), dest))

    batch: list[tuple[int, int, int, int]] = []  # segments of the open batch
    batch_elems = batch_bytes = 0
    batch_first_leaf = batch_group = None

    def close_batch() -> None:
        nonlocal batch, batch_elems, batch_bytes, batch_first_leaf
        if batch:
            assert batch_first_leaf is not None
            first_piece = len(pieces)
            add_piece(batch, batch_elems, batch_bytes)
            buckets.append(BucketPlan(batch_first_leaf, len(batch), first_piece, 1))
        batch, batch_elems, batch_bytes, batch_first_leaf = [], 0, 0, None

    for sid, t in enumerate(proxy_tree_ids):
        leaf = leaves[t]
        if leaf.nbytes > config.shard_bytes:
            close_batch()
            per_shard = max(1, config.shard_bytes // leaf.dtype.itemsize)
            n_shards = -(-leaf.size // per_shard)
            shard = -(-leaf.size // n_shards)  # equal shards, the last one shorter
            first_piece = len(pieces)
            for off in range(0, leaf.size, shard):
                n = min(shard, leaf.size - off)
                add_piece([(sid, off, n, 0)], n, n * leaf.dtype.itemsize)
            buckets.append(BucketPlan(sid, 1, first_piece, len(pieces) - first_piece))
            continue
        if batch and (batch_bytes + leaf.nbytes > config.shard_bytes or leaf.group != batch_group):
            close_batch()
        if not batch:
            batch_first_leaf, batch_group = sid, leaf.group
        batch.append((sid, 0, leaf.size, batch_elems))
        batch_elems += leaf.size
        batch_bytes += leaf.nbytes
    close_batch()

    return Plan(
        workers=workers,
        config=config,
        leaves=leaves,
        sync_order=sync_order,
        num_proxy_leaves=len(proxy_tree_ids),
        pieces=tuple(pieces),
        buckets=tuple(buckets),
        mean=mean,
        proxies=proxies,
    )
