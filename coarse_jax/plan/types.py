"""The parts of a `coarse.diagnostics.plan`: `Plan` and its leaves, pieces and buckets.

Frozen records of the decisions `coarse_jax.plan.planner.plan` makes; a
`Plan` also renders itself as the runtime's FFI attributes (`Plan.ffi_attrs`)
and as a table a person can read (`Plan.summary`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any

import numpy as np

from coarse_jax.config import Config
from coarse_jax.plan.xla_route import NO_MESH


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
      >>> leaf = coarse.diagnostics.plan({"w": jnp.zeros((4, 4))}, mesh).leaves[0]
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
      >>> cfg = coarse.Config(shard_bytes=1 << 20)
      >>> p = coarse.diagnostics.plan({"w": jnp.zeros((1024, 512))}, mesh, cfg)
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
      >>> p = coarse.diagnostics.plan({"a": jnp.zeros((8,)), "b": jnp.zeros((8,))}, mesh)
      >>> [(b.num_leaves, b.num_pieces) for b in p.buckets]
      [(2, 1)]
    """

    first_leaf: int
    num_leaves: int
    first_piece: int
    num_pieces: int


@dataclasses.dataclass(frozen=True)
class Plan:
    """The decisions for one tree on one mesh, made by `coarse.diagnostics.plan`.

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
      xla_below_bytes: the latency route's cap: a tree of at most this many
        bytes is reduced by XLA inside the step's program
        (``Config.xla_below_bytes``, with ``"auto"`` decided for the mesh by
        `coarse_jax.plan.xla_route`).
      xla_reason: why the cap is what it is, for `summary`.

    Example:
      >>> tree = {"a": jnp.zeros((16,)), "b": jnp.zeros((1024, 1024))}   # flatten order: a, b
      >>> cfg = coarse.Config(shard_bytes=1 << 20, leading_bytes=64)
      >>> p = coarse.diagnostics.plan(tree, mesh, cfg)
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
    xla_below_bytes: int = 0
    xla_reason: str = ""

    def __post_init__(self) -> None:
        if not self.proxies:
            object.__setattr__(self, "proxies", self.workers)

    @property
    def proxy_leaves(self) -> tuple[int, ...]:
        """Tree indices of the proxy-synced leaves, in sync order."""
        return self.sync_order[: self.num_proxy_leaves]

    def bucket_leaves(self, bucket: BucketPlan) -> list[int]:
        """Tree indices of ``bucket``'s leaves, in the order its push takes them."""
        first = bucket.first_leaf
        return [self.sync_order[s] for s in range(first, first + bucket.num_leaves)]

    @property
    def leading_leaves(self) -> tuple[int, ...]:
        """Tree indices of the worker-synced (leading) leaves, in sync order."""
        return self.sync_order[self.num_proxy_leaves :]

    @property
    def total_bytes(self) -> int:
        """Bytes of every leaf of the tree."""
        return sum(leaf.nbytes for leaf in self.leaves)

    @property
    def xla(self) -> bool:
        """The whole tree is at most `xla_below_bytes`: XLA reduces it inside the step's
        program (one psum over the workers), not the proxies; the pieces and buckets are
        what the proxies would have done."""
        return 0 < self.total_bytes <= self.xla_below_bytes

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
          >>> attrs = coarse.diagnostics.plan({"w": jnp.zeros((8,))}, mesh).ffi_attrs()
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
            "piece_push": np.array(
                [i for i, b in enumerate(self.buckets) for _ in range(b.num_pieces)],
                dtype=np.int64,
            ).reshape(-1),
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
          >>> print(coarse.diagnostics.plan({"w": jnp.zeros((4, 4))}, mesh).summary())
          leaf      shape   dtype   bytes  sync   dest proxy per worker
          ---...
          ['w']     (4, 4)  float32    64  XLA psum    -
          ---...
          latency route: the whole tree (64 B) is at most 2097152 B, so XLA reduces it ...
          1 leaves, 0.00 MiB, all through XLA's psum (one collective)
          shard 4194304 B, push 4194304 B, latency threshold 2097152 B, routes ...
          >>> cfg = coarse.Config(xla_below_bytes=0)   # the proxies, however small
          >>> print(coarse.diagnostics.plan({"w": jnp.zeros((4, 4))}, mesh, cfg).summary())
          leaf      shape   dtype   bytes  sync   dest proxy per worker
          ---...
          ['w']     (4, 4)  float32    64  proxy, piece 0    0,1,2,3
          ---...
          1 leaves, 0.00 MiB: 0.00 MiB via 4 proxies in 1 pieces (1 pushes per worker), ...
          shard 4194304 B, push 4194304 B, latency threshold 2097152 B, routes ...
          CPU bytes per sync, value_and_grad: 0.00 MiB read / 0.00 MiB written (2.00x / ...
          CPU bytes per sync, value_and_update (adam): ...
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
            if self.xla:
                how, dest = "XLA psum", "-"
            elif leaf.sync == "worker":
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
        if self.xla:
            rows.append(
                f"latency route: the whole tree ({self.total_bytes} B) is at most "
                f"{self.xla_below_bytes} B, so XLA reduces it in the step's program (one psum "
                "over the workers) and no proxy takes part (coarse.value_and_update "
                f"excepted); {self.xla_reason}"
            )
        elif self.xla_below_bytes:
            rows.append(
                f"latency route: trees of at most {self.xla_below_bytes} B go through XLA, "
                f"this one is {self.total_bytes} B; {self.xla_reason}"
            )
        elif self.config.xla_below_bytes == "auto" and self.xla_reason not in ("", NO_MESH):
            rows.append(
                f"latency route: none, every tree goes through the proxies; {self.xla_reason}"
            )
        if self.xla:
            rows.append(
                f"{len(self.leaves)} leaves, {self.total_bytes / 2**20:.2f} MiB, all through "
                "XLA's psum (one collective)"
            )
        else:
            rows.append(
                f"{len(self.leaves)} leaves, {self.total_bytes / 2**20:.2f} MiB: "
                f"{self.proxy_bytes / 2**20:.2f} MiB via {self.proxies} proxies in "
                f"{len(self.pieces)} pieces "
                f"({len(self.buckets)} pushes per worker), "
                f"{(self.total_bytes - self.proxy_bytes) / 2**20:.2f} MiB via the worker ring "
                f"({len(self.leading_leaves)} leaves)"
            )
        push_bytes = max(self.config.push_bytes, self.config.shard_bytes)
        rows.append(
            f"shard {self.config.shard_bytes} B, push {push_bytes} B, latency threshold "
            f"{self.config.latency_threshold_bytes} B, routes (lat, bw) per worker: "
            + " ".join(f"w{i}:{lat},{bw}" for i, (lat, bw) in enumerate(routes))
        )
        if self.xla:  # the proxies move nothing
            return "\n".join(rows)
        from coarse_jax.plan.traffic import cpu_traffic  # traffic reads this module's Plan

        rows.append("CPU bytes per sync, value_and_grad: " + cpu_traffic(self).line())
        rows.append(
            "CPU bytes per sync, value_and_update (adam): "
            + cpu_traffic(self, optimizer_slots=2).line()
        )
        return "\n".join(rows)
