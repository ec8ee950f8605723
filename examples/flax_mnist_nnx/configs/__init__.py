"""Configurations for the flax_mnist_nnx example."""
