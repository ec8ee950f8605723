"""``python -m coarse_jax.profiling``: the profiler's command line.

It lives in `coarse_jax.bench.cli`: besides profiling it times the sync
schemes through `coarse.sync`, a layer above this package (.importlinter
declares this one upward import).
"""

from coarse_jax.bench.cli import main

main()
