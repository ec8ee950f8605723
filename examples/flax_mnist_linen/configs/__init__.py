"""Configurations for the flax_mnist_linen example."""
