"""`coarse.Config`: every decision the planner and the runtime take, in one frozen value."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from coarse_jax._hooks import HOOKS
from coarse_jax.emulation.topology import EmulatedTopology
from coarse_jax.mesh import local_proxy

Mode = Literal["ffi", "reference"]
_MODES = ("ffi", "reference")

# Config.from_profile's builder, handed in by the profiler when it loads
# (coarse_jax/profiling/to_config.py), so that this module, a plain value's,
# imports nothing from the profiler.
_profile_builder: Callable[..., Config] | None = None


def register_profile_builder(builder: Callable[..., Config]) -> None:
    """Makes ``builder(profile, **overrides)`` what `Config.from_profile` calls (the profiler's)."""
    global _profile_builder
    _profile_builder = builder


# The longest wait Config.timeout_s allows: the runtime counts nanoseconds in
# int64 (292 years), and a week is longer than any step.
MAX_TIMEOUT_S = 7 * 24 * 3600.0


def _check_routes(routes: object) -> tuple[tuple[int, int], ...]:
    """``routes`` as int pairs; a clear error for anything else (floats are not truncated)."""
    expected = (
        "Config.routes: expected one (latency_proxy, bandwidth_proxy) pair of int indices "
        "on the 'data' axis per worker"
    )
    try:
        pairs = [tuple(pair) for pair in routes]  # type: ignore[attr-defined]
    except TypeError:
        raise TypeError(f"{expected}, got {routes!r}.") from None
    for i, pair in enumerate(pairs):
        if len(pair) != 2:
            raise ValueError(f"{expected}; routes[{i}] is {pair!r}.")
        for v in pair:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise TypeError(
                    f"{expected}; routes[{i}] is {pair!r}, which holds {v!r}. Fix: name proxies "
                    "by their int index, e.g. routes=((0, 1), (1, 0))."
                )
    return tuple((int(a), int(b)) for a, b in pairs)


def _default_mode() -> str:
    return os.environ.get("COARSE_JAX_MODE", "ffi")


def check_bytes(where: str, value: object, auto: bool, fix: str = "") -> None:
    """Raises ValueError unless ``value`` is a non-negative int (or "auto", if allowed).

    The one check of a size in bytes, for Config's fields and the test hook
    that sets ``xla_below_bytes``'s default (`coarse_jax.testing`).
    """
    if auto and value == "auto":
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        either = '"auto" or ' if auto else ""
        raise ValueError(f"{where}: expected {either}a non-negative int, got {value!r}.{fix}")


def _default_xla_below_bytes() -> int | str:
    """The default of ``Config.xla_below_bytes``: "auto", unless a test set another.

    The project's suite sends every tree through the proxies
    (`coarse_jax.testing.set_default_xla_below_bytes`, 0), so a CPU run takes
    the path a GPU run takes; its tests of the latency route set the Config.
    """
    return HOOKS.xla_below_bytes


@dataclasses.dataclass(frozen=True)
class Config:
    """How gradients are synchronized. Sizes are bytes of the leaves' own dtype.

    Attributes:
      shard_bytes: tensors larger than this are cut into equal shards (the last
        one shorter); smaller tensors are batched together into pieces of up
        to this size, so a step pays per-piece, not per-tensor, latency.
      push_bytes: what one push carries: consecutive tensors (of one group)
        are pushed together, in one custom call from the backward pass, up to
        this many bytes (at least ``shard_bytes``); a larger tensor is a push
        of its own. As PyTorch DDP's ``bucket_cap_mb``: the pushes, and with
        them a step's calls, launches and wake-ups, depend on this alone, the
        pieces on ``shard_bytes``, so small shards pipeline the proxies' ring
        finer at no extra call. Lower it (e.g. to ``shard_bytes``) to push
        each tensor as soon as the backward pass has it, at one call (on a GPU
        a few launches and a wake-up) per push.
      latency_threshold_bytes: pieces smaller than this go to a worker's
        latency proxy, the rest to its bandwidth proxy.
      xla_below_bytes: the latency route. A `coarse.all_reduce` or
        `coarse.value_and_grad` whose whole tree (per worker, the loss
        included) is at most this many bytes is reduced by XLA inside the
        step's program (one ``psum`` over the workers for the whole tree,
        accumulated in f32, as ``mode="reference"`` computes it), not by the
        proxies: XLA's collective needs no runtime thread to wake. Decided at
        trace time; `Plan.summary` says so. The result is XLA's reduction,
        bitwise reproducible run to run but not the proxies' bits. 0: never.
        ``"auto"`` (the default): decided for the mesh
        (`coarse_jax.plan.xla_route`): ``latency_threshold_bytes`` for CPU
        workers in one process without emulated links, where XLA's psum
        measured faster than the proxies below it (a 1 KiB sync: 1.2x
        ``lax.psum``'s time against 1.3-1.8x through the proxies); 0 (the
        proxies) on GPUs, across hosts and with ``topology``. Pass 0 to send
        small trees through the proxies anyway, on a CPU the path a GPU run
        takes (a test suite can make 0 the default:
        `coarse_jax.testing.set_default_xla_below_bytes`). Whatever the
        route, a call behaves the same: ``jax.vmap``, differentiation and a
        per-device predicate are refused alike. `coarse.value_and_update`
        always goes through the proxies (they hold the optimizer).
      routes: one ``(latency_proxy, bandwidth_proxy)`` pair per worker, proxies
        named by their number 0..q-1 (at 1:1 their index on the "data" axis).
        ``None``: every worker uses its local proxy (``i // k`` with k = p / q
        workers per proxy; at 1:1 the same index) for both.
      leading_bytes: dual synchronization. The first layers' gradients (the
        first leaves of the tree, up to this many bytes) are reduced among the
        workers instead of through proxies. 0 sends everything through proxies;
        a value at least the tree's size keeps everything on workers.
        ``"auto"``: the paper's model picks the split (III-F) from ``profile``
        (proxy-ring and worker-ring bandwidth) and ``step_times_s``.
      profile: the `coarse.diagnostics.Profile` this Config was planned from
        (`Config.from_profile` sets it); needed by ``leading_bytes="auto"`` and
        ``reprofile_every``.
      step_times_s: ``(T_FP, T_BP)`` in seconds, the forward and backward time
        of one step, for ``leading_bytes="auto"``; measure them with
        `coarse.diagnostics.measure_step_times`.
      reprofile_every: with a ``profile``, `coarse.sync` profiles the links
        again every this many calls and re-plans; the step recompiles only if
        the plan changed. 0: never.
      mode: "ffi" (the C++ runtime) or "reference" (the same dataflow in pure
        JAX collectives, the test oracle). Default: ``$COARSE_JAX_MODE`` or "ffi".
      timeout_s: every wait in the runtime gives up after this long with an
        error naming the device, tier, step and tensor. A failure fails the
        coarse calls of every device of the step together, so no device goes
        on into a later XLA collective of the step and waits there for the
        others: XLA:CPU's own rendezvous aborts the process when devices
        reach one more than ``xla_cpu_collective_call_terminate_timeout_seconds``
        (40 s by default) apart, a process-wide flag of ``XLA_FLAGS`` that
        may be shorter than this. A coarse call that only some devices would
        run (inside a ``lax.cond`` on a mesh axis index) is refused while
        tracing for the same reason. The proxies' jobs start ahead of the
        forward pass (``coarse_begin``), so their wait for the first push
        spans the forward pass: it too must take less than this.
      topology: run on an emulated interconnect (`coarse.EmulatedTopology`): every
        transfer of the runtime (push, ring steps, pull, worker ring) lasts as
        long as that link says. ``None``: the host's real transport.
      max_steps_in_flight: how many calls of a `coarse.sync` step may be
        dispatched and not yet finished; the next call first waits for the
        oldest. ``None`` (default): 2 on CPU devices, unbounded elsewhere.
        XLA:CPU runs every device of a program on a shared thread pool: with
        many multi-device runs queued, a device's thread can wait for a run
        whose other devices have no thread yet, and the step times out (or,
        for XLA's own collectives, aborts). Two in flight keep Python's
        dispatch overlapped with the run at no measurable cost. 0: unbounded.
      trace: record a timeline of every synchronization: per device and
        phase (push, proxy ring steps, optimizer, pull, waits) and piece, start
        and end times and bytes; `SyncedStep.timeline` returns it and writes a
        Chrome / Perfetto trace. Costs a clock read and a lock per span.

    Raises:
      ValueError: a field out of range (the message names the field, what was
        expected, what came and the fix), e.g. ``timeout_s=float("inf")``.
      TypeError: ``routes`` is not a sequence of (int, int) pairs.

    Example:
      >>> cfg = coarse.Config(shard_bytes=1 << 20, leading_bytes=64 << 10)
      >>> cfg.mode, cfg.timeout_s
      ('ffi', 120.0)
      >>> coarse.Config(timeout_s=float("inf"))  # doctest: +ELLIPSIS
      Traceback (most recent call last):
        ...
      ValueError: Config.timeout_s: expected seconds in (0, 604800] (a week), got inf. ...
    """

    shard_bytes: int = 4 << 20
    latency_threshold_bytes: int = 2 << 20
    xla_below_bytes: int | Literal["auto"] = dataclasses.field(
        default_factory=_default_xla_below_bytes  # type: ignore[arg-type]
    )
    routes: tuple[tuple[int, int], ...] | None = None
    leading_bytes: int | Literal["auto"] = 0
    mode: str = dataclasses.field(default_factory=_default_mode)
    timeout_s: float = 120.0
    topology: EmulatedTopology | None = None
    # A coarse.diagnostics.Profile, typed Any: the profiler is a layer above
    # (it builds Configs), and a Config only carries it to the planner.
    profile: Any = dataclasses.field(default=None, compare=False, repr=False)
    step_times_s: tuple[float, float] | None = None
    reprofile_every: int = 0
    max_steps_in_flight: int | None = None
    trace: bool = False
    push_bytes: int = 4 << 20

    def __post_init__(self) -> None:
        for name in (
            "shard_bytes",
            "push_bytes",
            "latency_threshold_bytes",
            "xla_below_bytes",
            "leading_bytes",
            "reprofile_every",
        ):
            auto = name in ("leading_bytes", "xla_below_bytes")
            check_bytes(f"Config.{name}", getattr(self, name), auto)
        if self.leading_bytes == "auto" and (self.profile is None or self.step_times_s is None):
            raise ValueError(
                'Config.leading_bytes="auto" needs profile= (a coarse.diagnostics.Profile) and '
                "step_times_s= (T_FP, T_BP); got profile="
                f"{'set' if self.profile is not None else None}, step_times_s={self.step_times_s}. "
                "Fix: Config.from_profile(coarse.diagnostics.profile(mesh), leading_bytes='auto', "
                "step_times_s=coarse.diagnostics.measure_step_times(loss_fn, params, batch))."
            )
        if self.reprofile_every and self.profile is None:
            raise ValueError(
                "Config.reprofile_every needs the profile it re-measures: build the Config with "
                "Config.from_profile(...)."
            )
        if self.step_times_s is not None:
            t = tuple(float(v) for v in self.step_times_s)
            if len(t) != 2 or min(t) < 0:
                raise ValueError(
                    "Config.step_times_s: expected (T_FP, T_BP) seconds >= 0, "
                    f"got {self.step_times_s!r}."
                )
            object.__setattr__(self, "step_times_s", t)
        if self.shard_bytes < 4:
            raise ValueError(
                f"Config.shard_bytes: expected at least 4 bytes, got {self.shard_bytes}."
            )
        if self.mode not in _MODES:
            raise ValueError(
                f"Config.mode: expected one of {_MODES}, got {self.mode!r} "
                "(check $COARSE_JAX_MODE)."
            )
        if isinstance(self.timeout_s, bool) or not 0 < self.timeout_s <= MAX_TIMEOUT_S:
            raise ValueError(
                f"Config.timeout_s: expected seconds in (0, {MAX_TIMEOUT_S:g}] (a week), got "
                f"{self.timeout_s!r}. Fix: pass a finite number of seconds, e.g. timeout_s=600."
            )
        if self.max_steps_in_flight is not None and (
            isinstance(self.max_steps_in_flight, bool)
            or not isinstance(self.max_steps_in_flight, int)
            or self.max_steps_in_flight < 0
        ):
            raise ValueError(
                "Config.max_steps_in_flight: expected None (the platform's default), 0 "
                f"(unbounded) or a positive int, got {self.max_steps_in_flight!r}."
            )
        if self.routes is not None:
            object.__setattr__(self, "routes", _check_routes(self.routes))

    @staticmethod
    def from_profile(profile: Any, **overrides: Any) -> Config:
        """A Config whose routes, latency threshold and shard size come from ``profile``.

        The design card's entry to `coarse.diagnostics.config_from_profile`,
        which documents the rules. A Config stays a plain value:
        `coarse_jax.config` imports nothing from `coarse_jax.profiling`, not
        even when this is called (the import contract checks it); the profiler
        hands its builder in when it loads (`register_profile_builder`), which
        ``import coarse_jax`` does.

        Args:
          profile: a `coarse.diagnostics.Profile`.
          **overrides: Config fields to set instead (``leading_bytes``,
            ``topology``, ``step_times_s``, ...).

        Returns:
          The `Config`.

        Raises:
          ValueError: an override that is not a Config field, or a value Config rejects.

        Example:
          >>> topo = coarse.EmulatedTopology.preset("v100", 4, clock="virtual")
          >>> prof = coarse.diagnostics.profile(mesh, topology=topo, sizes=[1 << 10, 1 << 22])
          >>> cfg = coarse.Config.from_profile(prof, topology=topo)
          >>> cfg == coarse.diagnostics.config_from_profile(prof, topology=topo)
          True
        """
        if _profile_builder is None:
            raise RuntimeError(
                "Config.from_profile: no profiler is loaded. Fix: import coarse_jax (it loads "
                "coarse_jax.profiling), or call coarse.diagnostics.config_from_profile."
            )
        return _profile_builder(profile, **overrides)

    def routes_for(self, workers: int, proxies: int | None = None) -> tuple[tuple[int, int], ...]:
        """The routing table for ``workers`` workers and ``proxies`` proxies, checked.

        Args:
          workers: the mesh's number of workers p.
          proxies: its number of proxies q (default p); worker i's local
            proxy is ``i // (p // q)``.

        Returns:
          One ``(latency_proxy, bandwidth_proxy)`` pair per worker; without
          ``routes``, each worker's local proxy for both.

        Raises:
          ValueError: ``routes`` has another number of pairs, or names a proxy
            outside ``range(proxies)``.

        Example:
          >>> coarse.Config().routes_for(2)
          ((0, 0), (1, 1))
          >>> coarse.Config(routes=((0, 1), (1, 0))).routes_for(2)
          ((0, 1), (1, 0))
          >>> coarse.Config().routes_for(4, proxies=2)   # COARSE(2:1)
          ((0, 0), (0, 0), (1, 1), (1, 1))
        """
        q = workers if proxies is None else proxies
        if self.routes is None:
            return tuple((local_proxy(i, workers, q),) * 2 for i in range(workers))
        if len(self.routes) != workers:
            raise ValueError(
                f"Config.routes: expected {workers} (latency_proxy, bandwidth_proxy) pairs, one "
                f"per worker of the mesh, got {len(self.routes)}."
            )
        for i, pair in enumerate(self.routes):
            if any(not 0 <= proxy < q for proxy in pair):
                raise ValueError(
                    f"Config.routes[{i}]: proxies are numbered 0..{q - 1} (the mesh's {q} "
                    f"proxies); got {pair}. Fix: route worker {i} to proxies of this mesh, "
                    f"e.g. ({i * q // workers}, {(i * q // workers + 1) % q}), or build the "
                    "Config from this mesh's profile (Config.from_profile)."
                )
        return self.routes
