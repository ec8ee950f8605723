"""Configurations for the bert example."""
