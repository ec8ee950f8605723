"""`coarse.sync`: a train step compiled as one SPMD program over the two-tier mesh."""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Sequence
from typing import Any, overload

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from coarse_jax import _ffi
from coarse_jax.api import _context
from coarse_jax.api.reprofile import reprofiled
from coarse_jax.config import Config
from coarse_jax.mesh import DATA, check_mesh
from coarse_jax.plan import plan as make_plan

# Config.max_steps_in_flight=None per platform (0: unbounded).
DEFAULT_MAX_IN_FLIGHT = {"cpu": 2}

# (structure, ((shape, dtype) of every leaf)) of one argument.
Signature = tuple[Any, tuple[tuple[tuple[int, ...], str], ...]]


def _signature(tree: Any) -> Signature:
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((tuple(jnp.shape(x)), str(jnp.result_type(x))) for x in leaves)


def _show(sig: Signature) -> str:
    treedef, leaves = sig
    more = "..." if len(leaves) > 4 else ""
    return f"{treedef} with leaves {leaves[:4]}{more}"


class SyncedStep:
    """A train step compiled by `coarse.sync`; call it like the function it wraps.

    Attributes:
      mesh: the two-tier mesh it runs on.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        mesh: Mesh,
        config: Config | None,
        batch_argnums: int | Sequence[int] | None,
    ) -> None:
        functools.update_wrapper(self, fn)
        self.mesh = mesh
        self._fn = fn
        self._name: str = getattr(fn, "__name__", "step")
        self._batch_argnums = batch_argnums
        # The config can change when re-profiling re-plans; a compiled program
        # is kept per config, so an unchanged plan never recompiles.
        self._config = config or Config()
        self._compiled: dict[tuple[int, tuple[int, ...], Config], Callable[..., Any]] = {}
        self._seen: dict[int, Signature] = {}  # argument index -> its first call's signature
        self._plans: list[_context.PlanRequest] = []  # what the traces planned
        self._calls = 0
        self._reprofiles = 0
        # One output leaf of each call not known to be finished, oldest first.
        self._in_flight: collections.deque[jax.Array] = collections.deque()

    def config(self) -> Config:
        """The `Config` in use (re-profiling may have replaced the one given)."""
        return self._config

    def stats(self) -> dict[str, int]:
        """``calls`` made, ``reprofiles`` done, programs ``compiled``, calls ``in_flight``.

        ``in_flight``: calls dispatched that the step has not seen finish (at
        most `Config.max_steps_in_flight`; some may have finished meanwhile).
        """
        return {
            "calls": self._calls,
            "reprofiles": self._reprofiles,
            "compiled": len(self._compiled),
            "in_flight": len(self._in_flight),
        }

    def __call__(self, *args: Any) -> Any:
        bnums = self._check_args(args)
        cfg = self._config
        key = (len(args), bnums, cfg)
        if key not in self._compiled:
            self._compiled[key] = self._compile(cfg, len(args), bnums)
        out = self._compiled[key](*args)
        self._bound_in_flight(cfg, out)
        self._calls += 1
        if cfg.reprofile_every and self._calls % cfg.reprofile_every == 0:
            self._reprofile()
        return out

    def _max_in_flight(self, cfg: Config) -> int:
        if cfg.max_steps_in_flight is not None:
            return cfg.max_steps_in_flight
        return DEFAULT_MAX_IN_FLIGHT.get(self.mesh.devices.flat[0].platform, 0)

    def _bound_in_flight(self, cfg: Config, out: Any) -> None:
        """Waits for the oldest calls until at most ``max_steps_in_flight`` are unfinished.

        See `Config.max_steps_in_flight`: XLA:CPU can starve a run queued
        behind many others. One output leaf stands for its call: a program's
        outputs are ready when every device finished it.
        """
        limit = self._max_in_flight(cfg)
        if limit == 0:
            return
        leaves = [x for x in jax.tree.leaves(out) if isinstance(x, jax.Array)]
        if leaves:
            self._in_flight.append(min(leaves, key=lambda x: x.size))
        while len(self._in_flight) > limit:
            oldest = self._in_flight.popleft()
            if not oldest.is_deleted():  # donated to a later call: that call waits for it
                oldest.block_until_ready()

    def _batch_nums(self, n: int) -> tuple[int, ...]:
        if self._batch_argnums is None:
            return (n - 1,)
        raw = self._batch_argnums
        nums = (raw,) if isinstance(raw, int) else tuple(raw)
        for b in nums:
            if not -n <= b < n:
                raise ValueError(
                    f"coarse.sync({self._name}): batch_argnums {raw!r} names argument {b}, but "
                    f"the step was called with {n} positional arguments. Fix: pass batch_argnums "
                    "indices of the arguments that hold the batch."
                )
        return tuple(sorted({b % n for b in nums}))

    def _check_args(self, args: tuple[Any, ...]) -> tuple[int, ...]:
        n = len(args)
        if n == 0:
            raise TypeError(f"coarse.sync({self._name}): the step needs at least a batch argument.")
        bnums = self._batch_nums(n)
        p = self.mesh.shape[DATA]
        for i, arg in enumerate(args):
            if i in bnums:
                for x in jax.tree.leaves(arg):
                    if jnp.ndim(x) == 0 or jnp.shape(x)[0] % p:
                        raise ValueError(
                            f"coarse.sync({self._name}): batch argument {i} must have a leading "
                            f"axis divisible by the {p} workers, got a leaf of shape "
                            f"{jnp.shape(x)}. Fix: use a global batch size that is a multiple "
                            f"of {p}."
                        )
                continue
            sig = _signature(arg)
            first = self._seen.setdefault(i, sig)
            if first != sig:
                raise ValueError(
                    f"coarse.sync({self._name}): argument {i} changed structure or shapes between "
                    f"calls; the step was planned and compiled for {_show(first)}, got "
                    f"{_show(sig)}. Fix: keep the state's structure fixed during training, or "
                    "decorate a new function with coarse.sync for the new tree."
                )
        return bnums

    def _compile(self, cfg: Config, n: int, bnums: tuple[int, ...]) -> Callable[..., Any]:
        if cfg.mode == "ffi":
            _ffi.check_platform(self.mesh)

        def body(*args: Any) -> Any:
            _context.stack().append(_context.SyncContext(self.mesh, cfg, self._plans))
            try:
                return self._fn(*args)
            finally:
                _context.stack().pop()

        in_specs = tuple(P(DATA) if i in bnums else P() for i in range(n))
        return jax.jit(jax.shard_map(body, mesh=self.mesh, in_specs=in_specs, out_specs=P()))

    def _plan_keys(self, cfg: Config) -> list[int]:
        p = self.mesh.shape[DATA]
        return [make_plan(t, p, cfg, **kw).ffi_attrs()["plan_key"] for t, kw in self._plans]

    def _reprofile(self) -> None:
        new = reprofiled(self.mesh, self._config)
        self._reprofiles += 1
        # Switch (and recompile) only if some plan of this step changes: a
        # threshold that moved between two piece sizes routes nothing else.
        if self._plan_keys(new) != self._plan_keys(self._config):
            self._plans.clear()
            self._config = new


@overload
def sync(
    fn: Mesh,
    mesh: None = None,
    *,
    config: Config | None = ...,
    batch_argnums: int | Sequence[int] | None = ...,
) -> Callable[[Callable[..., Any]], SyncedStep]: ...
@overload
def sync(
    fn: None = None,
    mesh: Mesh | None = ...,
    *,
    config: Config | None = ...,
    batch_argnums: int | Sequence[int] | None = ...,
) -> Callable[[Callable[..., Any]], SyncedStep]: ...
@overload
def sync(
    fn: Callable[..., Any],
    mesh: Mesh | None = ...,
    *,
    config: Config | None = ...,
    batch_argnums: int | Sequence[int] | None = ...,
) -> SyncedStep: ...


def sync(
    fn: Callable[..., Any] | Mesh | None = None,
    mesh: Mesh | None = None,
    *,
    config: Config | None = None,
    batch_argnums: int | Sequence[int] | None = None,
) -> SyncedStep | Callable[[Callable[..., Any]], SyncedStep]:
    """Runs a train step as one SPMD program over the two-tier mesh.

    ``jit(shard_map(fn))``: arguments other than the batch are replicated on all
    devices, the batch's leading axis is split over "data" (each worker and its
    proxy see the same shard), outputs are replicated. Inside, use
    `coarse.value_and_grad` / `coarse.all_reduce` / `coarse.on_workers`.

    The first call fixes the structure and shapes of the non-batch arguments
    (the plan is compiled for them); a later call with a different structure
    raises instead of silently re-planning. The batch may change shape
    (that recompiles, as ``jax.jit`` does). With ``Config(reprofile_every=N)``
    the links are profiled again every N calls and the step re-planned,
    recompiling only if routes, threshold or shard size changed. The returned
    `SyncedStep` has ``step.config()`` (the Config in use) and ``step.stats()``.

    Args:
      fn: the step; or the mesh, for ``@coarse.sync(mesh)``.
      mesh: a mesh from `coarse.make_mesh`.
      config: default `Config` for the coarse calls inside.
      batch_argnums: which positional arguments are sharded over "data";
        default: the last one.

    Returns:
      The compiled step (or a decorator).

    Raises:
      TypeError/ValueError: the mesh is not a coarse mesh, or arguments changed.

    Example:
      >>> @coarse.sync(mesh)
      ... def train_step(state, batch):
      ...     loss, grads = coarse.value_and_grad(loss_fn)(state.params, batch)
      ...     return state.apply_gradients(grads=grads), loss
    """
    if isinstance(fn, Mesh) and mesh is None:
        fn, mesh = None, fn
    if fn is None:
        return lambda f: sync(f, mesh=mesh, config=config, batch_argnums=batch_argnums)
    if isinstance(fn, Mesh):
        raise TypeError("coarse.sync: got two meshes; pass the step function and one mesh.")
    return SyncedStep(fn, check_mesh(mesh, "coarse.sync"), config, batch_argnums)
