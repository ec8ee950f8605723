"""The program of a `coarse.sync` step: ``jit(shard_map(body))`` over the workers.

The body rebuilds the call's arguments from its binding, runs the user's
function under the step's `SyncContext`, averages the NNX state the workers
changed, and splits the outputs into replicated and per-example ones. The
proxies run no XLA program: their part is the runtime's service, driven by
the workers' custom calls.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import jax
from jax import lax
from jax.sharding import PartitionSpec as P

from coarse_jax import _jax_compat
from coarse_jax.config import Config
from coarse_jax.dispatch import (
    axis_names,
    context,
    eqx_state,
    nnx,
    outputs,
    params_check,
    static_leaves,
)
from coarse_jax.dispatch.binding import CallBinding
from coarse_jax.mesh import DATA, PROGRAM_HOST_AXES, Tiers, batch_axes, workers_mesh


class Traced(Protocol):
    """What the body asks of its step while it is traced."""

    def _trace_context(
        self, cfg: Config, ref_in: dict[int, Any], check_params: bool
    ) -> context.SyncContext:
        """A new context for one trace (the step keeps the plans it builds)."""
        ...

    def _count_outer_call(self) -> None:
        """Counts one call of the step run under an outer jit."""
        ...

    def _outputs_hold_static(self) -> None:
        """Says that a trace's outputs hold leaves compiled in (`static_leaves`): the step
        releases them from its results from now on."""
        ...


def compile_program(
    step: weakref.ref[Traced],
    mesh: Tiers,
    fn: Callable[..., Any],
    cfg: Config,
    binding: CallBinding,
    *,
    name: str,
    batch_outputs: tuple[int, ...],
    mean_state: Callable[[Any], Any],
    check_params: bool = True,
    on_io_map: Callable[[params_check.IoMap], None] | None = None,
) -> Callable[..., Any]:
    """The jitted program of ``binding``'s calls, given the passed arguments (the NNX state
    last) and the reference-mode update state; it returns (replicated, per-example, new
    NNX state, new reference-mode update state).

    The program holds the step only weakly (the step holds the program): a
    cycle would keep the proxies' state, gigabytes for a big model, until
    Python's cycle collector happens to run. The body looks the step up when
    it is traced, which is while the step is called.

    ``mean_state``: the float mean over the workers that makes an NNX state the
    same on every device (`coarse.all_reduce`, passed down by the step: the
    dispatcher sits below the user's calls and imports none of them).
    ``check_params``: whether the proxies check the params of its
    value_and_updates; ``on_io_map`` gets, once traced, where their params and
    new params are among its inputs and outputs (`coarse_jax.dispatch.params_check`).
    """
    passed = [i for i in binding.dynamic() if i not in binding.graph]
    static = dict(binding.static)
    program_mesh = workers_mesh(mesh)
    # jax.grad inside the step differentiates the workers' mean loss, so code
    # written for jit or for pmap (a kept lax.pmean) gets the mean gradient
    # (`coarse_jax._jax_compat.mean_gradients` says how and why).
    batch_sizes = {a: program_mesh.shape[a] for a in PROGRAM_HOST_AXES if a in program_mesh.shape}

    def body(*dyn_and_ref: Any) -> Any:
        owner = step()
        assert owner is not None, "a coarse.sync step was traced after it was freed"
        # The last input: mode="reference" value_and_update state ({} otherwise).
        *dyn, ref_in = dyn_and_ref
        args: list[Any] = [None] * binding.n
        for i, v in static.items():
            args[i] = v
        for i, v in zip(passed, dyn, strict=False):
            args[i] = eqx_state.per_worker(static_leaves.release(v))
        nodes: tuple[Any, ...] = ()
        if binding.graph:
            nodes = nnx.merge(binding.graphdef, dyn[-1])
            for i, node in zip(binding.graph, nodes, strict=True):
                args[i] = node
        ctx = owner._trace_context(cfg, dict(ref_in), check_params or binding.outer_trace)
        context.stack().append(ctx)
        try:
            put_rngs_back = nnx.fold_rngs_by_worker(nodes) if nodes else None
            try:
                with _jax_compat.mean_gradients(batch_sizes):
                    out = binding.call(fn, args)
            except (AssertionError, NameError, ValueError, KeyError) as err:
                unknown = _jax_compat.unbound_axis_name(err, program_mesh.axis_names)
                if unknown is None:
                    raise
                raise axis_names.refusal(unknown, tuple(batch_sizes), name) from err
            # Non-array leaves of what it returns (a Module's activation) leave as
            # the program's static output structure, as eqx.filter_jit returns them.
            out = eqx_state.mean_over_workers(out, mean_state, ctx.workers)
            held = static_leaves.hold(out, "the step's output", name)
            if held is not out:
                owner._outputs_hold_static()
            out = held
            if on_io_map is not None and not binding.outer_trace:
                on_io_map(params_check.io_map(ctx.update_io, dyn[: len(passed)], out))
            new_state = None
            if nodes:
                assert put_rngs_back is not None
                put_rngs_back()
                new_state = nnx.consistent_state(nodes, mean_state, ctx.workers)
        finally:
            context.stack().pop()
        out = outputs.collapse_tier(out)
        if new_state is not None:
            new_state = outputs.collapse_tier(new_state)
        replicated, per_example = outputs.split(out, batch_outputs, name)
        outputs.check_replicated(replicated, name, batch_outputs)
        if binding.outer_trace:
            # Counted where it runs: an outer jit traces this body once.
            jax.debug.callback(
                functools.partial(_count_on_first_device, step), lax.axis_index(DATA)
            )
        return replicated, per_example, new_state, ctx.ref_out

    split = P(batch_axes(mesh))  # "data", or ("host", "data") across hosts
    in_specs = [split if i in binding.batch else P() for i in passed]
    donate = [k for k, i in enumerate(passed) if i in binding.donate]
    if binding.graph:
        in_specs.append(P())
        if set(binding.graph) & set(binding.donate):
            donate.append(len(passed))
    in_specs.append(P())  # the reference-mode update state, replaced every call
    donate.append(len(in_specs) - 1)
    # The program spans the workers only: the proxies are the runtime's
    # service (ffi/runtime/service.h), driven by the workers' custom calls.
    mapped = jax.shard_map(
        body,
        mesh=program_mesh,
        in_specs=tuple(in_specs),
        out_specs=(P(), split, P(), P()),
    )
    return jax.jit(mapped, donate_argnums=tuple(donate))


def _count_on_first_device(step: weakref.ref[Traced], data: Any) -> None:
    """Counts a call of a step run under an outer jit (once, on worker 0)."""
    owner = step()
    if owner is not None and int(data) == 0:
        owner._count_outer_call()
