"""The profiler's command line, ``python -m coarse_jax.cli``: the top layer of the package.

It profiles a mesh, plans from the profile and compares the sync schemes
on a ResNet-50 gradient tree, so it imports from every layer below it,
`coarse.sync` included; nothing in coarse_jax imports it but the entry point
under its first name, ``python -m coarse_jax.profile`` (.importlinter).
It lives here rather than in `coarse_jax.profiling`, which is a layer below
`coarse_jax.api`: an entry point there would import upwards.

* `profiler.py`: the arguments and `main`.
* `schemes.py`: DENSE, AllReduce and COARSE as Configs, and timing one sync.
* `proxy_placement.py`: COARSE with device proxies beside COARSE with host proxies.
* `resnet50.py`: ResNet-50's gradient tree (shapes only).

The benchmarks and tests use these too; what only they use (more model
trees, the C++ self-tests and benchmarks) is not in the product:
benchmarks/model_shapes.py, and the lab extensions (`coarse_jax._lab`).
"""
