"""The documentation runs: README.md, the guides and the docstrings' examples.

* Every ```python block of a page (README.md, docs/index.md, docs/guides/*.md)
  runs, in a fresh interpreter, from a temporary directory (the blocks write
  files, and the installed package is imported rather than ./coarse_jax), on 8
  virtual CPU devices. README.md's blocks run each alone, as a user pastes
  them one by one, and each must print something; a guide's blocks run in
  order as one script (later blocks use earlier names). What cannot run here
  is fenced otherwise: shell
  commands as ```bash, program output as ```text, and Python that cannot run
  alone (several processes, a fragment of a step shown above it) as a MyST
  ```{code-block} python directive, which is highlighted like Python but not
  run. These are the only ways to keep a block out of this test.
* Every example in the public modules' docstrings runs under `doctest`, with
  these names predefined: ``coarse`` (coarse_jax), ``jax``, ``jnp``, ``np``,
  ``optax`` and ``mesh = coarse.make_mesh(workers=4)``.
* The API reference (docs/api/index.md) lists every public name of
  ``coarse_jax.__all__``, ``coarse_jax.optim`` and ``coarse_jax.perf_model``.
  `make docs` builds it with warnings as errors.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import types

import pytest

import coarse_jax as coarse

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", DOCS / "index.md", *sorted((DOCS / "guides").glob("*.md"))]
PAGE_IDS = [str(p.relative_to(ROOT)) for p in PAGES]

# The modules whose docstrings hold the public API's examples.
DOCTEST_MODULES = [
    "coarse_jax",
    "coarse_jax.api.sync",
    "coarse_jax.api.proxy_state",
    "coarse_jax.api.grad",
    "coarse_jax.api.update",
    "coarse_jax.api.memory",
    "coarse_jax.api.collectives",
    "coarse_jax.config",
    "coarse_jax.mesh.tiers",
    "coarse_jax.mesh.make",
    "coarse_jax.plan.types",
    "coarse_jax.plan.planner",
    "coarse_jax.plan.traffic",
    "coarse_jax.optim",
    "coarse_jax.kernels",
    "coarse_jax.reference",
    "coarse_jax.perf_model.paper",
    "coarse_jax.perf_model.dag",
    "coarse_jax.perf_model.bound",
    "coarse_jax.perf_model.hosts",
    "coarse_jax.emulation.schedule",
    "coarse_jax.profiling.data",
    "coarse_jax.profiling.measure",
    "coarse_jax.profiling.rounds",
    "coarse_jax.profiling.to_config",
    "coarse_jax.emulation.topology",
    "coarse_jax.emulation.pcie_link",
    "coarse_jax.cli.proxy_placement",
    "coarse_jax._ffi.extension",
    "coarse_jax._ffi.byte_counts",
    "coarse_jax.diagnostics",
    "coarse_jax.testing",
]

# Modules whose docstring examples run but whose failures do not count
# (none now; kept for a module whose docstrings are being rewritten).
DOCTEST_PENDING: list[str] = []

DOCTEST_SCRIPT = """
import doctest, importlib, sys, warnings
import jax, jax.numpy as jnp, numpy as np, optax
import coarse_jax as coarse

globs = {"coarse": coarse, "jax": jax, "jnp": jnp, "np": np, "optax": optax,
         "mesh": coarse.make_mesh(workers=4)}
flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
warnings.simplefilter("ignore", coarse.mesh.ProxiesReplaced)
split = sys.argv.index("--pending")
modules, pending = sys.argv[1:split], set(sys.argv[split + 1:])
failed = attempted = 0
for name in modules:
    runner = doctest.DocTestRunner(optionflags=flags)
    for test in doctest.DocTestFinder(exclude_empty=True).find(
            importlib.import_module(name), name, globs=dict(globs)):
        # Made again per docstring: an example may give these workers other
        # proxies (one jax mesh object per devices: coarse_jax.mesh).
        test.globs["mesh"] = coarse.make_mesh(workers=4)
        runner.run(test)
    f, a = runner.summarize(verbose=False)
    print(f"{name}: {a} examples, {f} failed" + (" (pending, not counted)" if name in pending
                                                 else ""), flush=True)
    attempted += a
    failed += 0 if name in pending else f
print(f"doctest: {attempted} examples, {failed} failed")
sys.exit(1 if failed or not attempted else 0)
"""


def _env() -> dict[str, str]:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("COARSE_JAX_MODE", None)
    return env


def _blocks(page: pathlib.Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M)


def test_readme_is_short_and_has_python_blocks():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert len(_blocks(ROOT / "README.md")) >= 2


def _run_python(args: list[str], cwd) -> subprocess.CompletedProcess:
    """``python *args`` in ``cwd`` with the docs' environment (8 virtual CPU devices)."""
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=280
    )


README = ROOT / "README.md"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("index", range(len(_blocks(README))), ids=lambda i: f"block{i + 1}")
def test_readme_block_runs_alone_and_prints(index, tmp_path):
    script = tmp_path / f"readme_block_{index + 1}.py"
    script.write_text(_blocks(README)[index])
    run = _run_python([str(script)], tmp_path)
    assert run.returncode == 0, (
        f"README.md, python block {index + 1}, run alone, failed:\n"
        f"{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    )
    assert run.stdout.strip(), f"README.md, python block {index + 1} printed nothing"


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "page", [p for p in PAGES if p != README and _blocks(p)], ids=lambda p: p.stem
)
def test_page_python_blocks_run(page, tmp_path):
    # Named after the page but not after a module it imports (a "flax.py"
    # would shadow flax).
    script = tmp_path / f"doc_page_{page.stem}.py"
    script.write_text("\n\n".join(_blocks(page)))
    run = _run_python([str(script)], tmp_path)
    assert run.returncode == 0, (
        f"{page.relative_to(ROOT)}: its python blocks failed:\n"
        f"{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    )


@pytest.mark.timeout(300)
def test_docstring_examples_run(tmp_path):
    run = _run_python(
        ["-c", DOCTEST_SCRIPT, *DOCTEST_MODULES, "--pending", *DOCTEST_PENDING], tmp_path
    )
    assert run.returncode == 0, (
        f"docstring examples failed:\n{run.stdout[-8000:]}{run.stderr[-3000:]}"
    )


def _public_names() -> list[str]:
    names = []
    for name in coarse.__all__:
        obj = getattr(coarse, name)
        if isinstance(obj, types.ModuleType):
            inner = getattr(obj, "__all__", None) or [
                n
                for n, v in vars(obj).items()
                if not n.startswith("_") and getattr(v, "__module__", "") == obj.__name__
            ]
            names += [f"{name}.{n}" for n in inner]
        else:
            names.append(name)
    return names


def test_api_reference_lists_every_public_name():
    text = (DOCS / "api" / "index.md").read_text()
    listed: set[str] = set()
    module = "coarse_jax"
    for line in text.splitlines():
        if m := re.match(r"\.\. currentmodule:: (\S+)", line.strip()):
            module = m.group(1)
        elif re.fullmatch(r"   [A-Za-z_][A-Za-z0-9_]*", line):
            listed.add(f"{module}.{line.strip()}".removeprefix("coarse_jax."))
    missing = [n for n in _public_names() if n not in listed]
    assert not missing, f"docs/api/index.md has no entry for {missing}"
