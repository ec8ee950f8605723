"""The C++ layering contract (tools/check_includes.py, run by `make check`) holds on the tree
and fails on a copy of it given one include that breaks it."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHECKER = ROOT / "tools" / "check_includes.py"


def _run(root: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECKER), str(root)], capture_output=True, text=True, check=False
    )


@pytest.fixture
def tree(tmp_path: pathlib.Path) -> pathlib.Path:
    """A copy of the repository's ffi/ and kernels/."""
    for top in ("ffi", "kernels"):
        shutil.copytree(ROOT / top, tmp_path / top)
    return tmp_path


def _add_include(path: pathlib.Path, line: str) -> None:
    text = path.read_text()
    head, sep, rest = text.partition("#include")  # before the file's first include
    path.write_text(head + line + "\n" + sep + rest)


def test_the_tree_keeps_the_contract() -> None:
    result = _run(ROOT)
    assert result.returncode == 0, result.stderr
    assert "holds" in result.stdout


def test_the_copy_keeps_it_before_it_is_broken(tree: pathlib.Path) -> None:
    assert _run(tree).returncode == 0


@pytest.mark.parametrize(
    ("source", "include", "says"),
    [
        # Sideways between the platforms: the CUDA module reaching into the CPU module.
        ("ffi/cuda/handlers_cuda.cc", '#include "cpu/cpu_devices.h"', "from cuda/ into cpu/"),
        # Up a layer: the runtime reading the XLA binding, the host backend a platform.
        ("ffi/runtime/ring.h", '#include "xla/handler.h"', "from runtime/ into xla/"),
        ("ffi/host/host_pool.h", '#include "cpu/host_stream.h"', "from host/ into cpu/"),
        # The kernels take no XLA type and include nothing above them.
        ("kernels/span.h", '#include "xla/ffi/api/ffi.h"', "kernels/ takes no XLA type"),
        ("kernels/span.h", '#include "runtime/plan.h"', "from kernels/ into runtime/"),
        # Nor do the runtime and the host backend: the binding converts (xla/status_xla.h).
        ("ffi/runtime/session.h", '#include "xla/ffi/api/ffi.h"', "runtime/ takes no XLA type"),
        ("ffi/host/element_loops.h", '#include "xla/ffi/api/ffi.h"', "host/ takes no XLA type"),
        # Nothing includes the lab.
        ("ffi/cpu/module_cpu.cc", '#include "lab/host_bench.h"', "from cpu/ into lab/"),
        # The CUDA runtime stays in cuda/, kernels/ and lab/.
        ("ffi/runtime/stream.h", "#include <cuda_runtime.h>", "the CUDA runtime belongs"),
        # A file the build would not find.
        ("ffi/xla/push.cc", '#include "runtime/no_such_file.h"', "is no file of the tree"),
    ],
)
def test_a_bad_include_fails_naming_it(
    tree: pathlib.Path, source: str, include: str, says: str
) -> None:
    _add_include(tree / source, include)
    result = _run(tree)
    assert result.returncode == 1
    assert source in result.stderr
    assert says in result.stderr, result.stderr


def test_a_folder_outside_the_contract_fails(tree: pathlib.Path) -> None:
    (tree / "ffi" / "extra").mkdir()
    (tree / "ffi" / "extra" / "new.cc").write_text('#include "runtime/plan.h"\n')
    result = _run(tree)
    assert result.returncode == 1
    assert "ffi/extra/new.cc: folder 'extra' is in no layer" in result.stderr
