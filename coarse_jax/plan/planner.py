"""`coarse.diagnostics.plan`: a tree and a mesh in, a `Plan` out (linear in the leaves)."""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

from coarse_jax.config import Config
from coarse_jax.mesh import num_proxies, proxies_on
from coarse_jax.perf_model.paper import best_split
from coarse_jax.plan.dtypes import check_dtype
from coarse_jax.plan.types import BucketPlan, LeafPlan, PiecePlan, Plan
from coarse_jax.plan.xla_route import xla_below_bytes


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
    bw_proxy = float(profile.link("pp", "bandwidth_gbps").mean()) * to_run_time
    bw_gpu = float(profile.link("ww", "bandwidth_gbps").mean()) * to_run_time
    n = sum(leaf_bytes)
    prefix = [0]
    for b in leaf_bytes:
        prefix.append(prefix[-1] + b)
    m, _ = best_split(n, workers, bw_proxy, bw_gpu, t_fp, t_bp, candidates=[n - x for x in prefix])
    return int(n - m)


def _leaf_name(path: tuple[Any, ...]) -> str:
    name = jax.tree_util.keystr(path)
    return name or "<root>"


def plan(
    tree: Any,
    mesh_or_workers: Any,
    config: Config | None = None,
    *,
    groups: Any = None,
    mean: bool = True,
    names: list[str] | None = None,
    where: str = "coarse.diagnostics.plan",
    proxies: int | None = None,
    xla_route: tuple[int, str] | None = None,
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
      xla_route: ``(cap, reason)``, the latency route already decided for the
        mesh (`coarse_jax.plan.xla_route.xla_below_bytes`); default: decided
        here from ``config`` and the mesh (with a number of workers,
        ``"auto"`` is 0).

    Returns:
      A `Plan`; ``plan.summary()`` prints it.

    Raises:
      TypeError: a leaf is not float32, bfloat16 or float16.
      ValueError: the routes or ``Config.topology`` do not fit the mesh.

    Example:
      >>> params = {"dense0": jnp.zeros((64, 256)), "dense1": jnp.zeros((256, 10))}
      >>> cfg = coarse.Config(leading_bytes=1 << 16, xla_below_bytes=0)  # no latency route
      >>> p = coarse.diagnostics.plan(params, mesh, cfg)
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
    placement = None if isinstance(mesh_or_workers, int) else proxies_on(mesh_or_workers)
    if topo is not None and placement is not None and topo.proxies_on != placement:
        raise ValueError(
            f"Config.topology: describes proxies on {topo.proxies_on!r}, the mesh's are on "
            f"{placement!r}. Fix: coarse.EmulatedTopology.preset(name, workers={workers}, "
            f"proxies={proxies}, proxies_on={placement!r})."
        )
    if topo is not None and (topo.workers, topo.proxies) != (workers, proxies):
        raise ValueError(
            f"Config.topology: describes {topo.workers} workers and {topo.proxies} proxies, the "
            f"mesh has {workers} and {proxies}. Fix: coarse.EmulatedTopology.preset(name, "
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

    # A push (one bucket, one custom call in the backward pass) takes
    # consecutive proxy leaves of one group up to `push_bytes` (at least
    # `shard_bytes`: a batched piece fits in one push); a larger leaf is a
    # push of its own. Within it, each leaf above `shard_bytes` is cut into
    # equal shards, and runs of smaller leaves are batched into pieces of up to
    # `shard_bytes`. So the pushes (calls, wake-ups, launches) depend on
    # `push_bytes` alone, and the pieces (what the proxies route and ring) on
    # `shard_bytes`: smaller pieces pipeline the ring finer at no extra call.
    # With push_bytes <= shard_bytes this is one piece per batch, one push per
    # batch or large leaf.
    push_limit = max(config.push_bytes, config.shard_bytes)
    batch: list[tuple[int, int, int, int]] = []  # segments of the open batched piece
    batch_elems = batch_bytes = 0
    push_first_leaf = push_group = None
    push_first_piece = push_leaves = push_bytes = 0

    def close_batch() -> None:
        nonlocal batch, batch_elems, batch_bytes
        if batch:
            add_piece(batch, batch_elems, batch_bytes)
        batch, batch_elems, batch_bytes = [], 0, 0

    def close_push() -> None:
        nonlocal push_first_leaf, push_leaves, push_bytes
        close_batch()
        if push_first_leaf is not None:
            n = len(pieces) - push_first_piece
            buckets.append(BucketPlan(push_first_leaf, push_leaves, push_first_piece, n))
        push_first_leaf, push_leaves, push_bytes = None, 0, 0

    for sid, t in enumerate(proxy_tree_ids):
        leaf = leaves[t]
        if push_first_leaf is not None and (
            push_bytes + leaf.nbytes > push_limit or leaf.group != push_group
        ):
            close_push()
        if push_first_leaf is None:
            push_first_leaf, push_group, push_first_piece = sid, leaf.group, len(pieces)
        push_leaves += 1
        push_bytes += leaf.nbytes
        if leaf.nbytes > config.shard_bytes:
            close_batch()
            per_shard = max(1, config.shard_bytes // leaf.dtype.itemsize)
            n_shards = -(-leaf.size // per_shard)
            shard = -(-leaf.size // n_shards)  # equal shards, the last one shorter
            for off in range(0, leaf.size, shard):
                n = min(shard, leaf.size - off)
                add_piece([(sid, off, n, 0)], n, n * leaf.dtype.itemsize)
            continue
        if batch and batch_bytes + leaf.nbytes > config.shard_bytes:
            close_batch()
        batch.append((sid, 0, leaf.size, batch_elems))
        batch_elems += leaf.size
        batch_bytes += leaf.nbytes
    close_push()

    if xla_route is None:
        mesh = None if isinstance(mesh_or_workers, int) else mesh_or_workers
        xla_route = xla_below_bytes(config, mesh)
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
        xla_below_bytes=xla_route[0],
        xla_reason=xla_route[1],
    )
