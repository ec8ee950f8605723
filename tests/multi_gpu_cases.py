"""The multi-device layouts of issue 65, the devices a case runs on, and its oracles.

A `Layout` is COARSE's own arrangement of p workers and q proxies over n devices
(the proxies on devices of their own, or in host memory). Each runs on two
platforms with the same device counts:

* ``"gpu"``: n GPUs. Needs ``COARSE_TEST_GPU=1`` (tools/gpu_check.sh sets it;
  tests/conftest.py otherwise limits jax to the CPU) and n GPUs visible to jax;
  it skips saying how many it needs and how many there are.
* ``"cpu"``: n CPU devices on the stream-semantics backend
  (``COARSE_JAX_BACKEND=streams``, `make test-streams`): each device its own
  memory and one in-order stream, events between them, so a copy between two
  devices is a copy, as between two GPUs. Under the default CPU backend (one
  address space, an inline stream) it skips.

The oracles share no code with coarse_jax: ``jax.value_and_grad`` per worker
averaged in float64 numpy, and ``lax.pmean`` / ``lax.psum`` (+ optax) under
``shard_map`` over the same worker devices (NCCL on GPUs). The benchmark
(benchmarks/test_multi_gpu.py) imports the same layouts.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np
import optax
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import coarse_jax as coarse
from coarse_jax.testing import active_backend

PLATFORMS = ("gpu", "cpu")


@dataclasses.dataclass(frozen=True)
class Layout:
    """p workers and q proxies on ``devices`` devices (host proxies take none)."""

    name: str
    devices: int
    workers: int
    proxies: int
    on: str  # "devices" or "host"

    def mesh(self, pool: list[jax.Device]) -> Mesh:
        """`coarse.make_mesh` of this layout on ``pool`` (the workers, then the proxies)."""
        return coarse.make_mesh(
            workers=self.workers,
            proxies=self.proxies,
            proxies_on=self.on,
            devices=pool[: self.devices],
        )

    @property
    def id(self) -> str:
        return f"{self.devices}dev-{self.name}"


# Issue 65's list: 2 devices, then 4 (and 2:1 on 3), then 8.
LAYOUTS = (
    Layout("1w-its-proxy-on-the-other", 2, 1, 1, "devices"),
    Layout("2w-host-proxies", 2, 2, 2, "host"),
    Layout("2w-2p-ring", 4, 2, 2, "devices"),
    Layout("4w-host-proxies", 4, 4, 4, "host"),
    Layout("2w-share-1p", 3, 2, 1, "devices"),
    Layout("4w-4p", 8, 4, 4, "devices"),
    Layout("6w-2p", 8, 6, 2, "devices"),
    Layout("8w-host-proxies", 8, 8, 8, "host"),
)


def cases() -> list:
    """``pytest.param(platform, layout)`` for every platform and layout, by readable id."""
    return [
        pytest.param(platform, layout, id=f"{platform}-{layout.id}")
        for platform in PLATFORMS
        for layout in LAYOUTS
    ]


def visible_gpus() -> list[jax.Device]:
    """The GPUs jax sees (none when it is limited to the CPU)."""
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


def devices_or_skip(platform: str, n: int) -> list[jax.Device]:
    """``n`` devices of ``platform`` ("gpu" or "cpu"); skips, with the reason, when the
    host has fewer or the platform's backend is not the one these cases need."""
    if platform == "gpu":
        if os.environ.get("COARSE_TEST_GPU") != "1":
            pytest.skip(f"needs {n} GPUs and COARSE_TEST_GPU=1 (tools/gpu_check.sh sets it)")
        gpus = visible_gpus()
        if len(gpus) < n:
            pytest.skip(f"needs {n} GPUs, jax sees {len(gpus)}")
        support = coarse.has_cuda_support()
        if not support:
            pytest.fail(f"{len(gpus)} GPUs are visible but coarse_jax cannot use them: {support}")
        return gpus[:n]
    if platform != "cpu":
        raise ValueError(f"platform must be 'gpu' or 'cpu', got {platform!r}")
    if active_backend("cpu") != "streams":
        pytest.skip(
            "the CPU cases run on the stream-semantics backend (each device its own memory): "
            "COARSE_JAX_BACKEND=streams, as `make test-streams` sets"
        )
    cpus = jax.devices("cpu")
    if len(cpus) < n:
        pytest.skip(f"needs {n} CPU devices, jax has {len(cpus)} (XLA_FLAGS sets 8)")
    return cpus[:n]


def flat_mesh(devices: list[jax.Device]) -> Mesh:
    """A ("data",) mesh of the workers' devices, for the oracles."""
    return Mesh(np.array(devices, dtype=object), ("data",))


def pmean_value_and_grad(devices: list[jax.Device], loss_fn):
    """``jit(shard_map(value_and_grad + lax.pmean))`` over ``devices``: ``(params, batch)``
    -> ``(loss, grads)``, the batch split over them."""

    @jax.jit
    @jax.shard_map(mesh=flat_mesh(devices), in_specs=(P(), P("data")), out_specs=P())
    def step(params, batch):
        varying = jax.lax.pcast(params, "data", to="varying")
        return jax.lax.pmean(jax.value_and_grad(loss_fn)(varying, batch), "data")

    return step


def psum_over(devices: list[jax.Device]):
    """``jit(shard_map(lax.psum))`` over ``devices``, its input split over them."""
    return jax.jit(
        jax.shard_map(
            lambda x: jax.lax.psum(x, "data"),
            mesh=flat_mesh(devices),
            in_specs=P("data"),
            out_specs=P(),
        )
    )


def pmean_optax_step(devices: list[jax.Device], tx: optax.GradientTransformation, loss_fn):
    """The oracle train step over ``devices``: ``value_and_grad`` + ``lax.pmean`` + ``tx``,
    ``(params, opt_state, batch)`` -> ``(params, opt_state, loss)``, not jitted."""

    @jax.shard_map(mesh=flat_mesh(devices), in_specs=(P(), P(), P("data")), out_specs=P())
    def step(params, opt_state, batch):
        # Varying params: otherwise their gradients come back already summed.
        loss, grads = jax.value_and_grad(loss_fn)(
            jax.lax.pcast(params, "data", to="varying"), batch
        )
        loss, grads = jax.lax.pmean((loss, grads), "data")
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def per_worker_float64(loss_fn, params, batch, devices: list[jax.Device]):
    """Each worker's ``value_and_grad`` of its slice on its own device, averaged in
    float64 numpy: ``(loss, grads)``."""
    p = len(devices)
    n = jax.tree.leaves(batch)[0].shape[0] // p
    vg = jax.jit(jax.value_and_grad(loss_fn))
    results = []
    for i, device in enumerate(devices):
        part = jax.tree.map(lambda x, lo=i * n: np.asarray(x)[lo : lo + n], batch)
        results.append(jax.device_get(vg(*jax.device_put((params, part), device))))
    loss = float(np.mean([np.float64(r[0]) for r in results]))
    grads = jax.tree.map(
        lambda *g: np.mean([np.asarray(x, np.float64) for x in g], axis=0),
        *[r[1] for r in results],
    )
    return loss, grads
