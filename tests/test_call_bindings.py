"""The sync calls' XLA bindings on one device, CPU and (when present) GPU.

A coarse mesh needs 2p devices, so on a single GPU no `coarse.sync` step can
run. What one device can run is a worker's own calls of a p = 1 plan: its
push (which lands in proxy 0's storage and returns the leaves and a token)
and its worker ring (p = 1: the mean is the value itself). That exercises
each platform's binding layer inside a jitted program: the context it
decodes (run id; on CUDA the stream and device ordinal, which names the
caller through the "ordinals" attribute), the plan attributes, the device
backend's gather/scatter, and the results XLA gets back. The proxy never
runs, so each session stays open, which is harmless here.
"""

import itertools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from helpers import gpu_or_skip

import coarse_jax as coarse

_SITES = itertools.count(1 << 30)  # a fresh call site per program: never a shared session


@pytest.fixture(params=["cpu", "gpu"])
def device(request):
    return jax.devices("cpu")[0] if request.param == "cpu" else gpu_or_skip()[0]


def _tree(rng):
    return {
        "a": rng.standard_normal((33, 7)).astype(np.float32),
        "b": rng.standard_normal((5,)).astype(ml_dtypes.bfloat16),
        "c": rng.standard_normal((4099,)).astype(np.float32),
    }


def _attrs(plan, device, **extra):
    ordinal = device.local_hardware_id if device.local_hardware_id is not None else device.id
    return {
        **plan.ffi_attrs(),
        "site": np.int64(next(_SITES)),
        "ordinals": np.array([ordinal, ordinal], np.int64),  # worker 0, proxy 0
        **extra,
    }


def _run(device, fn, *args):
    with jax.default_device(device):
        return jax.device_get(jax.jit(fn)(*jax.device_put(args, device)))


def test_worker_ring_of_one_worker_returns_the_values(device):
    tree = _tree(np.random.default_rng())
    plan = coarse.plan(tree, 1, coarse.Config(leading_bytes=1 << 30))
    leaves = jax.tree.leaves(tree)
    ordered = [leaves[i] for i in plan.leading_leaves]
    assert len(ordered) == len(leaves)
    attrs = _attrs(plan, device, last=np.int64(1))

    def call(who, token, *xs):
        results = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs]
        results.append(jax.ShapeDtypeStruct(who.shape, who.dtype))
        return jax.ffi.ffi_call("coarse_worker_ring", results, has_side_effect=True,
                                vmap_method="broadcast_all")(who, token, *xs, **attrs)

    out = _run(device, call, np.zeros(2, np.int32), np.zeros(2, np.int32), *ordered)
    for got, want in zip(out[:-1], ordered):
        np.testing.assert_array_equal(np.asarray(got), want)  # mean of one worker, f32 in between
    np.testing.assert_array_equal(np.asarray(out[-1]), 0)


def test_push_passes_the_leaves_through(device):
    tree = _tree(np.random.default_rng())
    plan = coarse.plan(tree, 1, coarse.Config(leading_bytes=0, shard_bytes=4096))
    leaves = jax.tree.leaves(tree)
    bucket = plan.buckets[0]
    ids = plan.proxy_leaves[bucket.first_leaf:bucket.first_leaf + bucket.num_leaves]
    xs = [leaves[i] for i in ids]
    attrs = _attrs(plan, device, first_leaf=np.int64(bucket.first_leaf),
                   first_piece=np.int64(bucket.first_piece),
                   num_pieces=np.int64(bucket.num_pieces), passthrough=np.int64(1),
                   last=np.int64(0))

    def call(who, token, *xs):
        results = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs]
        results.append(jax.ShapeDtypeStruct((), jnp.float32))
        return jax.ffi.ffi_call("coarse_push", results, has_side_effect=True,
                                vmap_method="broadcast_all")(who, token, *xs, **attrs)

    out = _run(device, call, np.zeros(2, np.int32), np.float32(0), *xs)
    for got, want in zip(out[:-1], xs):
        np.testing.assert_array_equal(np.asarray(got), want)
    assert float(out[-1]) == 0.0
