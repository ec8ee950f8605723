"""Configurations for the cnn example."""
