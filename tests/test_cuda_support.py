"""`coarse.has_cuda_support()`: installed, a driver, a GPU, in that order, each with its reason.

The driver is a stand-in object with ``cuDriverGetVersion`` / ``cuInit`` /
``cuDeviceGetCount`` that write through ``ctypes.byref`` as libcuda does; the
machine's own answer is checked against ``ctypes.util.find_library("cuda")``
(the loader cache, not the dlopen the probe does).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import types

import pytest

import coarse_jax as coarse
from coarse_jax._ffi import cuda_support, extension

WHEEL = "coarse_jax_cuda13._coarse_cuda"


class FakeDriver:
    """libcuda as ctypes sees it: int return codes, outputs through byref."""

    def __init__(self, version=13000, init_rc=0, count=1):
        self.version, self.init_rc, self.count = version, init_rc, count

    def cuDriverGetVersion(self, out):
        out._obj.value = self.version
        return 0

    def cuInit(self, flags):
        assert flags == 0
        return self.init_rc

    def cuDeviceGetCount(self, out):
        out._obj.value = self.count
        return 0


def _loader(driver):
    def load(name):
        assert name == "libcuda.so.1"
        if driver is None:
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")
        return driver

    return load


def test_not_installed_says_how_to_install():
    support = cuda_support.probe(None, None, _loader(FakeDriver()))
    assert not support and support.available is False and support.module is None
    assert str(support).startswith("not installed:")
    assert "coarse_jax[cuda13]" in support.reason and "COARSE_JAX_ENABLE_CUDA=ON" in support.reason


def test_wheel_that_failed_to_load_names_the_runtime_wheel():
    error = "libcudart.so.13: cannot open shared object file: No such file or directory"
    support = cuda_support.probe(None, error, _loader(FakeDriver()))
    assert str(support).startswith("not installed:")
    assert error in support.reason and "nvidia-cuda-runtime" in support.reason


def test_no_driver_library():
    support = cuda_support.probe(WHEEL, None, _loader(None))
    assert not support and support.module == WHEEL and support.gpus == 0
    assert support.reason.startswith("no driver:") and "libcuda.so.1" in support.reason
    assert f"({WHEEL} is installed)" in support.reason


def test_driver_older_than_cuda_13():
    support = cuda_support.probe(WHEEL, None, _loader(FakeDriver(version=12080)))
    assert not support and support.reason.startswith("no driver:")
    assert "CUDA 12.8" in support.reason and "580" in support.reason


@pytest.mark.parametrize("driver", [FakeDriver(init_rc=100), FakeDriver(count=0)])
def test_driver_without_a_gpu(driver):
    support = cuda_support.probe(WHEEL, None, _loader(driver))
    assert not support and support.reason.startswith("no GPU:")


def test_driver_that_fails_to_initialize():
    support = cuda_support.probe(WHEEL, None, _loader(FakeDriver(init_rc=999)))
    assert not support and "cuInit error 999" in support.reason


def test_ready_counts_the_gpus():
    support = cuda_support.probe("coarse_jax._coarse_cuda", None, _loader(FakeDriver(count=2)))
    assert support and support.available and support.gpus == 2
    assert str(support) == "ready: coarse_jax._coarse_cuda with 2 GPU(s)"


def test_this_machine_answers_as_its_loader_cache_says():
    support = coarse.has_cuda_support()
    assert (
        isinstance(support, coarse.diagnostics.CudaSupport) and bool(support) == support.available
    )
    if extension.cuda_module() is None:
        assert support.reason.startswith("not installed:")
    elif ctypes.util.find_library("cuda") is None:
        assert support.reason.startswith("no driver:")
    # Without a driver, whatever is installed, the driver probe itself says so.
    if ctypes.util.find_library("cuda") is None:
        assert cuda_support.probe(WHEEL, None).reason.startswith("no driver:")


def _fake_wheel(monkeypatch, version, module_error=None):
    """A stand-in coarse_jax_cuda13 package in sys.modules, with or without its module."""
    wheel = types.ModuleType("coarse_jax_cuda13")
    wheel.__version__ = version
    wheel.preload_cuda_runtime = lambda: None
    monkeypatch.setitem(sys.modules, "coarse_jax_cuda13", wheel)
    if module_error is None:
        module = types.ModuleType(WHEEL)
        monkeypatch.setitem(sys.modules, WHEEL, module)
        return module
    monkeypatch.setitem(sys.modules, WHEEL, None)  # import raises ImportError
    return None


@pytest.fixture
def cuda_globals(monkeypatch):
    if extension._CUDA_MODULE == "coarse_jax._coarse_cuda":
        pytest.skip("built from source with its CUDA module: the wheel is not looked for")
    monkeypatch.setattr(extension, "_CUDA_MODULE", None)
    monkeypatch.setattr(extension, "_CUDA_IMPORT_ERROR", None)


def test_the_wheel_module_is_found_when_no_source_build(monkeypatch, cuda_globals):
    module = _fake_wheel(monkeypatch, coarse.__version__)
    assert extension._import_cuda_extension() is module
    assert extension._CUDA_MODULE == WHEEL and extension._CUDA_IMPORT_ERROR is None


def test_a_wheel_of_another_version_is_refused(monkeypatch, cuda_globals):
    _fake_wheel(monkeypatch, "0.0.9")
    assert extension._import_cuda_extension() is None
    assert "coarse-jax-cuda13 0.0.9 beside coarse_jax" in extension._CUDA_IMPORT_ERROR
    assert cuda_support.probe(None, extension._CUDA_IMPORT_ERROR).reason.startswith(
        "not installed:"
    )


def test_a_wheel_whose_module_fails_to_load_is_reported(monkeypatch, cuda_globals):
    _fake_wheel(monkeypatch, coarse.__version__, module_error=True)
    assert extension._import_cuda_extension() is None
    assert extension._CUDA_IMPORT_ERROR and extension._CUDA_MODULE is None
