"""The four sync calls through XLA on one device, CPU and (when present) GPU.

A coarse mesh needs 2p devices, so on a single GPU no `coarse.sync` step can
run. One device can still run a whole p = 1 step by playing both tiers in
one jitted program: worker 0's calls and proxy 0's calls, chained by their
tokens in the order a step runs them (pushes, proxy ring, worker ring on the
worker then on the proxy, pull on the worker then on the proxy). The caller
is named as the platform names it: on CPU by the (tier, data) operand, on
CUDA by the device ordinal looked up in the "ordinals" attribute (the proxy's
calls list a placeholder ordinal for the worker, so the GPU's ordinal names
the proxy; a worker call comes first and opens the session, whose storage
its ordinals place on this GPU).
That exercises each platform's binding layer (run id, stream, ordinal,
attributes, results) and every phase of the protocol through XLA. With
p = 1 the mean is the value itself, so every result must equal its input.
"""

import itertools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from helpers import gpu_or_skip

import coarse_jax as coarse

_SITES = itertools.count(1 << 30)  # a fresh call site per program
_ELSEWHERE = 1 << 20  # an ordinal no GPU has


@pytest.fixture(params=["cpu", "gpu"])
def device(request):
    return jax.devices("cpu")[0] if request.param == "cpu" else gpu_or_skip()[0]


def _live_sessions(device):
    if device.platform == "cpu":
        from coarse_jax import _coarse_cpu

        return _coarse_cpu.live_sessions()
    return gpu_or_skip()[1].live_sessions()


def _step(plan, device):
    """One p = 1 step as one program: worker 0 and proxy 0 on `device`."""
    base = {**plan.ffi_attrs(), "site": np.int64(next(_SITES))}
    ordinal = device.local_hardware_id if device.local_hardware_id is not None else device.id
    tiers = {  # (tier, data) operand, ordinals attribute
        "worker": (np.array([0, 0], np.int32), np.array([ordinal, ordinal], np.int64)),
        "proxy": (np.array([1, 0], np.int32), np.array([_ELSEWHERE, ordinal], np.int64)),
    }

    def call(target, tier, results, operands, **attrs):
        who, ordinals = tiers[tier]
        return jax.ffi.ffi_call(target, results, has_side_effect=True, vmap_method="broadcast_all")(
            who, *operands, **base, ordinals=ordinals, **attrs
        )

    def step(*leaves):
        proxy_leaves = [leaves[i] for i in plan.proxy_leaves]
        lead = [leaves[i] for i in plan.leading_leaves]
        spec = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
        token_spec = jax.ShapeDtypeStruct((2,), jnp.int32)
        tok = jnp.zeros((), jnp.float32)
        for b in plan.buckets:
            bucket = proxy_leaves[b.first_leaf : b.first_leaf + b.num_leaves]
            (tok,) = call(
                "coarse_push",
                "worker",
                [jax.ShapeDtypeStruct((), jnp.float32)],
                [tok, *bucket],
                first_leaf=np.int64(b.first_leaf),
                first_piece=np.int64(b.first_piece),
                num_pieces=np.int64(b.num_pieces),
                passthrough=np.int64(0),
                last=np.int64(0),
            )
        # Every device runs every call; the worker's proxy ring (a no-op) comes
        # first, so a worker call always opens the session (its ordinals place
        # the storage).
        ring = tok
        for tier in ("worker", "proxy"):
            (ring,) = call("coarse_proxy_ring", tier, [token_spec], [ring], last=np.int64(0))
        outs = {}
        for tier in ("worker", "proxy"):
            *reduced, ring = call(
                "coarse_worker_ring",
                tier,
                [*(spec[i] for i in plan.leading_leaves), token_spec],
                [ring, *lead],
                last=np.int64(0),
            )
            outs[tier] = dict(zip(plan.leading_leaves, reduced, strict=True))
        pulled_spec = [spec[i] for i in plan.proxy_leaves]
        after = ring
        for tier in ("worker", "proxy"):
            pulled = call("coarse_pull", tier, pulled_spec, [after], last=np.int64(1))
            outs[tier].update(zip(plan.proxy_leaves, pulled, strict=True))
            after = pulled[0] if pulled else after  # the proxy's pull after the worker's
        return [[outs[t][i] for i in range(len(leaves))] for t in ("worker", "proxy")]

    return step


@pytest.mark.parametrize("leading_bytes", [0, 1000, 1 << 30])
def test_one_device_runs_a_whole_step_through_xla(device, leading_bytes):
    rng = np.random.default_rng()
    leaves = [
        rng.standard_normal((33, 7)).astype(np.float32),
        rng.standard_normal((5,)).astype(ml_dtypes.bfloat16),
        rng.standard_normal((4099,)).astype(np.float32),
        rng.standard_normal((300,)).astype(np.float16),
    ]
    plan = coarse.plan(leaves, 1, coarse.Config(leading_bytes=leading_bytes, shard_bytes=4096))
    with jax.default_device(device):
        out = jax.device_get(jax.jit(_step(plan, device))(*jax.device_put(leaves, device)))
    for tier_out in out:  # the worker's results, then the proxy's
        for got, want in zip(tier_out, leaves, strict=True):
            np.testing.assert_array_equal(np.asarray(got), want)
    assert _live_sessions(device) == 0
