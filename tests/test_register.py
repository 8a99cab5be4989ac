"""register_host / RegisteredHost: page-locking existing host memory."""

from __future__ import annotations

import ctypes
import gc
import weakref
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit._core import _driver, _host_registry, _pointers

from ._helpers import no_driver_calls, page_aligned_zeros, record_calls

RF = cm.HostRegisterFlags
N = 64 * 1024


@pytest.fixture
def arr() -> np.ndarray:
    return np.zeros(N, np.uint8)


def is_registered(a: np.ndarray) -> bool:
    return _pointers.memory_type(a.__array_interface__["data"][0]) is not None


def test_register_and_unregister(arr: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not is_registered(arr)
    with record_calls(monkeypatch) as calls:
        with cm.register_host(arr) as reg:
            assert reg.ptr == arr.ctypes.data
            assert reg.nbytes == N
            assert reg.flags == RF.DEFAULT
            assert not reg.read_only
            assert reg.array is arr
            assert is_registered(arr)
            assert _host_registry.is_pinned_host(arr)
            assert "RegisteredHost" in repr(reg)
        assert reg.closed
    assert ("cuMemHostRegister", (arr.ctypes.data, N, 0)) in calls
    assert ("cuMemHostUnregister", (arr.ctypes.data,)) in calls
    assert not is_registered(arr)
    arr[:] = 3  # still an ordinary array
    assert int(arr[5]) == 3


def test_register_again_after_close(arr: np.ndarray) -> None:
    reg = cm.register_host(arr)
    reg.close()
    with cm.register_host(arr, flags=RF.PORTABLE) as reg2:
        assert reg2.flags == RF.PORTABLE


def test_unregisters_on_garbage_collection(arr: np.ndarray,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    reg = cm.register_host(arr)
    ref = weakref.ref(reg)
    with record_calls(monkeypatch) as calls:
        del reg
        gc.collect()
    assert ref() is None
    assert ("cuMemHostUnregister", (arr.ctypes.data,)) in calls
    assert not is_registered(arr)


def test_registration_keeps_the_array_alive() -> None:
    a = np.ones(N, np.float32)
    ref = weakref.ref(a)
    reg = cm.register_host(a)
    del a
    gc.collect()
    assert ref() is not None
    reg.close()
    del reg
    gc.collect()
    assert ref() is None


def test_unaligned_slice_and_2d_and_fortran() -> None:
    base = np.zeros(N + 300, np.uint8)
    with cm.register_host(base[100:N]) as reg:
        assert reg.ptr == base.ctypes.data + 100
        assert reg.nbytes == N - 100
    with cm.register_host(np.zeros((64, 32), np.float64, order="F")) as reg:
        assert reg.nbytes == 64 * 32 * 8


def test_buffer_protocol_objects() -> None:
    b = bytearray(N)
    with cm.register_host(b) as reg:
        assert reg.nbytes == N
        reg.array[0] = 7
    assert b[0] == 7


@pytest.mark.parametrize("flags", [RF.PORTABLE, RF.DEVICEMAP, RF.PORTABLE | RF.DEVICEMAP,
                                   RF.READ_ONLY, 1, 2])
def test_flags(arr: np.ndarray, flags: Any) -> None:
    with cm.register_host(arr, flags=flags) as reg:
        assert reg.flags == RF(int(flags))
        assert isinstance(reg.flags, RF)


def test_device_ptr_of_a_mapped_registration(arr: np.ndarray) -> None:
    with cm.register_host(arr, flags=RF.DEVICEMAP) as reg:
        assert reg.device_ptr == arr.ctypes.data  # unified addressing
        with cm.DeviceBuffer.empty(128) as d:
            d.fill(0x33)
            cm.copy(reg.device_ptr, d, nbytes=128)
        assert (arr[:128] == 0x33).all()
        assert (arr[128:] == 0).all()


def test_device_ptr_of_an_unmapped_registration(arr: np.ndarray,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    with cm.register_host(arr) as reg, no_driver_calls(monkeypatch), \
            pytest.raises(ValueError, match="DEVICEMAP"):
        _ = reg.device_ptr


def test_zero_size_registers_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    with no_driver_calls(monkeypatch), cm.register_host(np.zeros(0, np.float32)) as reg:
        assert reg.nbytes == 0


# -- read-only ---------------------------------------------------------------------------


def test_read_only_registration(arr: np.ndarray) -> None:
    arr[:] = 5
    with cm.register_host(arr, flags=RF.READ_ONLY) as reg:
        assert reg.read_only
        assert not reg.array.flags.writeable
        assert np.shares_memory(reg.array, arr)
        with cm.DeviceBuffer.empty(N) as d:
            cm.copy(d, reg)  # the device reads it
            assert (d.to_numpy() == 5).all()


def test_read_only_array_needs_read_only_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    a = np.zeros(N, np.uint8)
    a.flags.writeable = False
    with no_driver_calls(monkeypatch), pytest.raises(ValueError, match="READ_ONLY"):
        cm.register_host(a)
    with no_driver_calls(monkeypatch), pytest.raises(ValueError, match="READ_ONLY"):
        cm.register_host(bytes(N))
    with cm.register_host(a, flags=RF.READ_ONLY) as reg:
        assert reg.read_only


def test_writing_through_a_read_only_registration(arr: np.ndarray,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    with cm.register_host(arr, flags=RF.READ_ONLY) as reg, cm.DeviceBuffer.empty(N) as d:
        s = cm.Stream()
        try:
            with no_driver_calls(monkeypatch):
                with pytest.raises(ValueError, match="READ_ONLY"):
                    cm.copy(reg, d)
                with pytest.raises(ValueError, match="READ_ONLY"):
                    cm.copy(arr, d)  # the original, writable array
                with pytest.raises(ValueError, match="READ_ONLY"):
                    cm.copy(arr[100:200], d, nbytes=100)
                with pytest.raises(ValueError, match="READ_ONLY"):
                    cm.copy_async(arr, d, stream=s)
                with pytest.raises(ValueError, match="read-only"):
                    cm.copy(reg.array, d)
            assert (arr == 0).all()
        finally:
            s.close()


# -- bad input ---------------------------------------------------------------------------


def test_non_contiguous(monkeypatch: pytest.MonkeyPatch) -> None:
    a = np.zeros((64, 64), np.float32)
    with no_driver_calls(monkeypatch):
        for view in (a[:, ::2], a[::2], a.T[::2]):
            with pytest.raises(ValueError, match="contiguous"):
                cm.register_host(view)


@pytest.mark.parametrize("obj", [[1, 2, 3], 12345, None, "text"])
def test_not_memory(obj: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with no_driver_calls(monkeypatch), pytest.raises(TypeError):
        cm.register_host(obj)


def test_object_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    with no_driver_calls(monkeypatch), pytest.raises(TypeError, match="objects"):
        cm.register_host(np.array([None, 1], dtype=object))


def test_device_memory_is_not_host_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    with cm.DeviceBuffer.empty(64) as d, cm.HostBuffer.empty(64) as h, \
            no_driver_calls(monkeypatch):
        with pytest.raises(TypeError):
            cm.register_host(d)
        with pytest.raises(TypeError):
            cm.register_host(h)


def test_views_of_pinned_buffers_need_no_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    with cm.HostBuffer.zeros(N) as h:
        view = h.array
        with no_driver_calls(monkeypatch), pytest.raises(ValueError, match="HostBuffer"):
            cm.register_host(view[4096:])
        del view


def test_memory_pinned_by_the_driver_is_invalid() -> None:
    ptr = int(_driver.call("cuMemHostAlloc", N, 0))
    try:
        arr = np.ctypeslib.as_array((ctypes.c_uint8 * N).from_address(ptr))
        with pytest.raises(cm.CudaInvalidValueError) as info:
            cm.register_host(arr)
        assert info.value.api == "cuMemHostRegister"
    finally:
        _driver.call("cuMemFreeHost", ptr)


@pytest.mark.parametrize("flags", [0x10, 0x100, -1, RF.READ_ONLY | 0x20])
def test_unknown_flag_bits(arr: np.ndarray, flags: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with no_driver_calls(monkeypatch), pytest.raises(ValueError, match="unknown"):
        cm.register_host(arr, flags=flags)


@pytest.mark.parametrize("flags", [cm.HostAllocFlags.PORTABLE, 1.0, None, False])
def test_flags_of_the_wrong_type(arr: np.ndarray, flags: Any,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    with no_driver_calls(monkeypatch), pytest.raises(TypeError):
        cm.register_host(arr, flags=flags)


def test_already_registered(arr: np.ndarray) -> None:
    with cm.register_host(arr):
        with pytest.raises(cm.CudaHostMemoryAlreadyRegisteredError) as info:
            cm.register_host(arr)
        assert info.value.code == int(cu.CUresult.CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
        assert info.value.api == "cuMemHostRegister"
        with pytest.raises(cm.CudaHostMemoryAlreadyRegisteredError):
            cm.register_host(arr[4096:8192])  # overlapping
        assert is_registered(arr)  # the first registration is untouched
    assert not is_registered(arr)


def test_unregistering_twice(arr: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> None:
    reg = cm.register_host(arr)
    with record_calls(monkeypatch) as calls:
        reg.close()
        reg.close()  # idempotent: the driver is asked once
    assert [c for c in calls if c[0] == "cuMemHostUnregister"] == [
        ("cuMemHostUnregister", (arr.ctypes.data,))]
    with pytest.raises(cm.CudaHostMemoryNotRegisteredError) as info:
        _driver.call("cuMemHostUnregister", arr.ctypes.data)
    assert info.value.code == int(cu.CUresult.CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)


def test_unregistered_behind_its_back_warns(arr: np.ndarray) -> None:
    reg = cm.register_host(arr)
    ptr = reg.ptr
    _driver.call("cuMemHostUnregister", ptr)
    with pytest.warns(cm.MemkitWarning, match="cuMemHostUnregister"):
        reg.close()
    # Nor does cuda_memkit still take the range for registered memory (a stale record gave a
    # later array at the same address this one's flags, so a READ_ONLY check missed it).
    assert _host_registry.registered_flags(ptr, N) is None
    assert ptr not in _host_registry._registered


def test_use_after_close(arr: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> None:
    reg = cm.register_host(arr, flags=RF.DEVICEMAP)
    reg.close()
    assert "closed" in repr(reg)
    with no_driver_calls(monkeypatch):
        for action in (lambda: reg.ptr, lambda: reg.array, lambda: reg.device_ptr):
            with pytest.raises(cm.ClosedError):
                action()
        with pytest.raises(cm.ClosedError), reg:
            pass


def test_direct_construction_is_refused() -> None:
    with pytest.raises(TypeError, match="register_host"):
        cm.RegisteredHost()


# -- transfers ---------------------------------------------------------------------------


def test_async_copies_accept_registered_arrays() -> None:
    src = np.arange(N // 4, dtype=np.float32)
    back = np.zeros_like(src)
    with cm.register_host(src), cm.register_host(back), cm.DeviceBuffer.empty(src.nbytes) as d:
        s = cm.Stream()
        cm.copy(d, src, stream=s)
        cm.copy(back, d, stream=s)
        s.synchronize()
        s.close()
    np.testing.assert_array_equal(back, src)


@pytest.mark.parametrize("first", [0, cm.HostRegisterFlags.READ_ONLY])
def test_a_shared_page_with_the_other_read_only_setting_is_refused_clearly(first: int) -> None:
    """Two small arrays on one page: the driver refuses mixed READ_ONLY (the H100 says
    only CUDA_ERROR_INVALID_VALUE); register_host names the reason before calling it."""
    page = page_aligned_zeros(4096)
    a, b = page[:1024], page[2048:3072]
    if first:
        a.flags.writeable = False
    with cm.register_host(a, flags=first):
        other = 0 if first else cm.HostRegisterFlags.READ_ONLY
        if other:
            b.flags.writeable = False
        with pytest.raises(ValueError, match="shares a memory page with a"):
            cm.register_host(b, flags=other)
        if not first:
            with cm.register_host(page[3072:]):  # same flags: fine
                pass
