"""The four sync calls through XLA on one device, CPU and (when present) GPU.

One device can run a whole p = 1 step: worker 0's calls in one jitted
program (pushes, proxy ring, worker ring, pull, chained by their tokens in
the order a step runs them), while proxy 0 is the runtime's service
(ffi/runtime/service.h), started by the worker's first call, its storage on
the same device (the "ordinals" attribute lists this device for both tiers,
as `coarse_jax.testing.shared_device_mesh` does). The caller is named as
the platform names it: on CPU by the (tier, data) operand, on CUDA by the
device ordinal looked up in "ordinals" (workers first, so the shared
ordinal names worker 0). That exercises each platform's binding layer (run
id, stream, ordinal, attributes, results) and every phase of the protocol
through XLA, called through the same wrappers (`coarse_jax._ffi`) a
`coarse.sync` step uses. With p = 1 the mean is the value itself, so every
result must equal its input.
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

    # axes=(): the program runs outside shard_map.
    me = np.array([0, 0], np.int32)
    call = _ffi.CallSite(
        plan.ffi_attrs(), site, np.array([ordinal, ordinal]), axes=(), push_in_place=in_place
    )

    def step(*leaves):
        if moved:
            leaves, copies = leaves[: len(leaves) // 2], leaves[len(leaves) // 2 :]
        proxy_leaves = [leaves[i] for i in plan.proxy_leaves]
        pulled_leaves = [copies[i] for i in plan.proxy_leaves] if moved else proxy_leaves
        lead = [leaves[i] for i in plan.leading_leaves]
        tok = jnp.zeros((), jnp.float32)
        for b in plan.buckets:
            bucket = proxy_leaves[b.first_leaf : b.first_leaf + b.num_leaves]
            _, tok = _ffi.push(call, me, tok, bucket, b, passthrough=False)
        ring = _ffi.proxy_ring(call, me, [tok], last=False)
        last = not plan.proxy_leaves  # else the pull ends the session
        reduced, ring = _ffi.worker_ring(call, me, ring, lead, last=last, alias=False)
        out = dict(zip(plan.leading_leaves, reduced, strict=True))
        pulled = _ffi.pull(call, me, ring, pulled_leaves, alias=False)
        out.update(zip(plan.proxy_leaves, pulled, strict=True))
        return [out[i] for i in range(len(leaves))]

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
    plan = coarse.diagnostics.plan(
        leaves, 1, coarse.Config(leading_bytes=leading_bytes, shard_bytes=4096)
    )
    with jax.default_device(device):
        step = jax.jit(_step(plan, device, in_place))
        out = jax.device_get(step(*jax.device_put(leaves, device)))
    for got, want in zip(out, leaves, strict=True):
        np.testing.assert_array_equal(np.asarray(got), want)
    assert _live_sessions(device) == 0


def test_a_pull_refuses_pushed_leaves_that_moved():
    """With the proxies reading the pushes in place (CPU), a worker's pull checks that it
    holds the very buffers it pushed: if XLA had moved them, the proxies may have read
    stale values, so the step fails, naming the leaf, instead of pulling them."""
    device = jax.devices("cpu")[0]
    leaves = [np.arange(5000, dtype=np.float32), np.ones((3, 4), np.float32)]
    plan = coarse.diagnostics.plan(leaves, 1, coarse.Config(shard_bytes=4096))
    step = jax.jit(_step(plan, device, in_place=True, moved=True))
    with jax.default_device(device):
        args = jax.device_put(leaves + [x.copy() for x in leaves], device)
        with pytest.raises(Exception, match=r"is not in the buffer it was pushed from"):
            jax.block_until_ready(step(*args))


def test_a_call_on_a_proxy_is_refused(device):
    """The proxies run no XLA program: a hand-made program that runs a coarse call as a
    proxy gets an error saying where the proxies' work runs, not a second proxy 0. The
    caller is named as its platform names it (module docstring): on CPU by the operand
    [1, 0], on CUDA by this GPU's ordinal in the proxies' place of "ordinals"."""
    leaves = [np.ones((64,), np.float32)]
    plan = coarse.diagnostics.plan(leaves, 1, coarse.Config())
    ordinal = device.local_hardware_id if device.local_hardware_id is not None else device.id
    ordinals = np.array([0, 0]) if device.platform == "cpu" else np.array([ordinal + 1, ordinal])
    call = _ffi.CallSite(plan.ffi_attrs(), next(_SITES), ordinals, axes=())

    def step(x):
        _, tok = _ffi.push(
            call, np.array([1, 0], np.int32), jnp.zeros(()), [x], plan.buckets[0], False
        )
        return tok

    with jax.default_device(device):
        x = jax.device_put(leaves[0], device)
        with pytest.raises(Exception, match=r"ran on proxy 0 .*but the proxies run no XLA program"):
            jax.block_until_ready(jax.jit(step)(x))
    assert _live_sessions(device) == 0
