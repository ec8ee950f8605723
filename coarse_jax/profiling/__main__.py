"""``python -m coarse_jax.profiling``: the profiler's command line (`coarse_jax.profiling.cli`)."""

from coarse_jax.profiling.cli import main

main()
