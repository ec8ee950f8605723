"""The latency route: a small tree reduced by XLA as one psum (`Plan.xla`).

`coarse_jax.plan.xla_route` decides which trees take it; this is what they
run. `coarse_jax.reference` reduces leaf by leaf (the oracle's plain form);
here the tree is one f32 vector, so one collective runs instead of one per
leaf: a psum costs XLA:CPU about 90 µs of fixed time, so a tree of 32
leaves of 1 KiB took 2.9 ms leaf by leaf and one collective's time as one
vector. Each element's sum is the same as leaf by leaf (the same f32
values added over the same workers), so the route's bits equal
``mode="reference"``'s.

The tree first passes `coarse_jax._ffi.route_marker`, so that the route
behaves as the proxies' calls do whatever the tree's size: ``jax.vmap`` and
differentiation are refused with the same messages, and a call under a
per-device predicate is refused at trace time (`coarse_jax.dispatch.uniform`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from coarse_jax import _ffi, reference


def all_reduce(
    leaves: list[jax.Array], workers: int, mean: bool = True, *, where: str, platform: str
) -> list[jax.Array]:
    """The mean (or sum) over the workers of every leaf, as one psum of their f32 values.

    Must run inside the step's ``shard_map`` over the workers (`coarse.sync`);
    ``where`` is the public call ("coarse.all_reduce"), for errors; ``platform``
    the workers' ("cpu" lays the tree out with the CPU extension's custom calls).
    """
    leaves = _ffi.route_marker(_ffi.vary(list(leaves)), where)
    if len(leaves) < 2:
        return list(reference.all_reduce(leaves, workers, mean))
    if platform == "cpu":
        # The tree laid end to end and cut again by two custom calls, a loop per
        # leaf each (widening to f32, narrowing back): XLA's concatenate, slices
        # and casts would be generated code per leaf (its offset differs),
        # seconds of compiling at 250 leaves.
        (total,) = reference.all_reduce([_ffi.route_join(leaves)], workers, mean)
        return _ffi.route_split(total, leaves)
    flat = jnp.concatenate([jnp.ravel(x).astype(jnp.float32) for x in leaves])
    (total,) = reference.all_reduce([flat], workers, mean)
    out, start = [], 0
    for x in leaves:
        out.append(total[start : start + x.size].reshape(x.shape).astype(x.dtype))
        start += x.size
    return out
