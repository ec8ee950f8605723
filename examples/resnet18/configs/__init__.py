"""Configurations for the resnet18 example."""
