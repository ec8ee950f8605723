"""Bytes a sync reads and writes on the CPU backend, per path, from its plan (issue 39).

On one host every device is the same memory, so the physical limit of a
reduction is memory traffic: each worker's values read once and the result
written once per worker, ``p·B`` read and ``p·B`` written for ``B`` bytes
per worker. `cpu_traffic` says what the CPU runtime moves instead, path by
path, in the names of the runtime's own counters (``coarse_jax._ffi.byte_counts``),
against which ``tests/test_traffic.py`` holds it, byte for byte:

* ``value_and_grad`` and ``all_reduce`` (the fused push): the proxies read
  the workers' gradients in place and sum each chunk they own in one pass
  (``sum``: every worker's bytes read once, the sum written once in f32);
  each worker's pull reads the owners' chunks into its outputs
  (``scatter``);
* ``value_and_update`` (the copying push, which lets the gradients die at
  it): each push widens into its proxy's slot (``gather``); a proxy shared
  by k > 1 workers sums its slots in one pass, then the proxies' one-pass
  reduce-scatter (both ``sum``); the optimizer reads and writes the
  gradient, the master and each state slot once (``optimizer``); worker k
  copies the step's lr and bias corrections beside proxy k's state (12
  bytes, ``gather``); a params check, on a call whose params are not the
  arrays the step returned (`coarse_jax.dispatch.params_check`), reads the
  master and the params (``check``); the pull (``scatter``);
* the leading layers (the workers' reduction): each worker sums the ring's
  chunks it would own straight from every worker's leaves, in the ring's
  order (``sum``), then narrows every owner's chunks into its outputs
  (``scatter``). Emulated links run the ring itself (widen into scratch,
  2(p-1) ring steps, narrow), as GPUs do.

Counted in the leaves' own dtypes where the runtime reads or writes leaves,
in f32 where it touches its storage. Emulated links and the streams
backend move more (staging copies, the all-gather); they are not predicted
here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Protocol

from coarse_jax._ffi.byte_counts import Traffic

F32 = 4


class _Plan(Protocol):
    """What this module reads of a `coarse_jax.plan.Plan` (whose summary imports
    this module, so it takes the type from here rather than importing it)."""

    @property
    def workers(self) -> int: ...

    @property
    def proxies(self) -> int: ...

    @property
    def leaves(self) -> Sequence[Any]: ...

    @property
    def sync_order(self) -> Sequence[int]: ...

    @property
    def pieces(self) -> Sequence[Any]: ...

    @property
    def leading_leaves(self) -> Sequence[int]: ...

    @property
    def total_bytes(self) -> int: ...


@dataclasses.dataclass
class SyncTraffic(Traffic):
    """Bytes one sync moves on the CPU backend, per operation, and the minimum.

    Attributes:
      by_op: ``{op: (bytes read, bytes written)}``, ops named as the runtime's
        counters (``gather``, ``scatter``, ``sum``, ``ring_step``,
        ``optimizer``, ``check``); ops that move nothing are left out.
      minimum: ``(p·B, p·B)``: a shared-memory reduction's least traffic.
    """

    minimum: tuple[int, int] = (0, 0)

    def line(self) -> str:
        """One line: the totals as multiples of the minimum, then each op's."""
        lo_r, lo_w = self.minimum
        ops = ", ".join(
            f"{op} {r / 2**20:.2f}/{w / 2**20:.2f}" for op, (r, w) in self.by_op.items()
        )
        return (
            f"{self.read / 2**20:.2f} MiB read / {self.written / 2**20:.2f} MiB written "
            f"({self.read / max(lo_r, 1):.2f}x / {self.written / max(lo_w, 1):.2f}x the "
            f"minimum); MiB read/written: {ops}"
        )


def cpu_traffic(
    plan: _Plan,
    *,
    optimizer_slots: int | None = None,
    updated_leaves: int | None = None,
    clip: bool = False,
    params_checked: bool = False,
) -> SyncTraffic:
    """The bytes one sync of ``plan`` moves on the CPU backend (module docstring).

    Args:
      plan: the sync's plan (`coarse.diagnostics.plan`).
      optimizer_slots: None for ``value_and_grad`` and ``all_reduce``; for
        ``value_and_update``, the state the optimizer keeps per element:
        0 for SGD without momentum, 1 with it, 2 for Adam and AdamW.
      updated_leaves: ``value_and_update``: how many leaves, in the planned
        tree's flatten order, the optimizer updates (the params; the step's
        value and aux leaves follow them and are only synced). Default: all.
      clip: ``value_and_update`` with a global-norm clip (one more read of
        the summed gradient).
      params_checked: ``value_and_update`` given params other than the arrays
        the step returned, which the proxies check (a training loop's steady
        call is not checked).

    Returns:
      A `SyncTraffic`.

    Example:
      >>> import jax.numpy as jnp
      >>> mesh = coarse.make_mesh(workers=4)
      >>> cfg = coarse.Config(leading_bytes=0)
      >>> pl = coarse.diagnostics.plan({"w": jnp.zeros((1024, 256))}, mesh, cfg)
      >>> from coarse_jax.plan.traffic import cpu_traffic
      >>> t = cpu_traffic(pl)
      >>> t.read // 2**20, t.written // 2**20, t.minimum[0] // 2**20
      (8, 5, 4)
    """
    p = plan.workers
    by_op: dict[str, list[int]] = {}

    def add(op: str, read: int, written: int) -> None:
        if read or written:
            acc = by_op.setdefault(op, [0, 0])
            acc[0] += read
            acc[1] += written

    updated = len(plan.leaves) if updated_leaves is None else updated_leaves
    for pc in plan.pieces:
        leaf_bytes = upd_bytes = upd_elems = 0
        for sid, _, len_, _ in pc.segments:
            tree_index = plan.sync_order[sid]
            leaf_bytes += len_ * plan.leaves[tree_index].dtype.itemsize
            if tree_index < updated:
                upd_bytes += len_ * plan.leaves[tree_index].dtype.itemsize
                upd_elems += len_
        n = pc.nelems * F32
        if optimizer_slots is None:
            add("sum", p * leaf_bytes, n)
        else:
            add("gather", p * leaf_bytes, p * n)
            clients = [pc.dest.count(j) for j in range(plan.proxies)]
            holders = sum(1 for k in clients if k > 0)
            for k in clients:
                if k > 1:
                    add("sum", k * n, n)
            if holders > 1:
                add("sum", holders * n, n)
            u = upd_elems * F32
            add("optimizer", (2 + optimizer_slots) * u, (2 + optimizer_slots) * u)
            if params_checked:
                add("check", u + upd_bytes, 0)
            if clip:
                add("check", u, 0)
        add("scatter", p * n, p * leaf_bytes)

    if optimizer_slots is not None:  # the step's lr, bc1, bc2 to each proxy (f32 to f32)
        add("gather", 3 * F32 * plan.proxies, 3 * F32 * plan.proxies)

    ring = [plan.leaves[i] for i in plan.leading_leaves]
    ring_bytes = sum(leaf.nbytes for leaf in ring)
    ring_f32 = sum(math.prod(leaf.shape) for leaf in ring) * F32
    if ring and p > 1:
        add("sum", p * ring_bytes, ring_f32)
        add("scatter", p * ring_f32, p * ring_bytes)

    total = plan.total_bytes
    return SyncTraffic({op: (r, w) for op, (r, w) in by_op.items()}, (p * total, p * total))
