"""Only `coarse_jax._jax_compat` imports jax's internals (``jax._src``).

import-linter forbids only whole external packages (``jax``, not ``jax._src``),
so this reads every module's imports with `ast`: at module level, in a
function, under ``if TYPE_CHECKING:``, as ``import jax._src.x`` or ``from
jax._src import x`` or ``from jax import _src``.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "coarse_jax"
COMPAT = PACKAGE / "_jax_compat"


def internal_imports(source: str) -> list[int]:
    """The lines of ``source`` that import from ``jax._src``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        if any(n == "jax._src" or n.startswith("jax._src.") for n in names):
            lines.append(node.lineno)
    return lines


def test_the_check_sees_each_form_of_import():
    """The deliberate bug: each way to reach jax._src is found, and public jax is not."""
    for scratch in (
        "import jax._src.core",
        "from jax._src import core",
        "from jax._src.lax import parallel as p",
        "from jax import _src",
        "def f():\n    from jax._src import dispatch",
        "if TYPE_CHECKING:\n    import jax._src.core as c",
    ):
        assert internal_imports(scratch), scratch
    assert not internal_imports("import jax\nfrom jax import lax\nfrom jax.extend import core")


def test_only_the_compat_package_imports_jax_internals():
    found = {
        str(path.relative_to(ROOT)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if COMPAT not in path.parents and (lines := internal_imports(path.read_text()))
    }
    assert not found, (
        f"jax._src imported outside coarse_jax/_jax_compat/ (file: lines): {found}. Fix: "
        "add what you need to coarse_jax/_jax_compat/ (why it is internal, the versions "
        "checked) and import it from there."
    )
    assert internal_imports((COMPAT / "internals.py").read_text())  # the check reads files
