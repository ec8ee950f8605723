"""The runtime's layouts of a plan, as Python reads them from the extension (`_ffi.layout`).

Python computes none of these again: the arena each proxy holds, what each
proxy hands to the sum over hosts, the optimizer state a store takes, and the
32-bit key the hosts compare are asked of the C++ runtime. These tests hold
what the extension answers against an independent statement of each layout
(the design's, written here once) on random plans, and against what the
runtime allocates when a step runs.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import coarse_jax as coarse
from coarse_jax import _ffi

DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


def _arena_nelems(plan) -> list[int]:
    """Per proxy: one f32 slot per worker routing a piece to it, at least one per piece."""
    out = [0] * plan.proxies
    for piece in plan.pieces:
        for k in range(plan.proxies):
            out[k] += max(1, piece.dest.count(k)) * piece.nelems
    return out


def _owned_nelems(plan, pieces) -> list[int]:
    """Per proxy: what it holds reduced after the reduce-scatter of ``pieces``.

    A piece every worker routes to one proxy (DENSE) is that proxy's whole.
    A ring piece's two halves are each cut into q chunks over the ring of the
    q proxies; proxy k owns chunk ``(k + 1) % q`` of the first half and chunk
    ``(q - k + 1) % q`` of the second (the ring runs both ways).
    """
    q = plan.proxies
    out = [0] * q
    for piece in pieces:
        n = piece.nelems
        if len(set(piece.dest)) == 1:
            out[piece.dest[0]] += n
            continue
        bounds = (0, n // 2, n)
        for k in range(q):
            for r in range(2):
                size = bounds[r + 1] - bounds[r]
                c = ((k if r == 0 else (q - k) % q) + 1) % q
                out[k] += (c + 1) * size // q - c * size // q
    return out


@st.composite
def plans(draw):
    """A random plan: 1..4 proxies of 1..3 workers each, random routes, shard size and
    threshold, 1..7 leaves of random sizes and dtypes, each a parameter or not (kept in
    separate pieces, as `coarse.value_and_update` keeps the loss apart)."""
    q = draw(st.integers(1, 4))
    p = q * draw(st.integers(1, 3))
    routes = tuple(draw(st.tuples(st.integers(0, q - 1), st.integers(0, q - 1))) for _ in range(p))
    cfg = coarse.Config(
        routes=routes,
        shard_bytes=draw(st.sampled_from([8, 64, 256, 4096])),
        latency_threshold_bytes=draw(st.sampled_from([1, 64, 512, 1 << 20])),
    )
    n = draw(st.integers(1, 7))
    sizes = draw(st.lists(st.integers(1, 700), min_size=n, max_size=n))
    dtypes = draw(st.lists(st.sampled_from(DTYPES), min_size=n, max_size=n))
    params = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    tree = [jax.ShapeDtypeStruct((s,), d) for s, d in zip(sizes, dtypes, strict=True)]
    groups = [0 if is_param else 1 for is_param in params]
    plan = coarse.diagnostics.plan(tree, p, cfg, proxies=q, groups=groups)
    return plan, params


@settings(max_examples=300, deadline=None)
@given(plans(), st.sampled_from([("sgd", 0.0), ("sgd", 0.9), ("adam", 0.0), ("adamw", 0.0)]))
def test_the_runtimes_layout_of_random_plans(planned, optimizer):
    plan, params = planned
    kind, momentum = optimizer
    opt = {
        "sgd": lambda: coarse.optim.sgd(0.1, momentum=momentum),
        "adam": lambda: coarse.optim.adam(1e-3),
        "adamw": lambda: coarse.optim.adamw(1e-3),
    }[kind]()
    param_leaves = [s for s, t in enumerate(plan.sync_order) if params[t]]
    layout = _ffi.plan_layout(
        plan.ffi_attrs(), param_leaves=param_leaves, optimizer=opt.ffi_attrs()
    )
    assert list(layout.arena_nelems) == _arena_nelems(plan), plan.summary()
    assert list(layout.exchange_nelems) == _owned_nelems(plan, plan.pieces), plan.summary()
    updated = [pc for pc in plan.pieces if params[plan.sync_order[pc.segments[0][0]]]]
    # Master and state slots, both versions, then two sets of lr and bias corrections (8).
    want = [2 * (1 + opt.slots) * max(1, n) + 8 for n in _owned_nelems(plan, updated)]
    assert list(layout.state_floats) == want, plan.summary()
    # Without a store's description, the same plan and no state.
    bare = _ffi.plan_layout(plan.ffi_attrs())
    assert (bare.arena_nelems, bare.state_floats) == (layout.arena_nelems, ())


@settings(max_examples=200, deadline=None)
@given(st.integers(0, (1 << 63) - 1))
def test_the_hosts_plan_key_is_the_low_31_bits(key):
    assert _ffi.host_plan_key(key) == key & 0x7FFFFFFF


@pytest.mark.parametrize("proxies", [4, 2])
def test_a_stores_state_as_computed_is_what_the_runtime_allocates(proxies):
    mesh = coarse.make_mesh(workers=4, proxies=proxies)
    opt = coarse.optim.adam(1e-2)
    params = {"a": jnp.ones((37,)), "b": jnp.ones((5, 3)), "c": jnp.ones((1000,), jnp.bfloat16)}
    batch = jnp.ones((8, 1))
    cfg = coarse.Config(shard_bytes=512)

    @coarse.sync(mesh, config=cfg)
    def step(params, batch):
        def loss(p, b):
            squares = [jnp.sum(x.astype(jnp.float32) ** 2) for x in jax.tree.leaves(p)]
            return jnp.mean(b) * sum(squares)

        return coarse.value_and_update(loss, opt)(params, batch)[::-1]

    computed = coarse.diagnostics.memory_report(
        step, params, batch
    ).proxy.optimizer_bytes  # before a step
    params, _ = step(params, batch)
    measured = coarse.diagnostics.memory_report(step, params, batch).proxy.optimizer_bytes
    assert computed == measured > 0


def test_plan_layout_refuses_a_malformed_plan():
    plan = coarse.diagnostics.plan({"w": jnp.zeros((8,))}, 2)
    attrs = dict(plan.ffi_attrs())
    attrs["piece_dest"] = np.array([0, 5])  # proxy 5 of 2
    with pytest.raises(ValueError, match="piece_dest names a proxy outside"):
        _ffi.plan_layout(attrs)
