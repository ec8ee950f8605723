"""Product code reads only the environment variables the docs list for users.

The list is the table in docs/guides/getting_started.md ("Environment
variables"); the reads are found in the sources, not asked of the code: every
``os.environ.get(NAME)``, ``os.environ[NAME]``, ``os.getenv(NAME)`` (NAME a
literal or a module-level string constant) in coarse_jax/, and every
``getenv("NAME")`` in the C++ and CUDA sources. A test switch belongs in
`coarse_jax.testing`, never here.
"""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "guides" / "getting_started.md"


def _documented() -> set[str]:
    text = GUIDE.read_text()
    section = text[text.index("## Environment variables") :]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`(COARSE_JAX_\w+)`", row.split("|")[1])}


def _python_reads(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }

    def name_of(arg: ast.expr) -> str | None:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value
        if isinstance(arg, ast.Name):
            return constants.get(arg.id)
        return None

    def is_environ(node: ast.expr) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    reads = set()
    for node in ast.walk(tree):
        arg = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if node.func.attr == "getenv" or (
                node.func.attr in ("get", "pop", "setdefault") and is_environ(node.func.value)
            ):
                arg = node.args[0]
        elif isinstance(node, ast.Subscript) and is_environ(node.value):
            arg = node.slice
        name = None if arg is None else name_of(arg)
        if name is not None:
            reads.add(name)
    return reads


def _native_reads(path: pathlib.Path) -> set[str]:
    return set(re.findall(r'getenv\(\s*"(\w+)"\s*\)', path.read_text()))


def _product_reads() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    sources = [(p, _python_reads) for p in (ROOT / "coarse_jax").rglob("*.py")]
    for folder in ("ffi", "kernels"):
        for pattern in ("*.cc", "*.h", "*.cu", "*.cuh"):
            sources += [(p, _native_reads) for p in (ROOT / folder).rglob(pattern)]
    for path, reads in sources:
        for name in reads(path):
            found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def test_the_scan_finds_the_reads_it_must():
    """The scanner itself: it sees a literal, a constant, a subscript and a C++ getenv."""
    reads = _product_reads()
    assert "COARSE_JAX_MODE" in reads  # os.environ.get("...") in config.py
    assert "COARSE_JAX_COORDINATOR" in reads  # os.environ.get(ENV_COORDINATOR) in launch.py
    assert "COARSE_JAX_PROCESS_ID" in reads  # os.environ[ENV_PROCESS_ID]
    assert "COARSE_JAX_BACKEND" in reads  # std::getenv in ffi/cpu/


def test_product_code_reads_only_documented_variables():
    ours = {name: where for name, where in _product_reads().items() if name.startswith("COARSE")}
    documented = _documented()
    undocumented = {name: where for name, where in ours.items() if name not in documented}
    assert not undocumented, (
        f"product code reads {sorted(undocumented)} ({undocumented}), which the table in "
        f"{GUIDE.relative_to(ROOT)} does not list: document a user setting there, or make a "
        "test switch a hook in coarse_jax.testing"
    )
    unread = documented - set(ours)
    assert not unread, f"{GUIDE.relative_to(ROOT)} lists {sorted(unread)}, which nothing reads"
