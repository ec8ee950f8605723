"""Every use of a jax internal (``jax._src``, a private rule table), in one package.

coarse_jax supports jax ``SUPPORTED_JAX`` (pyproject.toml says the same). CI
runs the suite on the oldest (0.10.2, Python 3.11) and the newest (Python
3.12) of that range. Each name below says what it does, why no public API
serves, and the versions it was checked on. Where a public API exists it is
used instead (the gather over hosts is ``lax.all_gather(..., to="invarying")``
since 0.10.2: jax 0.12 removed the private ``all_gather_invariant`` it used).

If a future jax removes or reshapes one of these, importing coarse_jax fails
here with a message naming the supported range, never with a bare
ImportError from deep inside the package.

The package's modules, each one job: `internals` imports and checks the
``jax._src`` modules (the one place that imports them, with the loops' module
in `loop_carry`); `primitives` (a custom primitive's typing, eager rule and
DCE rule); `introspection` (what only jax's internals tell); `mean_gradients`
(``jax.grad`` inside a coarse step differentiates the workers' mean loss);
`vmap_axes` and `loop_carry` (two fixes installed at import). No module
outside this package imports ``jax._src`` (tests/test_jax_internals.py checks it).
"""

from coarse_jax._jax_compat import loop_carry as _loop_carry  # noqa: F401  installs its fix
from coarse_jax._jax_compat import vmap_axes as _vmap_axes  # noqa: F401  installs its fix
from coarse_jax._jax_compat.internals import SUPPORTED_JAX, TESTED_JAX, AbstractValue
from coarse_jax._jax_compat.introspection import (
    distributed_client,
    jit_cache_size,
    unbound_axis_name,
    user_location,
)
from coarse_jax._jax_compat.mean_gradients import in_coarse_trace, mean_gradients
from coarse_jax._jax_compat.primitives import (
    current_mesh_sharding,
    never_dead,
    shaped_abstractify,
    simple_impl,
    standard_vma_rule,
)

__all__ = [
    "SUPPORTED_JAX",
    "TESTED_JAX",
    "AbstractValue",
    "current_mesh_sharding",
    "distributed_client",
    "in_coarse_trace",
    "jit_cache_size",
    "mean_gradients",
    "never_dead",
    "shaped_abstractify",
    "simple_impl",
    "standard_vma_rule",
    "unbound_axis_name",
    "user_location",
]
