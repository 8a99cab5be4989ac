"""Pinned host memory and host registration through the gateway: exact class and CUresult.

Expected answers are the H100's, as recorded by ``scripts/gpu_probe.py`` in
``h100_probe.json`` (cases ``B_hostalloc_flags``, ``B_freehost_misuse``,
``B_host_register``, ``B_register_readonly_write``, ``A_pointer_attributes``,
``A_no_context_thread``). They run on whichever backend is active; the
simulator must agree. Cases the probe ran in a subprocess because they might
poison the context (double frees, writes through read-only registrations) are
not repeated here.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit._core import _driver

from ._helpers import expect_error as expect
from ._helpers import in_fresh_thread

pytestmark = pytest.mark.usefixtures("ctx")

R = cu.CUresult
P = cu.CUpointer_attribute
PAGE = 4096
KiB = 1 << 10
MiB = 1 << 20
REG_N = 64 * KiB
MEMORYTYPE_HOST = int(cu.CUmemorytype.CU_MEMORYTYPE_HOST)


def host_buf(nbytes: int, offset: int = 0) -> tuple[np.ndarray, int]:
    """A pageable, page-aligned numpy buffer and its address (+offset)."""
    a = np.zeros(nbytes + 2 * PAGE, np.uint8)
    addr = a.ctypes.data
    return a, addr + (-addr) % PAGE + offset


@pytest.fixture
def pinned() -> Iterator[int]:
    p = int(_driver.call("cuMemHostAlloc", MiB, 0))
    yield p
    _driver.call("cuMemFreeHost", p)


@pytest.fixture
def dptr() -> Iterator[int]:
    p = int(_driver.call("cuMemAlloc", MiB))
    yield p
    _driver.call("cuMemFree", p)


def memory_type(ptr: int) -> int:
    return int(_driver.call("cuPointerGetAttribute", P.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr))


# -- cuMemHostAlloc / cuMemFreeHost --------------------------------------------------------


@pytest.mark.parametrize("flags", range(8))
def test_hostalloc_valid_flags(flags: int) -> None:
    h = int(_driver.call("cuMemHostAlloc", 4096, flags))
    try:
        assert isinstance(h, int)
        assert h % PAGE == 0
        # unified addressing: every pinned allocation reports DEVICEMAP
        assert int(_driver.call("cuMemHostGetFlags", h)) == flags | 0x2
        assert memory_type(h) == MEMORYTYPE_HOST
        expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE,
               "cuMemHostGetDevicePointer", h, 1)
        dev = int(_driver.call("cuMemHostGetDevicePointer", h, 0))
        assert dev == h
    finally:
        assert _driver.call("cuMemFreeHost", h) is None


@pytest.mark.parametrize("flags", [0x8, 0x100])
def test_hostalloc_unknown_flags(flags: int) -> None:
    expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE, "cuMemHostAlloc", 4096, flags)


def test_hostalloc_zero_bytes_is_null() -> None:
    assert _driver.call("cuMemHostAlloc", 0, 0) == 0
    assert _driver.call("cuMemAllocHost", 0) == 0
    assert _driver.call("cuMemFreeHost", 0) is None


def test_hostalloc_too_large_is_oom() -> None:
    expect(cm.CudaOutOfMemoryError, R.CUDA_ERROR_OUT_OF_MEMORY, "cuMemHostAlloc", 1 << 50, 0)


def test_alloc_host_reports_devicemap() -> None:
    h = int(_driver.call("cuMemAllocHost", 4096))
    try:
        assert int(_driver.call("cuMemHostGetFlags", h)) == 0x2
    finally:
        _driver.call("cuMemFreeHost", h)


def test_hostalloc_without_context() -> None:
    def body() -> None:
        expect(cm.CudaInvalidContextError, R.CUDA_ERROR_INVALID_CONTEXT,
               "cuMemHostAlloc", 4096, 0)

    in_fresh_thread(body)


def test_freehost_needs_no_context() -> None:
    """The H100 frees pinned memory on a thread with no current context
    (found by tests/test_pinned.py on the GPU, where the simulator refused)."""
    h = int(_driver.call("cuMemHostAlloc", 4096, 0))
    in_fresh_thread(lambda: _driver.call("cuMemFreeHost", h))
    # it is gone: a second free is refused like any unknown pointer
    expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE, "cuMemFreeHost", h)


def test_freehost_misuse(dptr: int) -> None:
    inval = (cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE)
    h = int(_driver.call("cuMemHostAlloc", 4096, 0))
    _driver.call("cuMemFreeHost", h)
    expect(*inval, "cuMemFreeHost", h)  # double free
    arr, addr = host_buf(PAGE)
    expect(*inval, "cuMemFreeHost", addr)  # pageable
    expect(*inval, "cuMemFreeHost", dptr)  # device memory
    h2 = int(_driver.call("cuMemHostAlloc", 4096, 0))
    try:
        expect(*inval, "cuMemFree", h2)  # pinned memory is not cuMemAlloc memory
        expect(*inval, "cuMemFreeHost", h2 + 256)  # interior
    finally:
        _driver.call("cuMemFreeHost", h2)
    del arr


def test_pointer_attributes_of_pinned_memory(pinned: int) -> None:
    def attr(a: P, ptr: int = pinned) -> Any:
        return _driver.call("cuPointerGetAttribute", a, ptr)

    assert int(attr(P.CU_POINTER_ATTRIBUTE_MEMORY_TYPE)) == MEMORYTYPE_HOST
    assert int(attr(P.CU_POINTER_ATTRIBUTE_DEVICE_POINTER)) == pinned
    assert int(attr(P.CU_POINTER_ATTRIBUTE_HOST_POINTER)) == pinned
    assert int(attr(P.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, pinned + 100)) == pinned
    assert int(attr(P.CU_POINTER_ATTRIBUTE_RANGE_SIZE)) == MiB
    assert attr(P.CU_POINTER_ATTRIBUTE_MAPPED) is True
    assert attr(P.CU_POINTER_ATTRIBUTE_IS_MANAGED) is False
    assert int(attr(P.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)) == 0
    base, size = _driver.call("cuMemGetAddressRange", pinned + 100)
    assert (int(base), int(size)) == (pinned, MiB)


def test_pinned_memory_through_unified_addressing(pinned: int, dptr: int) -> None:
    _driver.call("cuMemsetD8", pinned, 0x42, 4096)
    assert ctypes.string_at(pinned, 4) == b"\x42" * 4
    _driver.call("cuMemcpyHtoD", dptr, pinned, MiB)
    _driver.call("cuMemcpyDtoD", dptr, pinned, 4096)
    _driver.call("cuMemcpy", dptr, pinned + 100, 1000)


def test_device_pointer_and_flags_of_interior_pointers(pinned: int) -> None:
    dev = int(_driver.call("cuMemHostGetDevicePointer", pinned + 100, 0))
    assert dev - pinned == 100
    assert int(_driver.call("cuMemHostGetFlags", pinned + 100)) == 0x2


def test_device_pointer_and_flags_of_pageable_memory() -> None:
    arr, addr = host_buf(PAGE)
    expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE,
           "cuMemHostGetDevicePointer", addr, 0)
    expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE, "cuMemHostGetFlags", addr)
    del arr


# -- cuMemHostRegister / cuMemHostUnregister ---------------------------------------------


@pytest.mark.parametrize("flags", [0, 1, 2, 3, 8])
def test_register_valid_flags(flags: int) -> None:
    arr, addr = host_buf(REG_N)
    _driver.call("cuMemHostRegister", addr, REG_N, flags)
    try:
        assert memory_type(addr) == MEMORYTYPE_HOST
        assert int(_driver.call("cuMemHostGetDevicePointer", addr, 0)) == addr
    finally:
        assert _driver.call("cuMemHostUnregister", addr) is None
    del arr


def test_register_unknown_flags() -> None:
    arr, addr = host_buf(REG_N)
    expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE,
           "cuMemHostRegister", addr, REG_N, 0x10)
    del arr


def test_register_iomemory_on_ram() -> None:
    arr, addr = host_buf(REG_N)
    expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE,
           "cuMemHostRegister", addr, REG_N, 0x4)
    del arr


@pytest.mark.parametrize(("flags", "reported"), [(0, 2), (1, 3), (2, 2), (3, 3), (8, 2)])
def test_get_flags_of_registered_memory(flags: int, reported: int) -> None:
    arr, addr = host_buf(REG_N)
    _driver.call("cuMemHostRegister", addr, REG_N, flags)
    try:
        # DEVICEMAP is implied, READ_ONLY is not reported
        assert int(_driver.call("cuMemHostGetFlags", addr)) == reported
    finally:
        _driver.call("cuMemHostUnregister", addr)
    del arr


def test_pointer_attributes_of_registered_memory() -> None:
    arr, addr = host_buf(REG_N)
    _driver.call("cuMemHostRegister", addr, REG_N, 0)
    try:
        assert memory_type(addr) == MEMORYTYPE_HOST
        assert int(_driver.call("cuPointerGetAttribute", P.CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                addr)) == REG_N
        assert int(_driver.call("cuPointerGetAttribute", P.CU_POINTER_ATTRIBUTE_HOST_POINTER,
                                addr + 8)) == addr + 8
        assert _driver.call("cuPointerGetAttribute", P.CU_POINTER_ATTRIBUTE_MAPPED, addr) is True
        base, size = _driver.call("cuMemGetAddressRange", addr + 100)
        assert (int(base), int(size)) == (addr, REG_N)
    finally:
        _driver.call("cuMemHostUnregister", addr)
    del arr


@pytest.mark.parametrize("flags", [0, 1, 2, 8])
def test_register_unaligned(flags: int) -> None:
    arr, addr = host_buf(REG_N, offset=100)
    _driver.call("cuMemHostRegister", addr, REG_N - 200, flags)
    try:
        assert int(_driver.call("cuMemHostGetDevicePointer", addr, 0)) == addr
    finally:
        _driver.call("cuMemHostUnregister", addr)
    del arr


def test_register_twice_and_overlapping() -> None:
    arr, addr = host_buf(4 * REG_N)
    _driver.call("cuMemHostRegister", addr, REG_N, 0)
    try:
        code = R.CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
        cls = cm.CudaHostMemoryAlreadyRegisteredError
        expect(cls, code, "cuMemHostRegister", addr, REG_N, 0)
        expect(cls, code, "cuMemHostRegister", addr + PAGE, REG_N, 0)
        expect(cls, code, "cuMemHostRegister", addr + REG_N - PAGE, REG_N, 0)
        _driver.call("cuMemHostRegister", addr + REG_N, REG_N, 0)  # adjacent is fine
        _driver.call("cuMemHostUnregister", addr + REG_N)
    finally:
        _driver.call("cuMemHostUnregister", addr)
    del arr


@pytest.mark.parametrize(("first", "second", "ok"), [
    (0, 0, True), (8, 8, True),  # same flags: disjoint bytes on one page register
    (0, 8, False), (8, 0, False),  # READ_ONLY differs: the shared page refuses
])
def test_register_disjoint_bytes_on_a_shared_page(first: int, second: int, ok: bool) -> None:
    """Two registrations of disjoint bytes on one page (small heap arrays do this).

    The H100 (scripts/probes/register_same_page_probe.py): accepted when the flags
    agree on READ_ONLY, CUDA_ERROR_INVALID_VALUE when they do not, also when only
    the last page of the first registration is shared.
    """
    arr, addr = host_buf(4 * PAGE)
    _driver.call("cuMemHostRegister", addr, 1024, first)
    try:
        if ok:
            _driver.call("cuMemHostRegister", addr + 2048, 1024, second)
            _driver.call("cuMemHostUnregister", addr + 2048)
        else:
            expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE,
                   "cuMemHostRegister", addr + 2048, 1024, second)
    finally:
        _driver.call("cuMemHostUnregister", addr)
    _driver.call("cuMemHostRegister", addr + 1024, PAGE, 0)  # ends on the second page
    try:
        expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE,
               "cuMemHostRegister", addr + PAGE + 2048, 100, 8)
        _driver.call("cuMemHostRegister", addr + PAGE + 2048, 100, 0)
        _driver.call("cuMemHostUnregister", addr + PAGE + 2048)
    finally:
        _driver.call("cuMemHostUnregister", addr + 1024)
    del arr


def test_register_size_zero_null_and_device_memory(dptr: int) -> None:
    arr, addr = host_buf(REG_N)
    inval = (cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE)
    expect(*inval, "cuMemHostRegister", addr, 0, 0)
    expect(*inval, "cuMemHostRegister", 0, REG_N, 0)
    expect(*inval, "cuMemHostRegister", dptr, 4096, 0)
    del arr


def test_registered_memory_data_path(dptr: int) -> None:
    arr, addr = host_buf(REG_N)
    _driver.call("cuMemHostRegister", addr, REG_N, 0)
    try:
        _driver.call("cuMemsetD8", dptr, 0x33, REG_N)
        _driver.call("cuMemcpyDtoD", addr, dptr, 128)
        view = arr[addr - arr.ctypes.data:][:REG_N]
        assert (view[:128] == 0x33).all()
        assert (view[128:] == 0).all()
    finally:
        _driver.call("cuMemHostUnregister", addr)
    del arr


def test_unregister_misuse() -> None:
    arr, addr = host_buf(REG_N)
    code = R.CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
    cls = cm.CudaHostMemoryNotRegisteredError
    inval = (cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE)
    _driver.call("cuMemHostRegister", addr, REG_N, 0)
    expect(*inval, "cuMemHostUnregister", addr + PAGE)  # interior: known, not a base
    _driver.call("cuMemHostUnregister", addr)
    expect(cls, code, "cuMemHostUnregister", addr)  # twice
    a2, addr2 = host_buf(PAGE)
    expect(cls, code, "cuMemHostUnregister", addr2)  # never registered
    expect(*inval, "cuMemHostUnregister", 0)
    del arr, a2


def test_register_hostalloc_memory() -> None:
    h = int(_driver.call("cuMemHostAlloc", REG_N, 0))
    try:
        expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE,
               "cuMemHostRegister", h, REG_N, 0)
        expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE, "cuMemHostUnregister", h)
    finally:
        _driver.call("cuMemFreeHost", h)


def test_read_only_registration_is_readable(dptr: int) -> None:
    arr, addr = host_buf(REG_N)
    arr[:] = 0x11
    _driver.call("cuMemHostRegister", addr, REG_N, 8)
    try:
        dev = int(_driver.call("cuMemHostGetDevicePointer", addr, 0))
        _driver.call("cuMemcpyDtoD", dptr, dev, 4096)
        out = np.zeros(4, np.uint8)
        _driver.call("cuMemcpyDtoH", out, dptr, 4)
        assert out.tolist() == [0x11] * 4
    finally:
        _driver.call("cuMemHostUnregister", addr)
    del arr


def test_writes_through_a_read_only_registration_fail(dptr: int) -> None:
    arr, addr = host_buf(REG_N)
    view = arr[addr - arr.ctypes.data:][:REG_N]
    view[:] = 0x11
    _driver.call("cuMemHostRegister", addr, REG_N, 8)
    try:
        dev = int(_driver.call("cuMemHostGetDevicePointer", addr, 0))
        inval = (cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE)
        expect(*inval, "cuMemsetD8", dev, 0x22, 4096)
        expect(*inval, "cuMemcpyHtoD", dev, np.zeros(16, np.uint8), 16)
        _driver.call("cuCtxSynchronize")  # not a sticky error
        assert (view == 0x11).all()
    finally:
        _driver.call("cuMemHostUnregister", addr)
    del arr, view
