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

# The training core, and its modules: `coarse.diagnostics` holds what looks at a
# step rather than runs it (plan, profile, memory, virtual clock), `coarse.optim`
# the proxies' optimizers, `coarse.perf_model` the paper's performance model
# (the design card's name, `coarse.model`, is the same module),
# `coarse.kernels` the reduction kernels, `coarse.reference` the pure-JAX oracle.
# `coarse_jax.mesh` has the proxies' record and the two-tier mesh on request.
from coarse_jax import diagnostics, kernels, optim, perf_model, reference
from coarse_jax._ffi import has_cuda_support
from coarse_jax._version import __version__ as __version__
from coarse_jax.api import (
    Snapshots,
    SyncedStep,
    all_reduce,
    sync,
    value_and_grad,
    value_and_update,
)
from coarse_jax.config import Config
from coarse_jax.emulation import EmulatedTopology
from coarse_jax.mesh import make_mesh

# The design card's names for the two above (docs/guides/design.md, the
# CHANGELOG's table of renames): the same objects.
model = perf_model
Topology = EmulatedTopology

__all__ = [
    "Config",
    "EmulatedTopology",
    "Snapshots",
    "SyncedStep",
    "all_reduce",
    "diagnostics",
    "has_cuda_support",
    "kernels",
    "make_mesh",
    "optim",
    "perf_model",
    "reference",
    "sync",
    "value_and_grad",
    "value_and_update",
]
