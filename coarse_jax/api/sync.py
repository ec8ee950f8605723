"""`coarse.sync`: a train step compiled as one SPMD program over the workers of the mesh.

The proxies run no XLA program: their part of each step is the runtime's
service (ffi/runtime/service.h), started by the workers' custom calls.

`SyncedStep` dispatches the calls; the jobs it hands out: the arguments'
binding (`_arguments`), the program (`_program`), whether the params are
checked (`_params_check`), the calls in flight (`_in_flight`), the proxies'
state (`proxy_state`), and what it tells about itself (`step_info`).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import jax
import numpy as np
from jax.sharding import Mesh

from coarse_jax import _ffi
from coarse_jax.api.collectives import all_reduce
from coarse_jax.api.proxy_state import ProxyState
from coarse_jax.api.reprofile import changes_plans, check_reprofile, reprofiled
from coarse_jax.api.snapshots import Snapshots
from coarse_jax.api.step_info import StepInfo
from coarse_jax.config import Config
from coarse_jax.dispatch import arguments as _arguments
from coarse_jax.dispatch import arrival, context, nnx, outputs, placement, static_leaves, uniform
from coarse_jax.dispatch import binding as _binding
from coarse_jax.dispatch.binding import CallBinding
from coarse_jax.dispatch.compiles import Compiles
from coarse_jax.dispatch.in_flight import DeviceOrder, InFlight
from coarse_jax.dispatch.params_check import ParamsCheck
from coarse_jax.dispatch.program import compile_program
from coarse_jax.mesh import DATA, Tiers, check_mesh, has_hosts, platform

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _to_proxies(
    method: Callable[Concatenate[ProxyState, _P], _R],
) -> Callable[Concatenate[SyncedStep, _P], _R]:
    """A `SyncedStep` method that is its `ProxyState`'s (the same signature and docs)."""

    @functools.wraps(method)
    def forward(step: SyncedStep, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return method(step._proxies, *args, **kwargs)

    return forward


class SyncedStep(StepInfo):
    """A train step compiled by `coarse.sync`; call it like the function it wraps.

    Calling it runs one step on the workers (the proxies' part runs in the
    runtime's service) and returns the step's
    outputs (replicated, or per example for ``batch_outputs``). The methods
    report the step (`config`, `stats`, `timeline`) and, when it calls
    `coarse.value_and_update`, reach the state the proxies hold
    (`optimizer_state`, `master_params`, `load_optimizer_state`,
    `reset_optimizer`, `snapshot`, `restore`, `wait_snapshots`). The methods
    that take ``index`` name which `coarse.value_and_update` call of the step
    they mean, in trace order; it may be left out when there is one.

    Attributes:
      mesh: the mesh it was decorated with (`coarse.make_mesh`'s: its workers).

    Example:
      >>> @coarse.sync(mesh)
      ... def step(w, batch):
      ...     return coarse.value_and_grad(lambda w, b: jnp.mean((b @ w) ** 2))(w, batch)
      >>> loss, grad = step(jnp.ones((3,)), jnp.ones((8, 3)))
      >>> float(loss), grad.shape, step.stats()["calls"]
      (9.0, (3,), 1)
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        mesh: Mesh,
        tiers: Tiers,
        config: Config | None,
        batch_outputs: int | Sequence[int] | None = None,
        snapshots: Snapshots | None = None,
        **argument_options: Any,
    ) -> None:
        # argument_options: `coarse.sync`'s *_argnums / *_argnames, for
        # `_arguments.Arguments` (which checks them and names the option).
        functools.update_wrapper(self, fn)
        self.mesh = mesh
        # Its workers and proxies, fixed now (a later make_mesh of the same
        # workers may record other proxies: coarse_jax.mesh.ProxiesReplaced).
        self._tiers = tiers
        # The workers over all hosts: a batch's leading axis is split over them.
        self._all_workers = tiers.shape[DATA] * (tiers.shape["host"] if has_hosts(tiers) else 1)
        # Final here: a mesh over several processes' devices needs jax.distributed first.
        self._across_processes = has_hosts(mesh) and jax.process_count() > 1
        self._fn = fn
        self._name: str = getattr(fn, "__name__", "step")
        self._two_tier_outputs = placement.TwoTierOutputs(self._name)  # old-style placement
        self._arguments = _arguments.Arguments(fn, self._name, **argument_options)
        self._batch_outputs = tuple(
            sorted(set(_binding.indices(batch_outputs, "batch_outputs", self._name)))
        )
        # The config can change when re-profiling re-plans; a compiled program
        # is kept per config, so an unchanged plan never recompiles.
        self._config = config or Config()
        # Per (binding, config, whether the proxies check the params): its program.
        self._compiled: dict[tuple[CallBinding, Config, bool], Callable[..., Any]] = {}
        self._params_check = ParamsCheck()  # which of the two a call runs
        self._compiles = Compiles(self._name)  # XLA's compiles of those programs
        # The first call's (what, signature) of each non-batch argument: the
        # proxies' state (value_and_update) is laid out for it.
        self._first_structure: tuple[tuple[str, _binding.Signature], ...] | None = None
        self._plans: list[context.PlanRequest] = []  # what the traces planned
        self._site_names: dict[int, str] = {}  # site -> "coarse.all_reduce", ... (traces)
        self._calls = 0
        self._reprofiles = 0
        self._arrival = arrival.Arrival(self._name)  # across hosts only
        self._in_flight = InFlight(platform(tiers))  # Config.max_steps_in_flight
        # The streams backend: programs of a device in dispatch order across steps.
        self._device_order = DeviceOrder(
            [*np.asarray(tiers.devices).flat, *(d for row in tiers.proxies.devices for d in row)],
            own_calls=tiers.proxies.on == "host",
        )
        if snapshots is not None and not isinstance(snapshots, Snapshots):
            raise TypeError(
                f"coarse.sync: snapshots must be a coarse.Snapshots, got {snapshots!r}. Fix: "
                "snapshots=coarse.Snapshots(every=K, directory=...)."
            )
        # The proxies' state (value_and_update's stores, snapshots, the
        # reference mode's state): its one holder.
        self._proxies = ProxyState(
            self._name,
            self._config.mode == "reference",
            self._in_flight.wait_all,
            self._params_check,
            snapshots or Snapshots(),
        )
        self._traced_plans: list[Any] = []  # the plans of the latest trace
        # Whether a trace's outputs held non-array leaves (dispatch/static_leaves.py).
        self._static_outputs = False

    def _wait_all(self) -> None:
        """Blocks until every call dispatched so far finished (errors are the caller's)."""
        self._in_flight.wait_all()

    # The proxies' state: its holder's methods (`coarse_jax.api.proxy_state`).
    optimizer_state = _to_proxies(ProxyState.optimizer_state)
    master_params = _to_proxies(ProxyState.master_params)
    load_optimizer_state = _to_proxies(ProxyState.load_optimizer_state)
    reset_optimizer = _to_proxies(ProxyState.reset_optimizer)
    snapshot = _to_proxies(ProxyState.snapshot)
    wait_snapshots = _to_proxies(ProxyState.wait_snapshots)
    restore = _to_proxies(ProxyState.restore)

    @property
    def restored_count(self) -> int | None:
        """After `restore`, the optimizer step count restored (the data position to
        resume from); None before any."""
        return self._proxies.restored_count

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        repeat = self._arguments.repeat(args, kwargs)  # a training loop's next call
        if repeat is not None:
            binding, full, graph_state = repeat, args, None
        else:
            binding, full, graph_state = self._bind(args, kwargs)
        cfg = self._config
        if cfg.reprofile_every:
            check_reprofile(self._tiers, binding.outer_trace, self._name)
        graph_nodes = tuple(full[i] for i in binding.graph)
        passed = [i for i in binding.dynamic() if i not in binding.graph]
        trees = [(full[i], i in binding.batch) for i in passed]
        if binding.graph:
            trees.append((graph_state, False))
        # on_mesh: where the outputs go (None: they stay on the workers).
        if repeat is not None:  # remembered only where nothing moved
            on_mesh, dyn = None, [t for t, _ in trees]
        else:
            on_mesh, dyn = placement.onto_workers(self.mesh, trees)
            if on_mesh is None and all(d is t for d, (t, _) in zip(dyn, trees, strict=True)):
                self._arguments.remember(args, kwargs, binding)
        base = (binding, cfg)
        unused = [c for c in (False, True) if (*base, c) not in self._compiled]
        if binding.outer_trace:
            self._params_check.outer_trace()
        proxies = self._proxies
        check = self._params_check.needed(
            base,
            [s.runtime.id for s in proxies.stores.values()],
            [full[i] for i in passed],
            lambda: self._program(base, False).trace(*dyn, proxies.ref_state),
        )
        key = (binding, cfg, check)
        new = check in unused  # (the map's trace may have built it, not called it)
        jitted = self._program(base, check)
        if binding.outer_trace:  # inside the user's jit: its outputs are tracers
            on_mesh = None
        # Ctrl-C abandons a step stalled in the runtime (unless the program
        # installed its own SIGINT handler); checked per call, about 2.5 us.
        _ffi.arm_interrupt_hook()
        across = self._across_processes and not binding.outer_trace
        if across:
            # Every process must dispatch this call: a host that never comes
            # fails the others here, naming it, instead of a hang in the
            # inter-host collective.
            # Programs counted without the check's variants: processes decide those apart.
            programs = len({k[:2] for k in self._compiled})
            self._arrival.wait(self._calls, cfg.timeout_s, programs=programs)
        if new and cfg.mode == "ffi":
            # Before anything runs: a coarse call that only some devices would
            # run (inside a cond on a mesh axis) is a TypeError, not a hang.
            # jit caches the trace, so the call below does not trace again.
            uniform.check(jitted.trace(*dyn, proxies.ref_state).jaxpr, self._site_names, self._name)
            if across:  # the trace just built this program's plans
                keys = [int(plan.ffi_attrs()["plan_key"]) for plan in self._traced_plans]
                try:
                    self._arrival.same_plans(self._calls, keys, cfg.timeout_s)
                except ValueError:
                    del self._compiled[key]  # checked again, on every process, next call
                    raise
        proxies.before_call(lambda: jitted.trace(*dyn, proxies.ref_state))
        if not binding.outer_trace:  # Config.max_steps_in_flight, with this call
            self._in_flight.make_room(cfg)
            self._device_order.wait_for_others()
        if new and not binding.outer_trace:
            self._compiles.first_call(key, self._arguments.named(binding, passed, dyn))
        *results, proxies.ref_state = jitted(*dyn, proxies.ref_state)
        if not binding.outer_trace:
            self._params_check.dispatched()
        if repeat is None and not binding.outer_trace:  # a repeat's types meet jit's cache
            self._compiles.after_call(
                key, jitted, lambda: self._arguments.named(binding, passed, dyn)
            )
        proxies.after_call()
        replicated, per_example, new_state = results
        if not binding.outer_trace:
            # An NNX step may return nothing else; wait_all waits for steps whose
            # proxies hold state, or that trace.
            self._in_flight.add(cfg, results, keep_last=bool(proxies.stores) or cfg.trace)
            self._device_order.note(results)
        if on_mesh is not None:  # outputs follow arguments put on a two-tier mesh
            replicated, per_example, new_state = self._two_tier_outputs.place(
                (replicated, per_example, new_state), on_mesh
            )
        if binding.graph:
            nnx.update(graph_nodes, new_state)
        result = outputs.join(replicated, per_example, self._batch_outputs)
        if not binding.outer_trace:
            self._count_call()
            self._params_check.returned(base, result)
        # Only a step whose outputs hold leaves compiled in pays for looking.
        return static_leaves.release(result) if self._static_outputs else result

    def _program(self, base: tuple[CallBinding, Config], check: bool) -> Any:
        """The jitted program of ``base`` (binding, config) with or without the params check."""
        key = (*base, check)
        if key not in self._compiled:
            self._compiled[key] = self._compile(base[1], base[0], check)
        return self._compiled[key]

    def _count_call(self) -> None:
        self._calls += 1
        cfg = self._config
        if cfg.reprofile_every and self._calls % cfg.reprofile_every == 0:
            self._reprofile()

    def _bind(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[CallBinding, tuple[Any, ...], Any]:
        """(the call's binding, all its arguments in order, the state of its NNX arguments)."""
        binding, full, graph_state = self._arguments.binding(args, kwargs)
        _binding.check_batch(
            full, binding, self._all_workers, self._name, self._arguments.batch_chosen
        )
        self._check_structure(binding)
        return binding, full, graph_state

    def _check_structure(self, binding: CallBinding) -> None:
        """A new structure of the non-batch arguments compiles a new program (as ``jax.jit``
        retraces), unless the proxies hold state laid out for the first one."""
        if self._first_structure is None:
            self._first_structure = binding.structure
        elif self._proxies.stores:
            _binding.check_structure(self._first_structure, binding.structure, self._name)

    def _compile(self, cfg: Config, binding: CallBinding, check: bool) -> Callable[..., Any]:
        if cfg.mode == "ffi":
            _ffi.check_platform(self._tiers)
        return compile_program(
            weakref.ref(self),
            self._tiers,
            self._fn,
            cfg,
            binding,
            name=self._name,
            batch_outputs=self._batch_outputs,
            mean_state=all_reduce,
            check_params=check,
            on_io_map=functools.partial(self._params_check.traced, (binding, cfg)),
        )

    def _trace_context(
        self, cfg: Config, ref_in: dict[int, Any], check_params: bool
    ) -> context.SyncContext:
        """The context of one trace of the step's program (`compile_program`'s body)."""
        ctx = context.SyncContext(
            self._tiers,
            cfg,
            self._plans,
            stores=self._proxies.stores,
            step_name=self._name,
            site_names=self._site_names,
            ref_in=ref_in,
            ref_optimizers=self._proxies.ref_optimizers,
            check_params=check_params,
            snapshot_every=self._proxies.snapshots.every,
        )
        self._traced_plans = ctx.built
        return ctx

    def _count_outer_call(self) -> None:
        self._calls += 1

    def _outputs_hold_static(self) -> None:
        self._static_outputs = True

    def _reprofile(self) -> None:
        new = reprofiled(self._tiers, self._config)
        self._reprofiles += 1
        # Switch (and recompile) only if some plan of this step changes.
        if changes_plans(self._tiers, self._plans, self._config, new):
            self._plans.clear()
            self._config = new


SyncOptions = dict[str, Any]


def sync(
    fn: Callable[..., Any] | Mesh | None = None,
    mesh: Mesh | None = None,
    *,
    config: Config | None = None,
    batch_argnums: int | Sequence[int] | None = None,
    static_argnums: int | Sequence[int] | None = None,
    donate_argnums: int | Sequence[int] | None = None,
    batch_outputs: int | Sequence[int] | None = None,
    batch_argnames: str | Sequence[str] | None = None,
    static_argnames: str | Sequence[str] | None = None,
    donate_argnames: str | Sequence[str] | None = None,
    snapshots: Snapshots | None = None,
) -> SyncedStep | Callable[[Callable[..., Any]], SyncedStep]:
    """Runs a train step as one SPMD program over the workers of a coarse mesh.

    ``jit(shard_map(fn))`` over the workers (the mesh `coarse.make_mesh`
    returns, axis "data";
    the proxies run no XLA program, their part of the step is the runtime's
    service): arguments other than the batch are replicated on the workers,
    the batch's leading axis is split over "data", outputs are replicated.
    Inside, use `coarse.value_and_grad` / `coarse.value_and_update` /
    `coarse.all_reduce`.

    Flax NNX objects (modules, optimizers, metrics, ``nnx.Rngs``) passed as
    arguments behave as under ``nnx.jit``: updated in place. State the step
    changed per worker (batch statistics, metrics, RNG counts) is averaged
    over the workers; each worker draws its own random numbers.

    Equinox Modules are taken as ``eqx.filter_jit`` takes them: array leaves
    are traced; every other leaf (a function, a string, and inside a Module a
    Python number or flag) is compiled in, hashed and compared, and comes back
    in the outputs as it went in. Elsewhere a Python number is traced, as
    ``jax.jit`` traces it. An ``eqx.nn.State`` is each worker's inside the step
    and leaves it as the workers' mean.

    A step is called as the function it wraps, keyword arguments included,
    as ``jax.jit`` takes them: a keyword naming a positional parameter takes
    its position (``*_argnums`` count it), a default it skips over is
    compiled in, keyword-only arguments stay keywords (name them with the
    ``*_argnames`` options). The batch is ``batch_argnums`` /
    ``batch_argnames``; by default the last argument, in the signature's
    order, that is not static, not an NNX object and has no default value
    (``step(params, batch, lr=0.1)`` splits ``batch``).

    A new structure or shape of the non-batch arguments compiles a new
    program, as ``jax.jit`` retraces, unless the step's proxies hold state
    laid out for the first call's (a `coarse.value_and_update` step): that
    raises, naming the leaves that changed. The batch may change shape
    (that recompiles, as ``jax.jit`` does). With ``Config(reprofile_every=N)``
    the links are profiled again every N calls and the step re-planned,
    recompiling only if routes, threshold or shard size changed. The returned
    `SyncedStep` has ``step.config()`` (the Config in use) and ``step.stats()``.

    Where the outputs go: onto the workers, where state placed on the mesh
    (``NamedSharding(mesh, P())``) already is. Code written for a two-tier
    mesh (``coarse.sync(coarse_jax.mesh.two_tier_mesh(mesh))``, or one built
    by hand, with state placed on it) still runs: its outputs follow such an
    argument onto that whole mesh, as ``jax.jit`` would place them, and the
    first such call warns (``LegacyPlacement``) with what the copies onto the
    proxies' devices cost. Inside the step "tier" is bound with size 1 (the
    program runs on the workers), so ``lax.axis_index("tier")`` is 0.

    Args:
      fn: the step; or the mesh, for ``@coarse.sync(mesh)``.
      mesh: a mesh from `coarse.make_mesh` (its proxies are fixed now), or a
        two-tier device mesh (`coarse_jax.mesh.two_tier_mesh`).
      config: default `Config` for the coarse calls inside.
      batch_argnums: which positional arguments are sharded over "data";
        default (None): the last one; ``()``: none (every argument replicated).
      static_argnums: positional arguments compiled in, as in ``jax.jit``
        (hashable; a new value compiles a new program).
      donate_argnums: positional arguments whose buffers the step may reuse
        for its outputs, as in ``jax.jit`` (the caller must not use them again).
      batch_outputs: positions of a tuple output that are per example (e.g.
        logits): the workers' values are concatenated along axis 0. Every
        other output must be the same on every device.
      batch_argnames: parameter names of the batch arguments (keyword or
        positional), with or instead of ``batch_argnums``.
      static_argnames: parameter names of static arguments, as in ``jax.jit``.
      donate_argnames: parameter names of donated arguments, as in ``jax.jit``.
      snapshots: when the proxies snapshot the state of the step's
        `coarse.value_and_update` calls and where they write it
        (`coarse.Snapshots`); None: only on demand (`SyncedStep.snapshot`), in
        memory.

    Returns:
      The compiled step, a `SyncedStep` (or, given only the mesh, a decorator
      that returns one).

    Raises:
      TypeError: two meshes were passed; an ``*_argnums`` is not an int or a
        sequence of ints; a static argument is not hashable; an output
        differs per device (when the step is called).
      ValueError: the mesh is not a coarse mesh (from `coarse.make_mesh`);
        an ``*_argnums`` names no argument, an ``*_argnames`` no parameter;
        at a call, a batch leaf's leading axis is not divisible by the
        workers, or a `coarse.value_and_update` step's non-batch arguments
        changed structure or shapes since the first call.

    Example:
      >>> def loss_fn(params, batch):
      ...     return jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2)
      >>> @coarse.sync(mesh, donate_argnums=0)
      ... def train_step(params, batch):
      ...     loss, grads = coarse.value_and_grad(loss_fn)(params, batch)
      ...     return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss
      >>> params = {"w": jnp.zeros((3, 1))}
      >>> batch = {"x": jnp.ones((8, 3)), "y": jnp.ones((8, 1))}   # 2 rows per worker
      >>> params, loss = train_step(params, batch)
      >>> float(loss)
      1.0
    """
    arguments: SyncOptions = {
        "batch_argnums": batch_argnums,
        "batch_argnames": batch_argnames,
        "static_argnums": static_argnums,
        "static_argnames": static_argnames,
        "donate_argnums": donate_argnums,
        "donate_argnames": donate_argnames,
    }
    if isinstance(fn, (Mesh, Tiers)) and mesh is None:
        fn, mesh = None, fn
    if isinstance(fn, (Mesh, Tiers)):
        raise TypeError("coarse.sync: got two meshes; pass the step function and one mesh.")
    tiers = check_mesh(mesh, "coarse.sync")  # (Tiers: a mesh's, fixed by the library's own code)
    given = mesh if isinstance(mesh, Mesh) else tiers.workers

    def decorate(f: Callable[..., Any]) -> SyncedStep:
        return SyncedStep(f, given, tiers, config, batch_outputs, snapshots, **arguments)

    return decorate if fn is None else decorate(fn)
