"""Core driver semantics through the gateway: exact class and CUresult.

Expected answers are the H100's (driver 580, CUDA 13.0; recorded by
``scripts/gpu_probe.py`` in ``h100_probe.json``). These run on whichever
backend is active; the simulator must agree.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit._core import _driver

from ._helpers import expect_error as expect
from ._helpers import in_fresh_thread

pytestmark = pytest.mark.usefixtures("ctx")

R = cu.CUresult


@pytest.fixture
def dptr() -> Iterator[int]:
    p = int(_driver.call("cuMemAlloc", 4096))
    yield p
    _driver.call("cuMemFree", p)


# -- init, devices, contexts -------------------------------------------------------


def test_cuinit_twice_is_fine() -> None:
    assert _driver.call("cuInit", 0) is None
    assert _driver.call("cuInit", 0) is None


def test_device_get_past_count() -> None:
    expect(cm.CudaInvalidDeviceError, R.CUDA_ERROR_INVALID_DEVICE, "cuDeviceGet",
           cm.device_count())


def test_device_get_negative() -> None:
    expect(cm.CudaInvalidDeviceError, R.CUDA_ERROR_INVALID_DEVICE, "cuDeviceGet", -1)


def test_device_name_fills_the_buffer() -> None:
    raw = _driver.call("cuDeviceGetName", 64, cu.CUdevice(0))
    assert len(raw) == 64
    assert raw.split(b"\x00", 1)[0]


def test_device_attribute_unknown() -> None:
    expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE, "cuDeviceGetAttribute",
           9999, cu.CUdevice(0))


def test_peer_access_with_itself_is_false() -> None:
    assert _driver.call("cuDeviceCanAccessPeer", cu.CUdevice(0), cu.CUdevice(0)) == 0


def test_cuinit_bad_flags() -> None:
    expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE, "cuInit", 1)


def test_no_context_on_a_fresh_thread() -> None:
    assert in_fresh_thread(lambda: int(_driver.call("cuCtxGetCurrent"))) == 0


def test_alloc_without_context() -> None:
    err = in_fresh_thread(
        lambda: expect(cm.CudaInvalidContextError, R.CUDA_ERROR_INVALID_CONTEXT,
                       "cuMemAlloc", 1024))
    assert err.name == "CUDA_ERROR_INVALID_CONTEXT"


def test_mem_get_info_without_context() -> None:
    in_fresh_thread(lambda: expect(cm.CudaInvalidContextError, R.CUDA_ERROR_INVALID_CONTEXT,
                                   "cuMemGetInfo"))


def test_ctx_get_device_without_context() -> None:
    in_fresh_thread(lambda: expect(cm.CudaInvalidContextError, R.CUDA_ERROR_INVALID_CONTEXT,
                                   "cuCtxGetDevice"))


# -- device memory ------------------------------------------------------------------


def test_alloc_zero_bytes() -> None:
    expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE, "cuMemAlloc", 0)


def test_alloc_too_large_is_oom() -> None:
    err = expect(cm.CudaOutOfMemoryError, R.CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc", 1 << 60)
    assert isinstance(err, MemoryError)


def test_free_unknown_pointer() -> None:
    expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE, "cuMemFree", 0x1234000)


def test_free_null_succeeds() -> None:
    assert _driver.call("cuMemFree", 0) is None


def test_free_unknown_pointer_needs_no_context() -> None:
    in_fresh_thread(lambda: expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE,
                                   "cuMemFree", 0x1234000))


def test_double_free() -> None:
    p = int(_driver.call("cuMemAlloc", 4096))
    _driver.call("cuMemFree", p)
    expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE, "cuMemFree", p)


def test_free_interior_pointer(dptr: int) -> None:
    expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE, "cuMemFree", dptr + 256)


def test_mem_get_info_accounts_allocations() -> None:
    free0, total = _driver.call("cuMemGetInfo")
    p = int(_driver.call("cuMemAlloc", 64 << 20))
    free1, _ = _driver.call("cuMemGetInfo")
    _driver.call("cuMemFree", p)
    assert 0 < free1 < free0 <= total
    assert free0 - free1 >= 64 << 20


def test_address_range_of_interior_pointer(dptr: int) -> None:
    base, size = _driver.call("cuMemGetAddressRange", dptr + 100)
    assert int(base) == dptr
    assert size >= 4096


def test_pointer_attributes_of_device_memory(dptr: int) -> None:
    P = cu.CUpointer_attribute
    mtype = _driver.call("cuPointerGetAttribute", P.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dptr)
    assert int(mtype) == int(cu.CUmemorytype.CU_MEMORYTYPE_DEVICE)
    assert int(_driver.call("cuPointerGetAttribute",
                            P.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dptr)) == 0
    assert not _driver.call("cuPointerGetAttribute", P.CU_POINTER_ATTRIBUTE_IS_MANAGED, dptr)
    start = _driver.call("cuPointerGetAttribute", P.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                         dptr + 8)
    assert int(start) == dptr


def test_pointer_attribute_of_pageable_host_memory() -> None:
    host = np.zeros(16, np.uint8)
    expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE, "cuPointerGetAttribute",
           cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, host.ctypes.data)


# -- memset ---------------------------------------------------------------------------


def test_memset_value_out_of_range_is_rejected_by_the_bindings(dptr: int) -> None:
    with pytest.raises(OverflowError, match="value too large to convert to unsigned char"):
        _driver.call("cuMemsetD8", dptr, 256, 16)
    with pytest.raises(OverflowError, match="can't convert negative value to unsigned char"):
        _driver.call("cuMemsetD8", dptr, -1, 16)
    with pytest.raises(OverflowError, match="unsigned short"):
        _driver.call("cuMemsetD16", dptr, 65536, 16)
    with pytest.raises(OverflowError, match="unsigned int"):
        _driver.call("cuMemsetD32", dptr, 1 << 32, 16)


def test_memset_null_and_pageable_pointers() -> None:
    host = np.zeros(16, np.uint8)
    expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE, "cuMemsetD8", 0, 1, 16)
    expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE, "cuMemsetD8",
           host.ctypes.data, 1, 16)
    assert not host.any()


def test_memset_without_context() -> None:
    in_fresh_thread(lambda: expect(cm.CudaInvalidContextError, R.CUDA_ERROR_INVALID_CONTEXT,
                                   "cuMemsetD8", 0x1234000, 1, 16))


def test_memset_past_the_end(dptr: int) -> None:
    expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE, "cuMemsetD8", dptr, 1, 8192)


def test_memset_d32_misaligned(dptr: int) -> None:
    expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE, "cuMemsetD32", dptr + 1, 7, 4)


def test_memset_then_read_back(dptr: int) -> None:
    _driver.call("cuMemsetD32", dptr, 0xDEADBEEF, 1024)
    out = np.zeros(1024, np.uint32)
    _driver.call("cuMemcpyDtoH", out, dptr, 4096)
    assert (out == 0xDEADBEEF).all()


# -- copies ----------------------------------------------------------------------------


def test_copy_past_the_end(dptr: int) -> None:
    src = np.zeros(8192, np.uint8)
    expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE, "cuMemcpyHtoD", dptr, src, 8192)


def test_device_copies_refuse_host_addresses(dptr: int) -> None:
    host = np.zeros(64, np.uint8)
    expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE, "cuMemcpyHtoD",
           host.ctypes.data, host, 64)
    expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE, "cuMemcpyDtoH",
           host, host.ctypes.data, 64)
    expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE, "cuMemcpyDtoD",
           dptr, 0x1234000, 64)


def test_zero_byte_copies_succeed(dptr: int) -> None:
    assert _driver.call("cuMemcpyDtoD", dptr, dptr, 0) is None
    assert _driver.call("cuMemcpyHtoD", dptr, np.zeros(1, np.uint8), 0) is None


def test_unified_copy_with_raw_host_addresses(dptr: int) -> None:
    src = np.arange(1024, dtype=np.uint32)
    dst = np.zeros_like(src)
    _driver.call("cuMemcpy", dptr, src.ctypes.data, 4096)
    _driver.call("cuMemcpy", dst.ctypes.data, dptr, 4096)
    assert (dst == src).all()


def test_copy_from_interior_pointer(dptr: int) -> None:
    src = np.arange(4096, dtype=np.uint8)
    _driver.call("cuMemcpyHtoD", dptr, src, 4096)
    out = np.zeros(16, np.uint8)
    _driver.call("cuMemcpyDtoH", out, dptr + 100, 16)
    assert (out == src[100:116]).all()


# -- streams and events -----------------------------------------------------------------


def test_stream_create_bad_flags() -> None:
    expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE, "cuStreamCreate", 8)


def test_stream_destroy_default_stream() -> None:
    expect(cm.CudaInvalidHandleError, R.CUDA_ERROR_INVALID_HANDLE, "cuStreamDestroy", 0)


def test_stream_create_and_destroy() -> None:
    s = _driver.call("cuStreamCreate", 1)
    assert _driver.call("cuStreamQuery", s) is None
    assert _driver.call("cuStreamDestroy", s) is None


def test_event_record_and_elapsed_time() -> None:
    s = _driver.call("cuStreamCreate", 1)
    a = _driver.call("cuEventCreate", 0)
    b = _driver.call("cuEventCreate", 0)
    _driver.call("cuEventRecord", a, s)
    _driver.call("cuEventRecord", b, s)
    _driver.call("cuEventSynchronize", b)
    assert _driver.call("cuEventElapsedTime", a, b) >= 0.0
    for h in (a, b):
        _driver.call("cuEventDestroy", h)
    _driver.call("cuStreamDestroy", s)


def test_event_misuse() -> None:
    expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE, "cuEventCreate", 0x100)
    expect(cm.CudaInvalidHandleError, R.CUDA_ERROR_INVALID_HANDLE, "cuEventQuery", 0)
    ev = _driver.call("cuEventCreate", 0)
    assert _driver.call("cuEventQuery", ev) is None  # never recorded: complete
    _driver.call("cuEventDestroy", ev)
    # (destroying it again answered CONTEXT_IS_DESTROYED in the isolated probe, but
    # a destroyed handle can crash the driver in a long-lived process: never tried)


def test_elapsed_time_without_timing() -> None:
    s = _driver.call("cuStreamCreate", 1)
    a = _driver.call("cuEventCreate", 2)  # CU_EVENT_DISABLE_TIMING
    b = _driver.call("cuEventCreate", 2)
    _driver.call("cuEventRecord", a, s)
    _driver.call("cuEventRecord", b, s)
    _driver.call("cuEventSynchronize", b)
    try:
        expect(cm.CudaInvalidHandleError, R.CUDA_ERROR_INVALID_HANDLE,
               "cuEventElapsedTime", a, b)
    finally:
        for h in (a, b):
            _driver.call("cuEventDestroy", h)
        _driver.call("cuStreamDestroy", s)


# -- error strings -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "text"),
    [(R.CUDA_ERROR_INVALID_VALUE, "invalid argument"),
     (R.CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
     (R.CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")],
)
def test_error_strings(code: R, text: str) -> None:
    raw = _driver.call("cuGetErrorString", code)
    assert raw.decode() == text
    assert _driver.call("cuGetErrorName", code).decode() == code.name



@pytest.mark.multi_gpu
def test_sync_memset_of_another_devices_memory_is_refused(two_devices: None) -> None:
    # Two H200s, 2026-11-26 (no peer access enabled): cuMemsetD8 from device 0's context on
    # memory of device 1 answers INVALID_VALUE; from device 1's own context it works.
    def body() -> None:
        c0 = _driver.call("cuDevicePrimaryCtxRetain", cu.CUdevice(0))
        c1 = _driver.call("cuDevicePrimaryCtxRetain", cu.CUdevice(1))
        try:
            _driver.call("cuCtxSetCurrent", c1)
            ptr = _driver.call("cuMemAlloc", 4096)
            try:
                _driver.call("cuCtxSetCurrent", c0)
                expect(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE,
                       "cuMemsetD8", ptr, 7, 4096)
                _driver.call("cuCtxSetCurrent", c1)
                _driver.call("cuMemsetD8", ptr, 7, 4096)
                _driver.call("cuCtxSynchronize")
            finally:
                _driver.call("cuCtxSetCurrent", c1)
                _driver.call("cuMemFree", ptr)
        finally:
            _driver.call("cuCtxSetCurrent", None)
            _driver.call("cuDevicePrimaryCtxRelease", cu.CUdevice(0))
            _driver.call("cuDevicePrimaryCtxRelease", cu.CUdevice(1))

    in_fresh_thread(body)


@pytest.mark.multi_gpu
def test_pointer_device_ordinal_reads_0_through_the_bindings(two_devices: None) -> None:
    # Two H200s, cuda-bindings 13.3, 2026-11-26: CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL of
    # device 1's cuMemAlloc memory reads 0 through the bindings (the driver called through
    # ctypes says 1); its CONTEXT attribute is device 1's context, whose device is 1.
    def body() -> None:
        c1 = _driver.call("cuDevicePrimaryCtxRetain", cu.CUdevice(1))
        try:
            _driver.call("cuCtxSetCurrent", c1)
            ptr = _driver.call("cuMemAlloc", 4096)
            try:
                P = cu.CUpointer_attribute
                assert int(_driver.call("cuPointerGetAttribute",
                                        P.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)) == 0
                ctx = _driver.call("cuPointerGetAttribute", P.CU_POINTER_ATTRIBUTE_CONTEXT, ptr)
                assert int(ctx) == int(c1)
                _driver.call("cuCtxSetCurrent", None)
                _driver.call("cuCtxPushCurrent", ctx)
                assert int(_driver.call("cuCtxGetDevice")) == 1
                _driver.call("cuCtxPopCurrent")
            finally:
                _driver.call("cuCtxSetCurrent", c1)
                _driver.call("cuMemFree", ptr)
        finally:
            _driver.call("cuCtxSetCurrent", None)
            _driver.call("cuDevicePrimaryCtxRelease", cu.CUdevice(1))

    in_fresh_thread(body)
