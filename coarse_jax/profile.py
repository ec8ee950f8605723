"""``python -m coarse_jax.profile``: the profiler's command line, kept under its first name.

Only an entry point (the same as ``python -m coarse_jax.cli``). Importing
it is refused: importing it would run the command line (the profiler
itself is the function ``coarse.diagnostics.profile``).
"""

if __name__ != "__main__":
    raise ImportError(
        "coarse_jax.profile is the profiler's command line, not a module to import: use the "
        "function coarse.diagnostics.profile(mesh) or the package coarse_jax.profiling."
    )

from coarse_jax.cli.profiler import main

main()
