#!/usr/bin/env bash
# Checks that the C++/CUDA sources in ffi/ and kernels/ are clang-format clean
# (style: .clang-format at the repository root). Exits non-zero and prints the
# offending lines on any difference. `--fix` rewrites the files instead.
#
# Needs clang-format 23.1.5, the PyPI wheel: `pip install clang-format==23.1.5`
# (other versions may format some lines differently). CLANG_FORMAT overrides
# the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT="${CLANG_FORMAT:-clang-format}"
if ! command -v "$CLANG_FORMAT" >/dev/null 2>&1; then
  echo "check_format.sh: $CLANG_FORMAT not found; pip install clang-format==23.1.5" >&2
  exit 2
fi
mapfile -t files < <(git ls-files -- 'ffi/*.cc' 'ffi/*.h' 'ffi/*.cu' 'ffi/*.cuh' \
  'kernels/*.cc' 'kernels/*.h' 'kernels/*.cu' 'kernels/*.cuh')
if [[ "${1:-}" == "--fix" ]]; then
  exec "$CLANG_FORMAT" -i --style=file "${files[@]}"
fi
exec "$CLANG_FORMAT" --dry-run --Werror --style=file "${files[@]}"
