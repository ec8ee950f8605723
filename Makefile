# Two commands for a newcomer: `make demo` and `make test`. Both create .venv
# if missing and (re)install the package when its sources changed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.coarse-installed
SOURCES := pyproject.toml CMakeLists.txt $(wildcard ffi/*.cc ffi/*.h ffi/runtime/*.cc ffi/runtime/*.h coarse_jax/*.py)
# Build deps are installed into the venv and the build runs without isolation,
# so the extension compiles against the very jaxlib that runs it.
BUILD_DEPS := "scikit-build-core>=0.10" "nanobind>=2.4" "jax==0.10.2" "jaxlib==0.10.2"
XLA_CPU := XLA_FLAGS=--xla_force_host_platform_device_count=8

.PHONY: demo test bench install clean lint

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): $(PY) $(SOURCES)
	$(PY) -m pip install -q $(BUILD_DEPS)
	$(PY) -m pip install -q --no-build-isolation ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(XLA_CPU) $(PY) examples/demo/main.py

# pytest from the venv's bin (not `python -m pytest`) so the installed
# package, with its compiled extension, is imported rather than ./coarse_jax.
test: $(STAMP)
	$(VENV)/bin/pytest -q tests

bench: $(STAMP)
	$(XLA_CPU) $(VENV)/bin/pytest -q benchmarks --benchmark-columns=min,median,mean,rounds

lint: $(STAMP)
	$(PY) -m pip install -q ruff
	$(VENV)/bin/ruff check coarse_jax tests benchmarks examples

clean:
	rm -rf build $(VENV) .pytest_cache .benchmarks
