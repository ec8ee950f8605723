"""Configurations for the coarse_jax demo."""
