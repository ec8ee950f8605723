"""The C++ layering contract: which folder of ffi/ and kernels/ may include which.

`make check` runs it; it exits non-zero, naming each include that breaks the
contract, the layer it runs into and what that layer may include instead.
The contract is also written down in docs/guides/design.md ("The C++
layers"); the two must agree.

Every quoted include (``#include "..."``) of every C++/CUDA file is resolved
the way the build resolves it (the file's own folder, then ffi/, the root
and kernels/, CMakeLists.txt's include directories) to the folder it lands
in. An include that lands in no folder of the tree is XLA's FFI header
(``xla/ffi/api/...``, allowed where the contract says so) or an error: a
typo, or a file the build would not find. Angle-bracket includes are the
standard library's and third parties' (nanobind, CUDA); the CUDA runtime's
are allowed only where CUDA code lives.

Usage: ``python tools/check_includes.py [ROOT]`` (ROOT: the repository,
by default the one this script is in).
"""

from __future__ import annotations

import pathlib
import re
import sys

# Bottom to top. Each layer may include itself and the layers listed; "XLA"
# is XLA's FFI header (xla/ffi/api/*.h), "CUDA" the CUDA runtime's headers.
CONTRACT: dict[str, tuple[str, ...]] = {
    # Plain launch functions and their per-element arithmetic, in plain C++
    # too: no XLA type, nothing of coarse above them.
    "kernels": ("CUDA",),
    # The protocol, in plain C++: no XLA type. Its phases return its own
    # Status / StatusOr (runtime/status.h) and read its own DType
    # (runtime/dtype.h).
    "runtime": ("kernels",),
    # The host backend both modules link: element loops, the kernels' host
    # loops, the host pool, the inline stream. No XLA type either.
    "host": ("runtime", "kernels"),
    # The XLA binding, platform-neutral: buffers and attributes into runtime
    # calls, and the one conversion of the runtime's types into XLA's
    # (xla/status_xla.h).
    "xla": ("runtime", "kernels", "XLA"),
    # The platforms' modules: devices, storage and streams of one platform,
    # and the handlers that bind xla/'s translation to it.
    "cpu": ("xla", "host", "runtime", "kernels", "XLA"),
    "cuda": ("xla", "host", "runtime", "kernels", "XLA", "CUDA"),
    # The lab (self-tests, benchmarks) on top: it may include every layer;
    # no layer includes it.
    "lab": ("cpu", "cuda", "xla", "host", "runtime", "kernels", "XLA", "CUDA"),
}

SUFFIXES = {".cc", ".h", ".cu", ".cuh"}
QUOTED = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
ANGLED = re.compile(r"^\s*#\s*include\s*<([^>]+)>")
XLA_HEADER = "xla/ffi/api/"
CUDA_HEADERS = ("cuda.h", "cuda_runtime.h", "cuda_runtime_api.h", "cuda_fp16.h", "cuda_bf16.h")


def layer_of(root: pathlib.Path, path: pathlib.Path) -> str | None:
    """The layer a file of the tree belongs to: its folder under ffi/, or kernels."""
    rel = path.relative_to(root).parts
    if rel[0] == "kernels":
        return "kernels"
    if rel[0] == "ffi" and len(rel) > 2:
        return rel[1]
    return None


def resolve(root: pathlib.Path, source: pathlib.Path, name: str) -> pathlib.Path | None:
    """Where the build finds ``#include "name"`` of ``source`` (CMakeLists.txt's directories)."""
    for base in (source.parent, root / "ffi", root, root / "kernels"):
        candidate = base / name
        if candidate.is_file():
            return candidate.resolve()
    return None


def check_file(root: pathlib.Path, path: pathlib.Path) -> list[str]:
    """Every include of ``path`` that breaks the contract, as messages."""
    layer = layer_of(root, path)
    rel = path.relative_to(root)
    if layer not in CONTRACT:
        return [f"{rel}: folder '{layer}' is in no layer of the contract (tools/check_includes.py)"]
    allowed = CONTRACT[layer]
    errors = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        where = f"{rel}:{number}"
        angled = ANGLED.match(line)
        if angled:
            if angled.group(1) in CUDA_HEADERS and "CUDA" not in allowed:
                errors.append(
                    f"{where}: <{angled.group(1)}>: the CUDA runtime belongs in cuda/, "
                    f"kernels/ or lab/, not in {layer}/"
                )
            continue
        quoted = QUOTED.match(line)
        if not quoted:
            continue
        name = quoted.group(1)
        target = resolve(root, path, name)
        if target is None:
            if name.startswith(XLA_HEADER):
                if "XLA" not in allowed:
                    errors.append(f'{where}: "{name}": {layer}/ takes no XLA type')
                continue
            errors.append(f'{where}: "{name}" is no file of the tree (ffi/, kernels/)')
            continue
        into = layer_of(root, target)
        if into == layer:
            continue
        if into not in allowed:
            may = ", ".join(a + "/" for a in allowed if a not in ("XLA", "CUDA")) or "nothing"
            errors.append(
                f'{where}: "{name}" runs from {layer}/ into {into}/; {layer}/ may include '
                f"{may} (the contract: docs/guides/design.md, The C++ layers)"
            )
    return errors


def check(root: pathlib.Path) -> list[str]:
    """Every broken include of the tree under ``root`` (ffi/ and kernels/)."""
    root = root.resolve()
    files = [
        p
        for top in ("ffi", "kernels")
        for p in sorted((root / top).rglob("*"))
        if p.suffix in SUFFIXES and p.is_file()
    ]
    return [e for p in files for e in check_file(root, p)]


def main(argv: list[str]) -> int:
    root = (
        pathlib.Path(argv[1]) if len(argv) > 1 else pathlib.Path(__file__).resolve().parent.parent
    )
    errors = check(root)
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        print(f"check_includes: {len(errors)} include(s) break the C++ layering", file=sys.stderr)
        return 1
    print("check_includes: the C++ layering holds")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
