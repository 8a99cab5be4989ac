"""DeviceBuffer: cuMemAlloc memory with the interop protocols."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core import _pointers
from cuda_memkit._core._interop import DL_CUDA, DeviceArrayView, DeviceMemoryMixin

from ._helpers import no_driver_calls, record_calls


def test_alloc_basics() -> None:
    with cm.DeviceBuffer.empty(1 << 20) as d:
        assert d.nbytes == 1 << 20
        assert d.ptr != 0
        assert d.device == 0
        assert isinstance(d, DeviceMemoryMixin)
        assert _pointers.memory_type(d.ptr) == _pointers.MEMORYTYPE_DEVICE
        assert "DeviceBuffer" in repr(d) and "device 0" in repr(d)


def test_numpy_integer_size() -> None:
    with cm.DeviceBuffer.empty(np.int64(256)) as d:
        assert d.nbytes == 256


def test_cuda_array_interface_and_dlpack() -> None:
    with cm.DeviceBuffer.empty(4096) as d:
        cai = d.__cuda_array_interface__
        assert cai["data"] == (d.ptr, False)
        assert cai["shape"] == (4096,)
        assert cai["typestr"] == "|u1"
        assert cai["version"] == 3
        assert d.__dlpack_device__() == (DL_CUDA, 0)
        view = d.as_array(np.float32, (32, 32))
        assert isinstance(view, DeviceArrayView)
        assert view.shape == (32, 32) and view.dtype == np.float32
        assert view.__cuda_array_interface__["data"][0] == d.ptr
        cap = d.__dlpack__()
        assert type(cap).__name__ == "PyCapsule"
        del cap, view


def test_from_array_and_to_numpy() -> None:
    src = np.arange(1000, dtype=np.float64).reshape(10, 100)
    with cm.DeviceBuffer.from_array(src) as d:
        assert d.nbytes == src.nbytes
        np.testing.assert_array_equal(d.to_numpy(np.float64, (10, 100)), src)
        np.testing.assert_array_equal(d.to_numpy(np.float64)[:5], src.ravel()[:5])
        np.testing.assert_array_equal(d.to_numpy(), src)  # the dtype and shape it was made with
        assert d.to_numpy(np.uint8).shape == (src.nbytes,)
        assert d.to_numpy(np.float64, 3).tolist() == [0.0, 1.0, 2.0]
    with cm.HostBuffer.from_array(src) as h, cm.DeviceBuffer.from_array(h) as d:
        np.testing.assert_array_equal(d.to_numpy(np.float64, src.shape), src)
    with cm.DeviceBuffer.from_array(src[:, ::3]) as d:  # made contiguous first
        np.testing.assert_array_equal(d.to_numpy(np.float64, (10, 34)), src[:, ::3])


def test_from_array_object_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    with no_driver_calls(monkeypatch), pytest.raises(TypeError):
        cm.DeviceBuffer.from_array(np.array([None]))


def test_to_numpy_shape_too_big() -> None:
    with cm.DeviceBuffer.empty(16) as d, pytest.raises(ValueError, match="needs"):
        d.to_numpy(np.float64, 3)


def test_fill_sync_and_stream(stream: cm.Stream) -> None:
    with cm.DeviceBuffer.empty(4096) as d:
        d.fill(0xAB)
        assert (d.to_numpy() == 0xAB).all()
        d.fill(0, stream=stream)
        stream.synchronize()
        assert not d.to_numpy().any()


@pytest.mark.parametrize("value", [-1, 256, 1.0, True])
def test_fill_bad_value(value: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with cm.DeviceBuffer.empty(16) as d, no_driver_calls(monkeypatch), \
            pytest.raises((TypeError, ValueError)):
        d.fill(value)


def test_zero_length_allocates_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    cm.Device(0).set_current()
    with record_calls(monkeypatch) as calls, cm.DeviceBuffer.empty(0) as d:
        assert d.ptr == 0 and d.nbytes == 0
        d.fill(1)
        assert d.to_numpy().size == 0
        cm.copy(d, np.zeros(0, np.uint8))
    assert not [c for c in calls if c[0].startswith("cuMem")]


@pytest.mark.parametrize("nbytes", [-1, -(1 << 40)])
def test_negative_size(nbytes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    with no_driver_calls(monkeypatch), pytest.raises(ValueError, match=">= 0"):
        cm.DeviceBuffer.empty(nbytes)


@pytest.mark.parametrize("nbytes", [1.0, "16", None, True, 2**10 + 0.5, [16]])
def test_non_integer_size(nbytes: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with no_driver_calls(monkeypatch), pytest.raises(TypeError):
        cm.DeviceBuffer.empty(nbytes)


@pytest.mark.parametrize("nbytes", [1 << 63, 1 << 64, 1 << 100])
def test_size_overflow(nbytes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    with no_driver_calls(monkeypatch), pytest.raises(ValueError, match="larger"):
        cm.DeviceBuffer.empty(nbytes)


def test_out_of_memory() -> None:
    total = cm.Device(0).total_memory
    with pytest.raises(cm.CudaOutOfMemoryError) as info:
        cm.DeviceBuffer.empty(total * 2)
    assert info.value.api == "cuMemAlloc"


@pytest.mark.parametrize("device", [-1, "0", 1.0])
def test_bad_device(device: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with no_driver_calls(monkeypatch), pytest.raises((TypeError, ValueError)):
        cm.DeviceBuffer.empty(16, device=device)


def test_direct_construction_is_refused() -> None:
    with pytest.raises(TypeError, match="empty"):
        cm.DeviceBuffer()


def test_close_gc_and_use_after_close(monkeypatch: pytest.MonkeyPatch) -> None:
    d = cm.DeviceBuffer.empty(64)
    ptr = d.ptr
    with record_calls(monkeypatch) as calls:
        d.close()
        d.close()
    assert calls.count(("cuMemFree", (ptr,))) == 1
    assert "closed" in repr(d)
    with no_driver_calls(monkeypatch):
        for action in (lambda: d.ptr, lambda: d.__cuda_array_interface__, lambda: d.to_numpy(),
                       lambda: d.fill(0), lambda: d.as_array()):
            with pytest.raises(cm.ClosedError, match="DeviceBuffer is closed"):
                action()
    e = cm.DeviceBuffer.empty(64)
    ptr = e.ptr
    ref = weakref.ref(e)
    with record_calls(monkeypatch) as calls:
        del e
        gc.collect()
    assert ref() is None
    assert ("cuMemFree", (ptr,)) in calls


def test_view_keeps_the_buffer_alive() -> None:
    d = cm.DeviceBuffer.empty(64)
    ref = weakref.ref(d)
    view = d.as_array(np.int32)
    del d
    gc.collect()
    assert ref() is not None
    del view
    gc.collect()
    assert ref() is None


def test_second_device(two_devices: None) -> None:
    with cm.DeviceBuffer.empty(256, device=1) as d1, cm.DeviceBuffer.empty(256, device=0) as d0:
        assert d1.device == 1 and d0.device == 0
        assert d1.__dlpack_device__() == (DL_CUDA, 1)
        d0.fill(9)
        cm.copy(d1, d0)
        assert (d1.to_numpy() == 9).all()


def test_shape_and_dtype_are_kept() -> None:
    with cm.DeviceBuffer.empty(64) as b:
        assert b.dtype is None and b.shape == (64,) and b.to_numpy().dtype == np.uint8
        b.copy_from(np.zeros(16, np.float32))  # bytes take any dtype of their size
    with cm.DeviceBuffer.zeros((3, 4), np.int16) as t:
        assert t.dtype == np.int16 and t.shape == (3, 4) and t.nbytes == 24
        assert t.__cuda_array_interface__["shape"] == (3, 4)
        assert not t.to_numpy().any() and t.to_numpy().shape == (3, 4)
        with pytest.raises(ValueError, match="dtype mismatch"):
            t.copy_from(np.zeros((3, 4), np.float16))
        assert "shape=(3, 4) dtype=int16" in repr(t)
    src = np.arange(6, dtype=np.float64).reshape(2, 3)
    with cm.HostBuffer.from_array(src) as h, cm.DeviceBuffer.from_array(h) as d:
        assert d.dtype == np.float64 and d.shape == (2, 3)
        np.testing.assert_array_equal(d.to_numpy(), src)


@pytest.mark.multi_gpu
@pytest.mark.parametrize("kind", ["DeviceBuffer", "pool", "GrowableBuffer"])
def test_fill_another_devices_buffer_from_this_device(kind: str, two_devices: None) -> None:
    # The driver refuses a synchronous memset of device 1's memory from device 0's context
    # (two H200s): fill() does it in the buffer's own device's context.
    pool = cm.MemoryPool(1) if kind == "pool" else None
    with cm.Device(1):
        buf: Any = (cm.DeviceBuffer.empty(4096) if kind == "DeviceBuffer"
                    else cm.GrowableBuffer(4096, device=1) if kind == "GrowableBuffer"
                    else pool.allocate(4096, stream=None))  # type: ignore[union-attr]
    try:
        from cuda_memkit._core import _driver

        with cm.Device(0):
            assert int(_driver.call("cuCtxGetDevice")) == 0  # device 0's context is current
            buf.fill(7)
            assert (buf.to_numpy() == 7).all()
    finally:
        buf.close()
        if pool is not None:
            pool.close()
