from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from cuda.bindings.driver import CUresult

import cuda_memkit as cm
from cuda_memkit._core import _driver

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": ROOT, **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full, timeout=120, check=False)


def test_import_makes_no_driver_call_and_does_not_import_numpy() -> None:
    out = _run(
        "import sys, cuda_memkit, cuda_memkit._core._driver as d\n"
        "print(d.is_loaded(), 'numpy' in sys.modules)",
        CUDA_MEMKIT_BACKEND="cuda",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_unknown_backend_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        cm.use_backend("opencl")


def test_choosing_the_active_backend_again_is_a_no_op(backend: str) -> None:
    cm.device_count()
    cm.use_backend(backend)
    assert cm.backend_name() == backend


def test_switching_backend_after_first_call_raises(backend: str) -> None:
    cm.device_count()
    other = "cuda" if backend == "sim" else "sim"
    with pytest.raises(RuntimeError, match="already in use"):
        cm.use_backend(other)


def test_bad_env_value_is_reported() -> None:
    out = _run("import cuda_memkit as cm; cm.device_count()", CUDA_MEMKIT_BACKEND="gpu")
    assert out.returncode != 0
    assert "CUDA_MEMKIT_BACKEND='gpu' is not a backend" in out.stderr


def test_sim_backend_from_env_in_a_fresh_process() -> None:
    out = _run("import cuda_memkit as cm; print(cm.device_count(), cm.backend_name())",
               CUDA_MEMKIT_BACKEND="sim")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "sim"]


def test_payload_shapes() -> None:
    assert isinstance(_driver.call("cuDriverGetVersion"), int)  # one output
    assert _driver.call("cuDeviceTotalMem", 0) > 0  # one output
    cm.Device(0).set_current()
    assert _driver.call("cuCtxSynchronize") is None  # no output
    pair = _driver.call("cuMemGetInfo")  # two outputs
    assert isinstance(pair, tuple) and len(pair) == 2


def test_function_missing_from_backend() -> None:
    with pytest.raises(cm.CudaDriverNotFoundError, match="cuNoSuchFunction"):
        _driver.call("cuNoSuchFunction")
    with pytest.raises(cm.CudaDriverNotFoundError, match="cuNoSuchFunction"):
        _driver.function("cuNoSuchFunction")


class DynamicLibNotFoundError(RuntimeError):
    pass


class FunctionNotFoundError(RuntimeError):
    pass


@pytest.mark.parametrize(
    ("exc", "needle"),
    [(DynamicLibNotFoundError, "CUDA_MEMKIT_BACKEND=sim"),
     (FunctionNotFoundError, "does not provide cuFake")],
)
def test_bindings_errors_become_driver_not_found(
    monkeypatch: pytest.MonkeyPatch, exc: type[Exception], needle: str
) -> None:
    def fake(*args: Any) -> Any:
        raise exc("boom")

    monkeypatch.setitem(_driver._fns, "cuFake", fake)
    with pytest.raises(cm.CudaDriverNotFoundError, match=needle) as info:
        _driver.call("cuFake")
    assert info.value.api == "cuFake"


def test_other_runtime_errors_propagate(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(*args: Any) -> Any:
        raise RuntimeError("something else")

    monkeypatch.setitem(_driver._fns, "cuFake", fake)
    with pytest.raises(RuntimeError, match="something else"):
        _driver.call("cuFake")


def test_check_and_function() -> None:
    fn = _driver.function("cuDeviceGetCount")
    assert _driver.check("cuDeviceGetCount", fn()) == cm.device_count()
    with pytest.raises(cm.CudaInvalidValueError, match="cuX"):
        _driver.check("cuX", (CUresult.CUDA_ERROR_INVALID_VALUE, None))


def test_missing_driver_message_in_fresh_process(backend: str) -> None:
    if backend == "cuda":
        pytest.skip("a driver is present on this machine")
    out = _run("import cuda_memkit as cm\n"
               "try:\n    cm.device_count()\n"
               "except cm.CudaDriverNotFoundError as e:\n    print('OK', e)",
               CUDA_MEMKIT_BACKEND="cuda")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("OK cuInit: CUDA_DRIVER_NOT_FOUND")
    assert "CUDA_MEMKIT_BACKEND=sim" in out.stdout
