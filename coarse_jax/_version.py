"""The package's version, one place for coarse_jax and the check of its CUDA wheel's."""

__version__ = "0.1.0"
