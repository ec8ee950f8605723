"""The top level is the training core, and no public name hides a module."""

from __future__ import annotations

import pkgutil
import types

import coarse_jax as coarse

# What a training script needs; everything that looks at a step rather than
# runs it is in coarse.diagnostics.
CORE = {
    "sync",
    "value_and_grad",
    "value_and_update",
    "all_reduce",
    "make_mesh",
    "Config",
    "SyncedStep",
    "Snapshots",
    "EmulatedTopology",
    "has_cuda_support",
}


def test_the_top_level_is_small_and_holds_the_core():
    assert len(coarse.__all__) <= 15, coarse.__all__
    assert set(coarse.__all__) >= CORE
    for name in coarse.__all__:
        assert hasattr(coarse, name), name
    assert "diagnostics" in coarse.__all__


def test_the_design_cards_names_are_the_renamed_objects():
    """``coarse.model`` and ``coarse.Topology`` (the design card's names) stay, as the
    very objects now named ``coarse.perf_model`` and ``coarse.EmulatedTopology``."""
    assert coarse.model is coarse.perf_model
    assert coarse.Topology is coarse.EmulatedTopology
    assert coarse.Topology.preset("v100", 2).workers == 2


def test_no_public_name_shadows_a_module():
    """``coarse.plan`` was a function hiding the package ``coarse_jax.plan``; now a public
    name either is the module of that name or names no module at all."""
    modules = {m.name for m in pkgutil.iter_modules(coarse.__path__)}
    for name in coarse.__all__:
        obj = getattr(coarse, name)
        if name in modules:
            assert isinstance(obj, types.ModuleType), f"coarse.{name} hides a module"
            assert obj.__name__ == f"coarse_jax.{name}"
    assert not hasattr(coarse, "plan") or isinstance(coarse.plan, types.ModuleType)
    assert not hasattr(coarse, "profile") or isinstance(coarse.profile, types.ModuleType)


def test_each_name_has_one_home():
    """A class or function is public in one place: ProxyOptimizer in coarse.optim only,
    the diagnostics in coarse.diagnostics only."""
    top = {id(getattr(coarse, n)) for n in coarse.__all__}
    for module in (coarse.optim, coarse.diagnostics):
        shared = [n for n in module.__all__ if id(getattr(module, n)) in top]
        assert not shared, f"{module.__name__} and coarse both export {shared}"


def test_has_cuda_support_is_a_truthful_bool_with_a_reason():
    support = coarse.has_cuda_support()
    assert isinstance(support, coarse.diagnostics.CudaSupport)
    assert bool(support) is support.available
    assert str(support) == support.reason and support.reason
