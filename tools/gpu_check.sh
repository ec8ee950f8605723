#!/usr/bin/env bash
# Builds coarse_jax with its CUDA extension on a GPU host and runs the GPU
# tests and kernel benchmarks. Used with the device tool (one call); works on
# any host with a GPU, nvcc, jax[cuda], nanobind and scikit-build-core.
# Results go to $OUT (default ./out/gpu): test log, kernels_gpu.md/.json.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$REPO/out/gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 COARSE_TEST_GPU=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
nvcc --version | tail -1
$PY -c "import jax, jaxlib; print('jax', jax.__version__, jax.devices())"

echo "== build (COARSE_JAX_ENABLE_CUDA=ON)"
SECONDS=0
COARSE_JAX_ENABLE_CUDA=ON $PY -m pip install --no-build-isolation --no-deps --no-index -q \
  --config-settings=build-dir=/tmp/coarse-build "$REPO" > "$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log"; exit 1; }
echo "built in ${SECONDS}s"

cd /tmp  # import the installed package, not the source tree
echo "== GPU tests"
$PY -m pytest -q -p no:cacheprovider -rs "$REPO/tests/test_kernels.py" "$REPO/tests/test_sync_selftest.py" "$REPO/tests/test_call_bindings.py" "$REPO/tests/test_shared_device.py" 2>&1 | tee "$OUT/tests.log" | tail -25
echo "== kernel benchmarks"
COARSE_BENCH_OUT=$OUT $PY -m pytest -q -p no:cacheprovider -s "$REPO/benchmarks/test_kernels_gpu.py" \
  --benchmark-json="$OUT/kernels_gpu.json" --benchmark-disable-gc 2>&1 | tee "$OUT/bench.log" | tail -30
