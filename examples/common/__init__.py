"""Shared code of the coarse_jax examples (train steps, loop, metrics, plot, CLI).

The examples are scripts, not an installed package: each ``examples/<name>/main.py``
puts its parent directory (``examples/``) on ``sys.path`` before importing
``common``, and each ``train.py`` does the same so it can also be imported on
its own (e.g. from a notebook with ``examples/<name>`` on the path).
"""
