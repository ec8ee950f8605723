"""coarse_jax: COARSE gradient synchronization for JAX.

A second tier of devices, the proxies, reduces gradients that the workers push
from inside the backward pass; the leading layers are reduced among the
workers. With `coarse.value_and_update` the proxies also hold the master
parameters and the optimizer state and run the optimizer. The guides and the
API reference are in docs/ (`make docs` builds them).

Example:
  >>> import coarse_jax as coarse
  >>> mesh = coarse.make_mesh(workers=4)          # 4 workers + 4 proxies on 8 devices
  >>> def loss_fn(params, batch):
  ...     return jnp.mean((batch @ params["w"]) ** 2)
  >>> @coarse.sync(mesh)
  ... def train_step(params, batch):
  ...     loss, grads = coarse.value_and_grad(loss_fn)(params, batch)
  ...     return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss
  >>> params, loss = train_step({"w": jnp.ones((3,))}, jnp.ones((8, 3)))
  >>> float(loss)
  9.0
"""

from coarse_jax import kernels, model, optim, reference
from coarse_jax._ffi import (
    CudaSupport,
    has_cuda_support,
    memory_stats,
    set_memory_limits,
    virtual_sync_seconds,
)
from coarse_jax._version import __version__ as __version__
from coarse_jax.api import (
    MemoryReport,
    SyncedStep,
    TierMemory,
    all_reduce,
    memory_report,
    on_workers,
    sync,
    value_and_grad,
    value_and_update,
)
from coarse_jax.config import Config
from coarse_jax.mesh import make_mesh
from coarse_jax.optim import ProxyOptimizer
from coarse_jax.plan import Plan, plan
from coarse_jax.profiling import Profile, Topology, measure_step_times, profile

__all__ = [
    "Config",
    "CudaSupport",
    "MemoryReport",
    "Plan",
    "Profile",
    "ProxyOptimizer",
    "SyncedStep",
    "TierMemory",
    "Topology",
    "all_reduce",
    "has_cuda_support",
    "kernels",
    "make_mesh",
    "measure_step_times",
    "memory_report",
    "memory_stats",
    "model",
    "on_workers",
    "optim",
    "plan",
    "profile",
    "reference",
    "set_memory_limits",
    "sync",
    "value_and_grad",
    "value_and_update",
    "virtual_sync_seconds",
]
