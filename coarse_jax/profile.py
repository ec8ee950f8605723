"""``python -m coarse_jax.profile``: the profiler's command line (see `coarse_jax.profile_cli`).

Only an entry point: `coarse.profile` the function lives in `coarse_jax.profiler`,
so that running this module does not re-import one the package already loaded.
"""

from coarse_jax.profile_cli import main

if __name__ == "__main__":
    main()
