"""The jax internals coarse_jax uses, imported and checked in one place.

Every ``jax._src`` module the package reads is imported here (the loops'
module, which a jax may move, in `coarse_jax._jax_compat.loop_carry`); the
other modules of `coarse_jax._jax_compat` take them from here. If a future jax
removes or reshapes one, importing coarse_jax fails here with a message naming
the supported range, never with a bare ImportError from deep inside the package.
"""

from __future__ import annotations

import jax

# Keep in step with pyproject.toml's dependency on jax and jaxlib.
SUPPORTED_JAX = ">=0.10.2,<0.13"
TESTED_JAX = ("0.10.2", "0.12.0.1")


def _unsupported(what: str, err: BaseException | None = None) -> ImportError:
    found = f" ({type(err).__name__}: {err})" if err is not None else ""
    return ImportError(
        f"coarse_jax supports jax {SUPPORTED_JAX} (tested on {', '.join(TESTED_JAX)}); the "
        f"installed jax {jax.__version__} lacks {what}{found}. Fix: install a jax in that range, "
        f'e.g. pip install "jax{SUPPORTED_JAX}" "jaxlib{SUPPORTED_JAX}".'
    )


try:
    # config.bool_state, config.config_states: checked on 0.10.2, 0.12.0.1.
    from jax._src import config as _config

    # core: checked on 0.10.2, 0.11.2, 0.12.0.1.
    from jax._src import core as _core

    # dispatch.simple_impl: checked on 0.10.2, 0.11.2, 0.12.0.1.
    from jax._src import dispatch as _dispatch

    # distributed.global_state: checked on 0.10.2, 0.12.0.1.
    from jax._src import distributed as _distributed

    # source_info_util.summarize: checked on 0.10.2, 0.12.0.1.
    from jax._src import source_info_util as _source_info

    # ad.primitive_transposes, ad.Zero: checked on 0.10.2, 0.12.0.1.
    from jax._src.interpreters import ad as _ad

    # batching.fancy_primitive_batchers: checked on 0.10.2.
    from jax._src.interpreters import batching as _batching

    # partial_eval.dce_rules: checked on 0.10.2, 0.11.2, 0.12.0.1.
    from jax._src.interpreters import partial_eval as _pe

    # parallel.psum_invariant_p, all_gather_invariant_p: checked on 0.10.2, 0.12.0.1.
    from jax._src.lax import parallel as _parallel
except ImportError as _err:  # pragma: no cover - only on an unsupported jax
    raise _unsupported("a module coarse_jax needs", _err) from _err

for _module, _name in (
    (_config, "bool_state"),
    (_config, "config_states"),
    (_core, "shaped_abstractify"),
    (_core, "standard_vma_rule"),
    (_core, "get_cur_mesh_sharding"),
    (_core, "pvary_p"),
    (_ad, "primitive_transposes"),
    (_ad, "Zero"),
    (_parallel, "psum_invariant_p"),
    (_parallel, "all_gather_invariant_p"),
    (_dispatch, "simple_impl"),
    (_pe, "dce_rules"),
    (_pe, "_default_dce_rule"),
    (_distributed, "global_state"),
    (_source_info, "summarize"),
):
    if not hasattr(_module, _name):  # pragma: no cover - only on an unsupported jax
        raise _unsupported(f"{_module.__name__}.{_name}")

AbstractValue = _core.AbstractValue

# What the package's other modules take from here.
__all__ = [
    "SUPPORTED_JAX",
    "TESTED_JAX",
    "AbstractValue",
    "_ad",
    "_batching",
    "_config",
    "_core",
    "_dispatch",
    "_distributed",
    "_parallel",
    "_pe",
    "_source_info",
    "_unsupported",
]
