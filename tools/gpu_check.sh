#!/usr/bin/env bash
# Builds coarse_jax with its CUDA extension on a GPU host, counts the GPUs and
# runs the GPU tests and benchmarks that fit them, multi-GPU first: COARSE's own
# layouts on 2-8 GPUs (tests/test_multi_gpu.py, each layout skipped, naming the
# GPUs it needs, where the host has fewer) and the multi-GPU benchmark
# (benchmarks/test_multi_gpu.py, 2+ GPUs), then the one-GPU ones (kernels,
# p = 1 steps, a CUPTI trace, host proxies).
# Used with the device tool: one call, which runs 10 minutes at most (15 of
# device time in all, the machine's start included), so the sections share
# COARSE_GPU_BUDGET_S (default 540 s from the build's start; more on your own
# host): each gets its time limit or what is left if less, and is skipped,
# saying so, under 30 s. Works on any host with a GPU, nvcc, jax[cuda],
# nanobind and scikit-build-core.
# COARSE_GPU_FROM_WHEEL=1 installs the wheels instead: coarse_jax[cuda13] from
# $REPO/dist (`make wheel`'s output, carried to the host; Python 3.12+), offline
# (--no-index: jax[cuda13], flax, optax... must be installed already), no nvcc.
# Results go to $OUT (default ./out/gpu), at most 8 files, as the device tool
# returns: tests.log (every test section), bench.log (the benchmarks' logs),
# step.log, multi_gpu.md, kernels_gpu.md, step_gpu.md, trace_gpu.md and
# host/step_gpu.md (the tables); build.log only when the build fails.
# JAX's default memory settings on purpose (it preallocates 75% of the GPU):
# the runtime's own allocations must fit beside them without an environment
# variable (README, "GPU memory").
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$REPO/out/gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 COARSE_TEST_GPU=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
NGPU=$(nvidia-smi --list-gpus | wc -l)
echo "$NGPU GPU(s)"
BUDGET=${COARSE_GPU_BUDGET_S:-540}
# fits LIMIT NAME: starts a section, its timeout T = LIMIT seconds or what is left of
# the budget if less; fails (the section is skipped, saying so) under 30 s left.
fits() {
  T=$(( BUDGET - SECONDS )); (( T > $1 )) && T=$1
  if (( T < $1 && T < 30 )); then
    echo "== skipped: $2 ($(( BUDGET - SECONDS )) s of the ${BUDGET} s budget left)"
    return 1
  fi
  echo "== $2 (at most ${T} s)"
}
$PY -c "import jax, jaxlib; print('jax', jax.__version__, jax.devices())"

SECONDS=0
if [ "${COARSE_GPU_FROM_WHEEL:-0}" = 1 ]; then
  echo "== install coarse_jax[cuda13] from $REPO/dist"
  ls "$REPO"/dist/coarse_jax_cuda13-*.whl || { echo "no CUDA wheel in $REPO/dist: run make wheel"; exit 1; }
  $PY -m pip install --no-index -q --find-links "$REPO/dist" "coarse_jax[cuda13]" \
    > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  echo "installed in ${SECONDS}s"; rm -f "$OUT/build.log"
else
  nvcc --version | tail -1
  echo "== build (COARSE_JAX_ENABLE_CUDA=ON)"
  COARSE_JAX_ENABLE_CUDA=ON $PY -m pip install --no-build-isolation --no-deps --no-index -q \
    --config-settings=build-dir=/tmp/coarse-build "$REPO" > "$OUT/build.log" 2>&1 \
    || { tail -40 "$OUT/build.log"; exit 1; }
  echo "built in ${SECONDS}s"; rm -f "$OUT/build.log"
fi
(cd /tmp && $PY -c "import coarse_jax as c; print('has_cuda_support:', c.has_cuda_support())")

cd /tmp  # import the installed package, not the source tree
: > "$OUT/tests.log"; : > "$OUT/bench.log"
# The multi-GPU layouts first; with one GPU each skips at once, naming its count.
if fits 300 "multi-GPU tests: 2, 3, 4 and 8 GPUs against lax.pmean + optax (NCCL)"; then
  timeout $T $PY -m pytest -q -p no:cacheprovider -rs --timeout=150 \
    "$REPO/tests/test_multi_gpu.py" 2>&1 | tee -a "$OUT/tests.log" | tail -12
fi
if (( NGPU >= 2 )) && fits 360 "multi-GPU benchmark on $NGPU GPUs: all_reduce vs psum, ResNet-50 and BERT-base steps"; then
  COARSE_BENCH_OUT=$OUT timeout $T $PY -m pytest -q -p no:cacheprovider -s --timeout=300 \
    "$REPO/benchmarks/test_multi_gpu.py" --benchmark-disable-gc >> "$OUT/bench.log" 2>&1
  grep -E "passed|failed|rror" "$OUT/bench.log" | tail -5; cat "$OUT/multi_gpu.md" 2>/dev/null
fi
if fits 300 "GPU tests, one GPU"; then
  timeout $T $PY -m pytest -q -p no:cacheprovider -rs --timeout=150 "$REPO/tests/test_kernels.py" "$REPO/tests/test_sync_selftest.py" "$REPO/tests/test_call_bindings.py" "$REPO/tests/test_shared_device.py" \
    "$REPO/tests/test_host_proxies.py::test_one_gpu_with_a_host_proxy_matches_the_oracles" \
    "$REPO/tests/test_stream_ops.py::test_a_gpu_is_asked_what_the_streams_backend_counts" \
    "$REPO/tests/test_delayed_update.py::test_the_delayed_update_on_a_gpu" 2>&1 | tee -a "$OUT/tests.log" | tail -25
fi
if fits 120 "kernel benchmarks"; then
  COARSE_BENCH_OUT=$OUT timeout $T $PY -m pytest -q -p no:cacheprovider -s "$REPO/benchmarks/test_kernels_gpu.py" \
    --benchmark-disable-gc >> "$OUT/bench.log" 2>&1; cat "$OUT/kernels_gpu.md"
fi
# The steps on the GPU first, then those through host proxies in a process of
# their own (its table in $OUT/host/): a failure there cannot take the others.
if fits 200 "steps: p = 1 value_and_update (and delayed) against jit + optax"; then
  COARSE_BENCH_OUT=$OUT timeout $T $PY -m pytest -q -p no:cacheprovider -s --timeout=120 -k "not host" \
    "$REPO/benchmarks/test_step_gpu.py" --benchmark-disable-gc > "$OUT/step.log" 2>&1
  grep -E "^\||passed|failed|rror" "$OUT/step.log"
fi
if fits 120 "where a step leaves the GPU idle (CUPTI trace through jax.profiler)"; then
  timeout $T $PY "$REPO/benchmarks/trace_step_gpu.py" "$OUT" 2>&1 | tail -12
fi
if fits 300 "host proxies: steps (against jit + optax and pinned_host offload), pushes and pulls"; then
  mkdir -p "$OUT/host"
  COARSE_BENCH_OUT=$OUT/host timeout $T $PY -m pytest -q -p no:cacheprovider -s --timeout=120 -k host \
    "$REPO/benchmarks/test_step_gpu.py" --benchmark-disable-gc > "$OUT/host/step.log" 2>&1
  grep -E "^\||passed|failed|rror" "$OUT/host/step.log"; cat "$OUT/host/step.log" >> "$OUT/step.log"
  rm "$OUT/host/step.log"  # the device tool returns 8 files at most
fi
echo "== done in ${SECONDS}s"
