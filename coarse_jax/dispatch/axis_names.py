"""An axis name a step uses that its program does not have: a coarse error naming both.

Code written for ``jax.pmap`` names its own axis (``pmap(..., axis_name="batch")``,
``nn.BatchNorm(axis_name="batch")``, ``lax.pmean(x, "batch")``). A coarse step's
workers are split over the mesh axis ``"data"`` (``("host", "data")`` across hosts),
so such a name is unbound inside the step, and jax fails with a bare
``AssertionError`` from ``pvary`` or a ``NameError`` that names no step. The step's
program reads the name from jax's frames (`coarse_jax._jax_compat.unbound_axis_name`);
this module says what to change.

A name that ``jax.vmap(..., axis_name=...)`` binds inside the step is not
refused: a collective over it runs as under ``jax.jit`` (``eqx.nn.BatchNorm``
under ``jax.vmap(model, axis_name="batch")``; `coarse_jax._jax_compat` says how).

Decision: the name is refused, not aliased. jax has no axis aliases, and binding the
program's axis under the user's name would change the name every coarse call inside
the step reduces over; one name everywhere (``"data"``) is also what the
user's model then uses with ``coarse.all_reduce``, as the Flax guide shows.
"""

from __future__ import annotations

from collections.abc import Sequence


def refusal(name: str, batch: Sequence[str], step: str) -> ValueError:
    """The error for a step that used axis ``name``; ``batch``: the program's batch axes."""
    axes = " and ".join(repr(a) for a in batch)
    use = batch[0] if len(batch) == 1 else tuple(batch)
    return ValueError(
        f"coarse.sync({step}): the step uses the axis name {name!r} (a lax.pmean/psum, "
        f"lax.axis_index, or a model's axis_name=, as a pmap program names its axis), but "
        f"nothing binds it inside the step: it is no mesh axis (a coarse step's workers are "
        f"split over the mesh axis {axes}), and no jax.vmap(..., axis_name={name!r}) around "
        "the collective names it (a vmap axis works, as under jax.jit). Fix: name the axis "
        f"{use!r} where the step and its model use {name!r}, e.g. "
        f"nn.BatchNorm(axis_name={use!r}), lax.pmean(x, {use!r}), "
        f"DynamicScale().value_and_grad(..., axis_name={use!r})."
    )
