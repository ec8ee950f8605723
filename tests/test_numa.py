"""NUMA placement of a host proxy's storage (ffi/runtime/numa.h).

The sysfs parser is run on fake trees (a PCI device on node 1, one the
kernel does not place (-1), one without the file, node directories beside
files that are not nodes), and the allocation on this machine: page-aligned,
zeroed, writable pages, with the reason they are not bound. The machine
these tests were written on has one NUMA node; on one with several the
exact expectations for "one node" are replaced by the mbind outcomes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from coarse_jax import _coarse_cpu as cpu

PAGE = os.sysconf("SC_PAGESIZE")


def _machine_nodes() -> int:
    root = Path("/sys/devices/system/node")
    if not root.is_dir():
        return 1
    nodes = [p for p in root.iterdir() if re.fullmatch(r"node\d+", p.name) and p.is_dir()]
    return max(1, len(nodes))


@pytest.mark.parametrize(
    "given, canonical",
    [
        ("0000:3B:00.0", "0000:3b:00.0"),  # cudaDeviceGetPCIBusId's spelling
        ("00000000:3B:00.0", "0000:3b:00.0"),  # nvidia-smi's 8-digit domain
        ("3b:00.0", "0000:3b:00.0"),  # no domain
        ("0001:af:1f.7", "0001:af:1f.7"),
        (" 0000:3b:00.0\n", "0000:3b:00.0"),
        ("10000:3b:00.0", ""),  # a domain that does not fit 4 digits
        ("0000:3b:00.8", ""),  # functions are 0..7
        ("0000:3g:00.0", ""),
        ("3b00.0", ""),
        ("", ""),
    ],
)
def test_canonical_pci_bus_id(given, canonical):
    assert cpu.canonical_pci_bus_id(given) == canonical


@pytest.fixture
def fake_sysfs(tmp_path: Path) -> Path:
    devices = tmp_path / "bus/pci/devices"
    for bus, content in [
        ("0000:3b:00.0", "1\n"),
        ("0000:af:00.0", "-1\n"),
        ("0000:60:00.0", "garbage\n"),
        ("0001:05:00.0", "3\n"),
    ]:
        (devices / bus).mkdir(parents=True)
        (devices / bus / "numa_node").write_text(content)
    (devices / "0000:5e:00.0").mkdir()  # no numa_node file
    node = tmp_path / "devices/system/node"
    (node / "node0").mkdir(parents=True)
    (node / "node1").mkdir()
    (node / "node2").write_text("")  # a file, not a node directory
    (node / "nodes").mkdir()  # not node<N>
    (node / "possible").write_text("0-1\n")
    (node / "has_cpu").write_text("0-1\n")
    return tmp_path


def test_numa_node_of_pci_bus(fake_sysfs):
    root = str(fake_sysfs)
    assert cpu.numa_node_of_pci_bus("0000:3B:00.0", root) == 1
    assert cpu.numa_node_of_pci_bus("00000000:3b:00.0", root) == 1
    assert cpu.numa_node_of_pci_bus("3b:00.0", root) == 1
    assert cpu.numa_node_of_pci_bus("0001:05:00.0", root) == 3
    assert cpu.numa_node_of_pci_bus("0000:05:00.0", root) == -1  # another domain's bus
    assert cpu.numa_node_of_pci_bus("0000:af:00.0", root) == -1  # the kernel says -1
    assert cpu.numa_node_of_pci_bus("0000:5e:00.0", root) == -1  # no numa_node file
    assert cpu.numa_node_of_pci_bus("0000:60:00.0", root) == -1  # not a number
    assert cpu.numa_node_of_pci_bus("0000:99:00.0", root) == -1  # no such device
    assert cpu.numa_node_of_pci_bus("not a bus id", root) == -1


def test_numa_node_count(fake_sysfs, tmp_path_factory):
    assert cpu.numa_node_count(str(fake_sysfs)) == 2
    (fake_sysfs / "devices/system/node/node3").mkdir()  # nodes need not be contiguous
    assert cpu.numa_node_count(str(fake_sysfs)) == 3
    one = tmp_path_factory.mktemp("one")
    (one / "devices/system/node/node0").mkdir(parents=True)
    assert cpu.numa_node_count(str(one)) == 1
    # A kernel without NUMA has no node directory: one node.
    assert cpu.numa_node_count(str(tmp_path_factory.mktemp("none"))) == 1


def test_numa_node_count_of_this_machine():
    assert cpu.numa_node_count() == _machine_nodes()


def _check_pages(r: dict, requested: int):
    assert r["allocated"]
    assert r["page_aligned"]
    assert r["zeroed"]
    assert r["writable"]
    assert r["bytes"] % PAGE == 0
    assert r["bytes"] >= requested


@pytest.mark.parametrize("nbytes", [0, 1, PAGE, 10 * PAGE + 3])
def test_allocate_without_node(nbytes):
    r = cpu.numa_allocate_check(nbytes, -1)
    _check_pages(r, nbytes)
    assert r["bytes"] == max(1, -(-nbytes // PAGE)) * PAGE
    assert r["node"] == -1
    assert not r["bound"]
    assert r["why_not_bound"] == "no node requested"
    assert r["describe"] == f"{r['bytes']} bytes, no node requested"


def test_allocate_on_node_0_of_this_machine():
    r = cpu.numa_allocate_check(3 * PAGE + 5, 0)
    _check_pages(r, 3 * PAGE + 5)
    assert r["bytes"] == 4 * PAGE
    assert r["node"] == 0
    if _machine_nodes() == 1:
        assert not r["bound"]
        assert r["why_not_bound"] == "one node"
        assert r["describe"] == f"{4 * PAGE} bytes, node 0 requested, not bound: one node"
    else:  # node 0 exists: bound, or mbind refused (a container)
        assert r["bound"] or r["why_not_bound"].startswith("mbind: ")


def test_allocate_as_on_two_nodes():
    # The mbind path on this machine: node 0 is online, so the binding is
    # applied unless the kernel refuses mbind (EPERM under a seccomp filter,
    # ENOSYS without NUMA); either way the pages work.
    r = cpu.numa_allocate_check(2 * PAGE, 0, node_count=2)
    _check_pages(r, 2 * PAGE)
    if r["bound"]:
        assert r["why_not_bound"] == ""
        assert r["describe"] == f"{2 * PAGE} bytes, node 0 requested, bound (preferred)"
    else:
        assert re.fullmatch(r"mbind: .+", r["why_not_bound"]), r


def test_allocate_on_a_node_that_is_not_there():
    # Node 1000 is within the mask but not online: mbind fails (EINVAL, or
    # EPERM first in a container), and the memory is kept unbound.
    r = cpu.numa_allocate_check(PAGE, 1000, node_count=2)
    _check_pages(r, PAGE)
    assert r["node"] == 1000
    assert not r["bound"]
    assert re.fullmatch(r"mbind: .+", r["why_not_bound"]), r
    # Beyond the mask: not tried.
    r = cpu.numa_allocate_check(PAGE, 5000, node_count=2)
    _check_pages(r, PAGE)
    assert not r["bound"]
    assert r["why_not_bound"] == "node out of range"
