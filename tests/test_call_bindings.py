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
attributes, results) and every phase of the protocol through XLA, called
through the same wrappers (`coarse_jax._ffi`) a `coarse.sync` step uses. With
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
from coarse_jax import _ffi

_SITES = itertools.count(1 << 30)  # a fresh call site per program
_ELSEWHERE = 1 << 20  # an ordinal no GPU has


@pytest.fixture(params=["cpu", "gpu"])
def device(request):
    return jax.devices("cpu")[0] if request.param == "cpu" else gpu_or_skip()[0]


def _live_sessions(device):
    if device.platform == "cpu":
        return _ffi.live_sessions()
    return gpu_or_skip()[1].live_sessions()


def _step(plan, device, in_place=False, moved=False):
    """One p = 1 step as one program: worker 0 and proxy 0 on `device`, through the wrappers.

    ``in_place``: the sync's push_in_place attribute (the proxies read the
    pushes in place where the platform allows). ``moved``: the program takes
    the leaves twice and hands the pull the second copy, as if XLA had moved
    the pushed buffers between push and pull.
    """
    site = next(_SITES)
    ordinal = device.local_hardware_id if device.local_hardware_id is not None else device.id

    # Per tier: the (tier, data) operand and the call site (its ordinals
    # attribute); axes=(): the program runs outside shard_map.
    def site_of(ordinals):
        return _ffi.CallSite(
            plan.ffi_attrs(), site, np.array(ordinals), axes=(), push_in_place=in_place
        )

    tiers = {
        "worker": (np.array([0, 0], np.int32), site_of([ordinal, ordinal])),
        "proxy": (np.array([1, 0], np.int32), site_of([_ELSEWHERE, ordinal])),
    }

    def step(*leaves):
        if moved:
            leaves, copies = leaves[: len(leaves) // 2], leaves[len(leaves) // 2 :]
        proxy_leaves = [leaves[i] for i in plan.proxy_leaves]
        pulled_leaves = [copies[i] for i in plan.proxy_leaves] if moved else proxy_leaves
        lead = [leaves[i] for i in plan.leading_leaves]
        me, call = tiers["worker"]
        tok = jnp.zeros((), jnp.float32)
        for b in plan.buckets:
            bucket = proxy_leaves[b.first_leaf : b.first_leaf + b.num_leaves]
            _, tok = _ffi.push(call, me, tok, bucket, b, passthrough=False)
        # Every device runs every call; the worker's proxy ring (a no-op) comes
        # first, so a worker call always opens the session (its ordinals place
        # the storage).
        ring = tok
        for tier in ("worker", "proxy"):
            me, call = tiers[tier]
            ring = _ffi.proxy_ring(call, me, [ring], last=False)
        outs = {}
        for tier in ("worker", "proxy"):
            me, call = tiers[tier]
            reduced, ring = _ffi.worker_ring(call, me, ring, lead, last=False, alias=False)
            outs[tier] = dict(zip(plan.leading_leaves, reduced, strict=True))
        after = ring
        for tier in ("worker", "proxy"):
            me, call = tiers[tier]
            pulled = _ffi.pull(call, me, after, pulled_leaves, alias=False)
            outs[tier].update(zip(plan.proxy_leaves, pulled, strict=True))
            after = pulled[0] if pulled else after  # the proxy's pull after the worker's
        return [[outs[t][i] for i in range(len(leaves))] for t in ("worker", "proxy")]

    return step


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("leading_bytes", [0, 1000, 1 << 30])
def test_one_device_runs_a_whole_step_through_xla(device, leading_bytes, in_place):
    rng = np.random.default_rng()
    leaves = [
        rng.standard_normal((33, 7)).astype(np.float32),
        rng.standard_normal((5,)).astype(ml_dtypes.bfloat16),
        rng.standard_normal((4099,)).astype(np.float32),
        rng.standard_normal((300,)).astype(np.float16),
    ]
    plan = coarse.plan(leaves, 1, coarse.Config(leading_bytes=leading_bytes, shard_bytes=4096))
    with jax.default_device(device):
        step = jax.jit(_step(plan, device, in_place))
        out = jax.device_get(step(*jax.device_put(leaves, device)))
    for tier_out in out:  # the worker's results, then the proxy's
        for got, want in zip(tier_out, leaves, strict=True):
            np.testing.assert_array_equal(np.asarray(got), want)
    assert _live_sessions(device) == 0


def test_a_pull_refuses_pushed_leaves_that_moved():
    """With the proxies reading the pushes in place (CPU), a worker's pull checks that it
    holds the very buffers it pushed: if XLA had moved them, the proxies may have read
    stale values, so the step fails, naming the leaf, instead of pulling them."""
    device = jax.devices("cpu")[0]
    leaves = [np.arange(5000, dtype=np.float32), np.ones((3, 4), np.float32)]
    plan = coarse.plan(leaves, 1, coarse.Config(shard_bytes=4096))
    step = jax.jit(_step(plan, device, in_place=True, moved=True))
    with jax.default_device(device):
        args = jax.device_put(leaves + [x.copy() for x in leaves], device)
        with pytest.raises(Exception, match=r"is not in the buffer it was pushed from"):
            jax.block_until_ready(step(*args))
