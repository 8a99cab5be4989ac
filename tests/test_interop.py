from __future__ import annotations

import ctypes
import gc

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core import _dlpack, _driver
from cuda_memkit._core._context import ensure_context
from cuda_memkit._core._interop import DL_CUDA, DeviceArrayView, DeviceMemoryMixin
from cuda_memkit._core._resource import Resource, driver_release, make_finalizer

from ._leaks import live_exports


class RawDeviceMemory(DeviceMemoryMixin, Resource):
    """Minimal device allocation to exercise the protocols."""

    def __init__(self, nbytes: int) -> None:
        ensure_context()
        self._ptr = int(_driver.call("cuMemAlloc", nbytes))
        self._nbytes = nbytes
        self._open(make_finalizer(self, "raw", driver_release, "cuMemFree", self._ptr))

    @property
    def ptr(self) -> int:
        self._check_open()
        return self._ptr

    @property
    def nbytes(self) -> int:
        return self._nbytes


@pytest.fixture
def mem() -> RawDeviceMemory:
    m = RawDeviceMemory(4096)
    yield m
    m.close()


def test_cuda_array_interface(mem: RawDeviceMemory) -> None:
    cai = mem.__cuda_array_interface__
    assert cai["version"] == 3
    assert cai["shape"] == (4096,)
    assert cai["typestr"] == "|u1"
    assert cai["data"] == (mem.ptr, False)


def test_typed_view(mem: RawDeviceMemory) -> None:
    view = mem.as_array(np.float32, (32, 32))
    assert isinstance(view, DeviceArrayView)
    assert view.shape == (32, 32) and view.dtype == np.float32 and view.nbytes == 4096
    assert view.__cuda_array_interface__["typestr"] == "<f4"
    assert view.owner is mem
    assert mem.as_array(np.float64).shape == (512,)
    with pytest.raises(ValueError, match="needs 8192 bytes"):
        mem.as_array(np.float64, (1024,))
    with pytest.raises(TypeError):
        mem.as_array(object)
    with pytest.raises(ValueError):
        mem.as_array(np.float32, (-1,))
    with pytest.raises(ValueError, match="whole number"):
        RawDeviceMemoryView = mem.as_array(np.dtype("V3"))  # noqa: F841


def test_view_of_closed_buffer_raises() -> None:
    m = RawDeviceMemory(64)
    view = m.as_array(np.uint8)
    m.close()
    with pytest.raises(cm.ClosedError):
        _ = view.__cuda_array_interface__
    with pytest.raises(cm.ClosedError):
        view.__dlpack__()


def _read_capsule(capsule: object) -> _dlpack.DLManagedTensor:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    address = get(capsule, b"dltensor")
    return _dlpack.DLManagedTensor.from_address(address)


def test_dlpack_capsule_fields_and_release(mem: RawDeviceMemory) -> None:
    before = live_exports()
    cap = mem.as_array(np.int16, (4, 8)).__dlpack__()
    assert live_exports() == before + 1
    t = _read_capsule(cap).dl_tensor
    assert t.data == mem.ptr
    assert (t.device.device_type, t.device.device_id) == (DL_CUDA, 0)
    assert t.ndim == 2 and [t.shape[0], t.shape[1]] == [4, 8]
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (0, 16, 1)
    assert not t.strides
    del cap, t
    gc.collect()
    assert live_exports() == before


def test_dlpack_device_and_bad_requests(mem: RawDeviceMemory) -> None:
    assert mem.__dlpack_device__() == (DL_CUDA, 0)
    with pytest.raises(BufferError):
        mem.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        mem.__dlpack__(dl_device=(1, 0))
    with pytest.raises(BufferError):
        mem.as_array(np.dtype(">i4")).__dlpack__()
    cap = mem.__dlpack__(stream=None)
    del cap


def test_dlpack_consumed_by_torch_or_cupy(mem: RawDeviceMemory, backend: str) -> None:
    if backend != "cuda":
        pytest.skip("needs a real GPU for a consumer library")
    try:
        import cupy
    except ImportError:
        pytest.skip("cupy is not installed")
    _driver.call("cuMemsetD8", mem.ptr, 7, mem.nbytes)
    arr = cupy.from_dlpack(mem.as_array(np.uint8))
    assert int(arr.sum()) == 7 * 4096
    arr2 = cupy.asarray(mem.as_array(np.uint32, (1024,)))
    assert int(arr2[0]) == 0x07070707
    del arr, arr2
