"""The sync calls' typed attributes: Python writes the groups C++ binds (ffi/xla/call_attrs.h),
and XLA itself refuses a call whose attributes differ in name or type."""

from __future__ import annotations

import itertools
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coarse_jax as coarse
from coarse_jax._ffi import calls, extension
from coarse_jax._ffi.primitive import custom_call

ROOT = pathlib.Path(__file__).resolve().parent.parent
assert extension.cpu_module() is not None  # registers the CPU targets
_SITES = itertools.count(1 << 28)


def _struct_members() -> dict[str, list[str]]:
    """Each struct of ffi/xla/call_attrs.h and its members' names, as XLA decodes them."""
    text = (ROOT / "ffi" / "xla" / "call_attrs.h").read_text()
    out = {}
    pattern = r"XLA_FFI_REGISTER_STRUCT_ATTR_DECODING\(\s*::coarse::(\w+),(.*?)\);"
    for m in re.finditer(pattern, text, re.S):
        out[m.group(1)] = re.findall(r'StructMember<.*?>\("(\w+)"\)', m.group(2))
    return out


def _plan():
    leaves = [np.ones((40,), np.float32)]
    plan = coarse.diagnostics.plan(leaves, 1, coarse.Config(shard_bytes=4096))
    return plan, leaves


def _site(plan, **changes):
    return calls.CallSite(plan.ffi_attrs(), next(_SITES), np.array([0, 0]), axes=(), **changes)


def test_python_writes_the_members_cpp_binds():
    members = _struct_members()
    assert set(members) == {"TopologyAttrs", "PlanAttrs", "OptimizerAttrs", "CallAttrs"}
    topo = coarse.Topology.preset("pcie4", 2)
    plan = coarse.diagnostics.plan([np.ones((40,), np.float32)], 2, coarse.Config(topology=topo))
    opt = {"opt_store": np.int64(7), "opt_name": "s", "opt_leaf_flags": np.ones(1, np.int64)}
    opt |= {"opt_snapshot_every": np.int64(0), **coarse.optim.adam(1e-3).ffi_attrs()}
    for site_attrs in ({}, opt):
        call = calls.CallSite(plan.ffi_attrs(), 1, np.arange(4), site_attrs=site_attrs)
        group = calls._call_attrs(call, last=True)
        assert sorted(group) == sorted(members["CallAttrs"])
        assert sorted(group["plan"]) == sorted(members["PlanAttrs"])
        assert sorted(group["plan"]["topology"]) == sorted(members["TopologyAttrs"])
        assert sorted(group["optimizer"]) == sorted(members["OptimizerAttrs"])
    assert group["plan"]["topology"]["wp_s_per_byte"].shape == (4,)  # 2 workers x 2 proxies


def test_no_optimizer_is_store_minus_one_and_no_topology_empty_tables():
    plan, _ = _plan()
    group = calls._call_attrs(_site(plan), last=False)
    assert group["optimizer"]["store"] == -1
    assert all(v.size == 0 for k, v in group["plan"]["topology"].items() if k.endswith("_s"))
    assert group["last"].dtype == np.bool_ and group["plan"]["mean"].dtype == np.bool_


def test_an_attribute_the_plan_has_no_place_for_is_refused():
    plan, _ = _plan()
    attrs = {**plan.ffi_attrs(), "pieces": np.int64(3)}
    with pytest.raises(ValueError, match=r"plan attributes \['pieces'\] have no place"):
        calls._call_attrs(calls.CallSite(attrs, 1, np.array([0, 0])), last=False)


def _push(plan, leaves, **override):
    """coarse_push on one CPU device, its attributes as calls.push writes them but `override`."""
    site = _site(plan)
    attrs = {
        "call": calls._call_attrs(site, last=False),
        "first_leaf": np.int64(0),
        "first_piece": np.int64(0),
        "num_pieces": np.int64(1),
        "passthrough": np.bool_(False),
    }
    attrs.update(override)
    attrs = {k: v for k, v in attrs.items() if v is not None}

    def f(x):
        me, tok = jnp.array([0, 0], jnp.int32), jnp.zeros((), jnp.float32)
        (out,) = custom_call("coarse_push", [jax.ShapeDtypeStruct((), jnp.float32)], {1: 0})(
            me, tok, x, **attrs
        )
        return out

    with jax.default_device(jax.devices("cpu")[0]):
        return jax.block_until_ready(jax.jit(f)(*leaves))


@pytest.mark.parametrize(
    "override",
    [
        {"passthrough": np.int64(0)},  # int64 where C++ binds bool
        {"first_leaf": np.int32(0)},  # int32 where C++ binds int64
        {"num_pieces": None},  # missing
        {"extra": np.int64(1)},  # not bound
    ],
    ids=["bool-as-int64", "int64-as-int32", "missing", "extra"],
)
def test_xla_refuses_an_attribute_of_another_name_or_type(override):
    plan, leaves = _plan()
    refused = r"Failed to decode all FFI handler|Wrong number of attributes"
    with pytest.raises(Exception, match=refused):
        _push(plan, leaves, **override)


def test_a_mistyped_member_of_a_group_is_refused():
    plan, leaves = _plan()
    group = calls._call_attrs(_site(plan), last=False)
    group["plan"] = {**group["plan"], "mean": np.int64(1)}  # bool in PlanAttrs
    with pytest.raises(Exception, match=r"Failed to decode all FFI handler"):
        _push(plan, leaves, call=group)
