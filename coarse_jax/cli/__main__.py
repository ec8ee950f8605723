"""``python -m coarse_jax.cli``: the profiler's command line (`coarse_jax.cli.profiler`)."""

from coarse_jax.cli.profiler import main

main()
