"""What the benchmarks and the profiler's CLI measure: gradient-tree shapes and sync schemes.

* `shapes.py`: ResNet-50, BERT-base and ViT-B/16 gradient trees (shapes only).
* `schemes.py`: DENSE, AllReduce and COARSE as Configs, and timing one sync.
* `placement.py`: COARSE with device proxies beside COARSE with host proxies.
* `cli.py`: ``python -m coarse_jax.profiling``: profile, plan, compare the schemes.
"""
