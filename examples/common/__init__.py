"""Shared code of the coarse_jax examples, one job a module.

The comparison examples (demo, cnn, resnet18, bert): `cli` (flags, exit
status), `config` (their common fields), `data` (batches made or loaded, then
placed), `classifier` (loss and accuracy of the classifiers), `steps` (the
coarse and pmean train steps), `timing` (the timed loop, the sync timed
alone), `clock` (timing a call, a median, interleaved runs: the benchmarks'
too), `report` (printed lines, ``metrics.jsonl``, ``loss.png``) and `compare`
(`compare.run_comparison`, which runs them). Flax's MNIST examples: `mnist`
(data) and `mnist_cli` (flags).

The examples are scripts, not an installed package: each ``examples/<name>/main.py``
puts its parent directory (``examples/``) on ``sys.path`` before importing
``common``, and each ``train.py`` does the same so it can also be imported on
its own (e.g. from a notebook with ``examples/<name>`` on the path).
"""
