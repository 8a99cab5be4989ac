"""Stream-ordered pool semantics through the gateway: exact class and CUresult.

Expected answers are the H100's (``h100_probe.json``, section E). They run on
whichever backend is active; the simulator must agree. Statistics are read
after a synchronize: the GPU returns memory above the release threshold at
the next synchronize, the simulator at the free (its frees complete at once).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit._core import _driver

from ._helpers import expect, expect_error, in_fresh_thread

pytestmark = pytest.mark.usefixtures("ctx")

R = cu.CUresult
A = cu.CUmemPool_attribute
T = cu.CUmemAllocationType
H = cu.CUmemAllocationHandleType
L = cu.CUmemLocationType
F = cu.CUmemAccess_flags
KiB, MiB = 1 << 10, 1 << 20
CHUNK = 32 * MiB
U64_MAX = (1 << 64) - 1
BAD_DEVICE_ORDINAL = 7

INVALID = (cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE)
NOT_SUPPORTED = (cm.CudaNotSupportedError, R.CUDA_ERROR_NOT_SUPPORTED)
BAD_DEVICE = (cm.CudaInvalidDeviceError, R.CUDA_ERROR_INVALID_DEVICE)
OOM = (cm.CudaOutOfMemoryError, R.CUDA_ERROR_OUT_OF_MEMORY)
NO_CONTEXT = (cm.CudaInvalidContextError, R.CUDA_ERROR_INVALID_CONTEXT)
UNKNOWN = (cm.CudaError, R.CUDA_ERROR_UNKNOWN)


def location(kind: Any, ident: int = 0) -> cu.CUmemLocation:
    loc = cu.CUmemLocation()
    loc.type = kind
    loc.id = ident
    return loc


def props(kind: Any = L.CU_MEM_LOCATION_TYPE_DEVICE, ident: int = 0, *,
          alloc: Any = T.CU_MEM_ALLOCATION_TYPE_PINNED, handles: int = 0,
          max_size: int = 0) -> cu.CUmemPoolProps:
    p = cu.CUmemPoolProps()
    p.allocType = alloc
    p.handleTypes = H(handles)
    p.location = location(kind, ident)
    p.maxSize = max_size
    return p


def get(pool: Any, attr: Any) -> int:
    return int(_driver.call("cuMemPoolGetAttribute", pool, attr))


def stats(pool: Any) -> tuple[int, int, int, int]:
    return (get(pool, A.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
            get(pool, A.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH),
            get(pool, A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
            get(pool, A.CU_MEMPOOL_ATTR_USED_MEM_HIGH))


def set_threshold(pool: Any, value: int) -> None:
    _driver.call("cuMemPoolSetAttribute", pool, A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                 cu.cuuint64_t(value))


def desc(ordinal: int, flags: Any = F.CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
         kind: Any = L.CU_MEM_LOCATION_TYPE_DEVICE) -> cu.CUmemAccessDesc:
    d = cu.CUmemAccessDesc()
    d.location = location(kind, ordinal)
    d.flags = flags
    return d


@pytest.fixture
def stream() -> Iterator[Any]:
    s = _driver.call("cuStreamCreate", 1)
    yield s
    _driver.call("cuStreamSynchronize", s)
    _driver.call("cuStreamDestroy", s)


def make_pool(p: cu.CUmemPoolProps | None = None) -> Any:
    return _driver.call("cuMemPoolCreate", p if p is not None else props())


@pytest.fixture
def pool() -> Iterator[Any]:
    handle = make_pool()
    yield handle
    _driver.call("cuCtxSynchronize")
    _driver.call("cuMemPoolDestroy", handle)


# -- creation ----------------------------------------------------------------------------


@pytest.mark.parametrize("name,p", [
    ("device0", props()),
    ("POSIX_FD", props(handles=1)),
    ("FABRIC", props(handles=8)),
    ("maxSize_1MiB", props(max_size=MiB)),
    ("maxSize_3MiB+1", props(max_size=3 * MiB + 1)),
    ("HOST", props(L.CU_MEM_LOCATION_TYPE_HOST)),
    ("HOST_NUMA0", props(L.CU_MEM_LOCATION_TYPE_HOST_NUMA, 0)),
    # the driver keeps device pages after a process's first managed allocations (96 MiB on
    # the H100 when these run first): the managed allowance of the leak check
    pytest.param("device0_MANAGED", props(alloc=T.CU_MEM_ALLOCATION_TYPE_MANAGED),
                 marks=pytest.mark.uses_managed_memory),
    pytest.param("HOST_MANAGED", props(L.CU_MEM_LOCATION_TYPE_HOST,
                                       alloc=T.CU_MEM_ALLOCATION_TYPE_MANAGED),
                 marks=pytest.mark.uses_managed_memory),
    pytest.param("NONE_MANAGED", props(L.CU_MEM_LOCATION_TYPE_NONE,
                                       alloc=T.CU_MEM_ALLOCATION_TYPE_MANAGED),
                 marks=pytest.mark.uses_managed_memory),
])
def test_create_allocate_destroy(name: str, p: cu.CUmemPoolProps, stream: Any) -> None:
    handle = make_pool(p)
    ptr = _driver.call("cuMemAllocFromPoolAsync", MiB, handle, stream)
    _driver.call("cuStreamSynchronize", stream)
    P = cu.CUpointer_attribute
    assert int(_driver.call("cuPointerGetAttribute", P.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
                            ptr)) == int(handle)
    kind = int(_driver.call("cuPointerGetAttribute", P.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr))
    host = "HOST" in name and "MANAGED" not in name
    assert kind == (1 if host else 2)  # CU_MEMORYTYPE_HOST / _DEVICE
    assert bool(_driver.call("cuPointerGetAttribute", P.CU_POINTER_ATTRIBUTE_IS_MANAGED,
                             ptr)) == ("MANAGED" in name)
    if not host and "MANAGED" not in name:
        assert int(ptr) % (2 * MiB) == 0
    assert stats(handle) == (CHUNK, CHUNK, MiB, MiB)
    for attr in (A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, A.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT):
        assert isinstance(_driver.call("cuMemPoolGetAttribute", handle, attr), cu.cuuint64_t)
    assert type(_driver.call("cuMemPoolGetAttribute", handle,
                             A.CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC)) is int
    _driver.call("cuMemFreeAsync", ptr, stream)
    _driver.call("cuStreamSynchronize", stream)
    assert stats(handle) == (0, CHUNK, 0, MiB)
    _driver.call("cuMemPoolDestroy", handle)


@pytest.mark.parametrize("p", [
    props(ident=BAD_DEVICE_ORDINAL),
    props(L.CU_MEM_LOCATION_TYPE_INVALID),
    props(alloc=T.CU_MEM_ALLOCATION_TYPE_INVALID),
    props(L.CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT),
], ids=["device7", "location_INVALID", "type_INVALID", "HOST_NUMA_CURRENT"])
def test_create_refused(p: cu.CUmemPoolProps) -> None:
    expect(INVALID, "cuMemPoolCreate", p)


def test_default_pools() -> None:
    dev = _driver.call("cuDeviceGet", 0)
    default = _driver.call("cuDeviceGetDefaultMemPool", dev)
    assert int(default) != 0
    assert int(_driver.call("cuDeviceGetMemPool", dev)) == int(default)
    expect(BAD_DEVICE, "cuDeviceGetDefaultMemPool", BAD_DEVICE_ORDINAL)
    expect(INVALID, "cuMemPoolDestroy", default)
    expect(INVALID, "cuMemPoolDestroy", 0)
    pinned = T.CU_MEM_ALLOCATION_TYPE_PINNED
    dev_loc = location(L.CU_MEM_LOCATION_TYPE_DEVICE, 0)
    for api in ("cuMemGetDefaultMemPool", "cuMemGetMemPool"):
        assert int(_driver.call(api, dev_loc, pinned)) == int(default)
        host = _driver.call(api, location(L.CU_MEM_LOCATION_TYPE_HOST), pinned)
        assert int(host) not in (0, int(default))
        managed = _driver.call(api, location(L.CU_MEM_LOCATION_TYPE_NONE),
                               T.CU_MEM_ALLOCATION_TYPE_MANAGED)
        assert int(managed) not in (0, int(default))
        expect(INVALID, api, location(L.CU_MEM_LOCATION_TYPE_DEVICE, BAD_DEVICE_ORDINAL), pinned)
    for attr in (A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, A.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                 A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT):
        assert get(default, attr) == 0
    set_threshold(default, MiB)
    try:
        assert get(default, A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == MiB
    finally:
        set_threshold(default, 0)


# -- allocation misuse -----------------------------------------------------------------------


def test_alloc_misuse(pool: Any, stream: Any) -> None:
    zero = _driver.call("cuMemAllocFromPoolAsync", 0, pool, stream)
    _driver.call("cuMemFreeAsync", zero, stream)
    expect(OOM, "cuMemAllocFromPoolAsync", 1 << 60, pool, stream)
    expect(INVALID, "cuMemAllocFromPoolAsync", MiB, 0, stream)
    for special in (1, 2):  # CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
        p = _driver.call("cuMemAllocFromPoolAsync", MiB, pool, special)
        _driver.call("cuMemFreeAsync", p, special)
    for n in (0, MiB):
        p = _driver.call("cuMemAllocAsync", n, stream)
        _driver.call("cuMemFreeAsync", p, stream)
    _driver.call("cuMemFreeAsync", 0, stream)
    expect(INVALID, "cuMemFreeAsync", 0x1234000, stream)
    _driver.call("cuMemPoolTrimTo", pool, 0)
    _driver.call("cuMemPoolTrimTo", pool, 1 << 62)
    expect(INVALID, "cuMemPoolTrimTo", 0, 0)


def test_max_size(stream: Any) -> None:
    handle = make_pool(props(max_size=64 * MiB))
    try:
        big = _driver.call("cuMemAllocFromPoolAsync", 64 * MiB, handle, stream)
        expect(OOM, "cuMemAllocFromPoolAsync", 1, handle, stream)
        _driver.call("cuMemFreeAsync", big, stream)
        _driver.call("cuStreamSynchronize", stream)
        expect(OOM, "cuMemAllocFromPoolAsync", 100 * MiB, handle, stream)
    finally:
        _driver.call("cuMemPoolDestroy", handle)


def test_free_twice_and_interior(pool: Any, stream: Any) -> None:
    p = _driver.call("cuMemAllocFromPoolAsync", MiB, pool, stream)
    expect(INVALID, "cuMemFreeAsync", int(p) + 256, stream)
    _driver.call("cuMemFreeAsync", p, stream)
    expect(INVALID, "cuMemFreeAsync", p, stream)
    _driver.call("cuStreamSynchronize", stream)
    expect(INVALID, "cuMemFreeAsync", p, stream)


def test_free_async_of_cumemalloc_memory(stream: Any) -> None:
    p = _driver.call("cuMemAlloc", MiB)
    _driver.call("cuMemFreeAsync", p, stream)
    _driver.call("cuStreamSynchronize", stream)
    expect(INVALID, "cuMemFree", p)
    expect((cm.CudaError, R.CUDA_ERROR_NOT_FOUND), "cuMemGetAddressRange", p)


def test_destroy_with_live_allocation(stream: Any) -> None:
    handle = make_pool()
    p = _driver.call("cuMemAllocFromPoolAsync", MiB, handle, stream)
    _driver.call("cuMemPoolDestroy", handle)
    expect(INVALID, "cuMemAllocFromPoolAsync", MiB, handle, stream)
    expect(INVALID, "cuMemPoolGetAttribute", handle, A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    expect(INVALID, "cuMemPoolDestroy", handle)
    _driver.call("cuMemsetD8Async", p, 9, MiB, stream)
    out = np.zeros(4, np.uint8)
    _driver.call("cuStreamSynchronize", stream)
    _driver.call("cuMemcpyDtoH", out, p, 4)
    assert out.tolist() == [9, 9, 9, 9]
    _driver.call("cuMemFreeAsync", p, stream)
    _driver.call("cuStreamSynchronize", stream)


# -- attributes -----------------------------------------------------------------------------


def test_attribute_defaults_and_setters(pool: Any) -> None:
    for attr in (A.CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
                 A.CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
                 A.CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES):
        assert get(pool, attr) == 1
        _driver.call("cuMemPoolSetAttribute", pool, attr, 0)
        assert get(pool, attr) == 0
        _driver.call("cuMemPoolSetAttribute", pool, attr, 2)
        assert get(pool, attr) == 1
        _driver.call("cuMemPoolSetAttribute", pool, attr, True)
    assert stats(pool) == (0, 0, 0, 0)
    set_threshold(pool, U64_MAX)
    assert get(pool, A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == U64_MAX
    set_threshold(pool, 0)
    zero = cu.cuuint64_t(0)
    for attr in (A.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT):
        expect(INVALID, "cuMemPoolSetAttribute", pool, attr, zero)
    expect(INVALID, "cuMemPoolSetAttribute", pool, A.CU_MEMPOOL_ATTR_USED_MEM_HIGH,
           cu.cuuint64_t(5))
    for attr in (A.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, A.CU_MEMPOOL_ATTR_USED_MEM_HIGH):
        _driver.call("cuMemPoolSetAttribute", pool, attr, zero)
    expect(INVALID, "cuMemPoolGetAttribute", 0, A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)


def test_attribute_argument_types_are_checked_by_the_bindings(pool: Any) -> None:
    with pytest.raises(AttributeError, match="'int' object has no attribute 'getPtr'"):
        _driver.call("cuMemPoolSetAttribute", pool, A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, 5)
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'getPtr'"):
        _driver.call("cuMemPoolSetAttribute", pool, A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, None)
    with pytest.raises(AttributeError, match="'int' object has no attribute 'value'"):
        _driver.call("cuMemPoolGetAttribute", pool, 99)


# -- statistics: the chunk pattern ------------------------------------------------------------

SIZES = (KiB, MiB, 3 * MiB, 33 * MiB, 100 * MiB)
OFFSETS = (0, 1024, 1049600, 4195328, 38798336)
RESERVED = (CHUNK, CHUNK, CHUNK, 2 * CHUNK, 5 * CHUNK)
USED = (1024, 1049600, 4195328, 38798336, 143655936)


def grow(handle: Any, stream: Any, sizes: tuple[int, ...] = SIZES,
         offsets: bool = True) -> list[Any]:
    ptrs = []
    for i, n in enumerate(sizes):
        ptrs.append(_driver.call("cuMemAllocFromPoolAsync", n, handle, stream))
        _driver.call("cuStreamSynchronize", stream)
        if offsets:
            assert int(ptrs[-1]) - int(ptrs[0]) == OFFSETS[i]
        assert stats(handle) == (RESERVED[i], RESERVED[i], USED[i], USED[i])
    return ptrs


@pytest.mark.parametrize("where,threshold", [
    ("device", 0), ("device", U64_MAX), ("host", 0), ("host", U64_MAX)])
def test_stats_follow_the_chunk_pattern(where: str, threshold: int, stream: Any) -> None:
    p = props(L.CU_MEM_LOCATION_TYPE_HOST) if where == "host" else props()
    handle = make_pool(p)
    try:
        set_threshold(handle, threshold)
        ptrs = grow(handle, stream, offsets=where == "device")
        for i in (3, 0):  # free 33 MiB, then 1 KiB: no chunk becomes idle
            _driver.call("cuMemFreeAsync", ptrs.pop(i), stream)
        assert stats(handle)[2] == 109051904  # used drops at the free
        _driver.call("cuStreamSynchronize", stream)
        _driver.call("cuMemPoolTrimTo", handle, 0)
        assert stats(handle) == (5 * CHUNK, 5 * CHUNK, 109051904, 143655936)
        for attr in (A.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, A.CU_MEMPOOL_ATTR_USED_MEM_HIGH):
            _driver.call("cuMemPoolSetAttribute", handle, attr, cu.cuuint64_t(0))
        assert stats(handle) == (5 * CHUNK, 5 * CHUNK, 109051904, 109051904)
        again = _driver.call("cuMemAllocFromPoolAsync", KiB, handle, stream)
        if where == "device":
            assert int(again) == int(ptrs[0]) - 1024  # first fit: offset 0 again
        ptrs.append(again)
        assert stats(handle)[2:] == (109052928, 109052928)
        for q in ptrs:
            _driver.call("cuMemFreeAsync", q, stream)
        assert stats(handle)[2] == 0
        _driver.call("cuStreamSynchronize", stream)
        assert stats(handle)[0] == (0 if threshold == 0 else 5 * CHUNK)
        _driver.call("cuMemPoolTrimTo", handle, 0)
        assert stats(handle) == (0, 5 * CHUNK, 0, 109052928)
    finally:
        _driver.call("cuMemPoolDestroy", handle)


def test_trim_releases_idle_chunks_within_max_size(stream: Any) -> None:
    handle = make_pool(props(max_size=64 * MiB))
    try:
        set_threshold(handle, U64_MAX)
        ptrs = grow(handle, stream, SIZES[:4])
        expect(OOM, "cuMemAllocFromPoolAsync", 100 * MiB, handle, stream)
        for i in (3, 0):
            _driver.call("cuMemFreeAsync", ptrs.pop(i), stream)
        _driver.call("cuStreamSynchronize", stream)
        assert stats(handle) == (2 * CHUNK, 2 * CHUNK, 4194304, 38798336)
        _driver.call("cuMemPoolTrimTo", handle, 0)  # the second chunk is idle now
        assert stats(handle) == (CHUNK, 2 * CHUNK, 4194304, 38798336)
        for q in ptrs:
            _driver.call("cuMemFreeAsync", q, stream)
        _driver.call("cuStreamSynchronize", stream)
        assert stats(handle)[0] == CHUNK  # threshold UINT64_MAX keeps it
        _driver.call("cuMemPoolTrimTo", handle, 0)
        assert stats(handle)[0] == 0
    finally:
        _driver.call("cuMemPoolDestroy", handle)


def test_default_pool_returns_memory_at_sync(stream: Any) -> None:
    dev = _driver.call("cuDeviceGet", 0)
    default = _driver.call("cuDeviceGetDefaultMemPool", dev)
    p = _driver.call("cuMemAllocAsync", 8 * MiB, stream)
    _driver.call("cuStreamSynchronize", stream)
    assert stats(default)[0::2] == (CHUNK, 8 * MiB)
    _driver.call("cuMemFreeAsync", p, stream)
    _driver.call("cuStreamSynchronize", stream)
    assert stats(default)[0::2] == (0, 0)


# -- access ------------------------------------------------------------------------------------


def test_access_rules(pool: Any) -> None:
    dev0 = location(L.CU_MEM_LOCATION_TYPE_DEVICE, 0)
    flags = _driver.call("cuMemPoolGetAccess", pool, dev0)
    assert isinstance(flags, F) and int(flags) == 3
    assert int(_driver.call("cuMemPoolGetAccess", pool,
                            location(L.CU_MEM_LOCATION_TYPE_HOST))) == 0
    expect(INVALID, "cuMemPoolGetAccess", pool,
           location(L.CU_MEM_LOCATION_TYPE_DEVICE, BAD_DEVICE_ORDINAL))
    _driver.call("cuMemPoolSetAccess", pool, [desc(0)], 1)
    _driver.call("cuMemPoolSetAccess", pool, [desc(0), desc(0)], 2)
    expect(BAD_DEVICE, "cuMemPoolSetAccess", pool, [desc(0, F.CU_MEM_ACCESS_FLAGS_PROT_NONE)], 1)
    expect(NOT_SUPPORTED, "cuMemPoolSetAccess", pool,
           [desc(0, F.CU_MEM_ACCESS_FLAGS_PROT_READ)], 1)
    expect(BAD_DEVICE, "cuMemPoolSetAccess", pool, [desc(BAD_DEVICE_ORDINAL)], 1)
    expect(NOT_SUPPORTED, "cuMemPoolSetAccess", pool,
           [desc(0, kind=L.CU_MEM_LOCATION_TYPE_HOST)], 1)
    expect(INVALID, "cuMemPoolSetAccess", pool, [], 0)
    assert int(_driver.call("cuMemPoolGetAccess", pool, dev0)) == 3
    default = _driver.call("cuDeviceGetDefaultMemPool", _driver.call("cuDeviceGet", 0))
    assert int(_driver.call("cuMemPoolGetAccess", default, dev0)) == 3


def test_host_pool_access() -> None:
    handle = make_pool(props(L.CU_MEM_LOCATION_TYPE_HOST))
    try:
        dev0 = location(L.CU_MEM_LOCATION_TYPE_DEVICE, 0)
        assert int(_driver.call("cuMemPoolGetAccess", handle, dev0)) == 0
        assert int(_driver.call("cuMemPoolGetAccess", handle,
                                location(L.CU_MEM_LOCATION_TYPE_HOST))) == 3
        _driver.call("cuMemPoolSetAccess", handle, [desc(0)], 1)
        assert int(_driver.call("cuMemPoolGetAccess", handle, dev0)) == 3
    finally:
        _driver.call("cuMemPoolDestroy", handle)


def test_host_pool_memory_has_no_mapped_device_pointer(stream: Any) -> None:
    """``cuMemHostGetDevicePointer`` is for cuMemHostAlloc / registered memory: the H100
    answers INVALID_VALUE for pinned pool memory, with or without device access."""
    handle = make_pool(props(L.CU_MEM_LOCATION_TYPE_HOST))
    try:
        ptr = _driver.call("cuMemAllocFromPoolAsync", 4096, handle, stream)
        _driver.call("cuStreamSynchronize", stream)
        expect(INVALID, "cuMemHostGetDevicePointer", int(ptr), 0)
        _driver.call("cuMemPoolSetAccess", handle, [desc(0)], 1)
        expect(INVALID, "cuMemHostGetDevicePointer", int(ptr), 0)
        _driver.call("cuMemFreeAsync", ptr, stream)
        _driver.call("cuStreamSynchronize", stream)
    finally:
        _driver.call("cuMemPoolDestroy", handle)


def test_peer_access_default_none(two_devices: None) -> None:
    handle = make_pool(props(ident=1))
    try:
        dev0 = location(L.CU_MEM_LOCATION_TYPE_DEVICE, 0)
        assert int(_driver.call("cuMemPoolGetAccess", handle, dev0)) == 0
        _driver.call("cuMemPoolSetAccess", handle, [desc(0)], 1)
        assert int(_driver.call("cuMemPoolGetAccess", handle, dev0)) == 3
        _driver.call("cuMemPoolSetAccess", handle, [desc(0, F.CU_MEM_ACCESS_FLAGS_PROT_NONE)], 1)
        assert int(_driver.call("cuMemPoolGetAccess", handle, dev0)) == 0
    finally:
        _driver.call("cuMemPoolDestroy", handle)


# -- IPC -----------------------------------------------------------------------------------------

POSIX = H.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


def closed_fd() -> int:
    fd = os.open(os.devnull, os.O_RDONLY)
    os.close(fd)
    return fd


def blob(data: bytes) -> cu.CUmemPoolPtrExportData:
    d = cu.CUmemPoolPtrExportData()
    ctypes.memmove(d.getPtr(), data, 64)
    return d


def test_ipc_rules(pool: Any, stream: Any) -> None:
    default = _driver.call("cuDeviceGetDefaultMemPool", _driver.call("cuDeviceGet", 0))
    expect(INVALID, "cuMemPoolExportToShareableHandle", default, POSIX, 0)
    expect(INVALID, "cuMemPoolExportToShareableHandle", pool, POSIX, 0)
    ipc = make_pool(props(handles=1))
    plain_ptr = _driver.call("cuMemAllocFromPoolAsync", MiB, pool, stream)
    ipc_ptr = _driver.call("cuMemAllocFromPoolAsync", MiB, ipc, stream)
    dev_ptr = _driver.call("cuMemAlloc", MiB)
    try:
        expect(INVALID, "cuMemPoolExportToShareableHandle", ipc,
               H.CU_MEM_HANDLE_TYPE_NONE, 0)
        expect(INVALID, "cuMemPoolExportToShareableHandle", ipc, POSIX, 1)
        fd = int(_driver.call("cuMemPoolExportToShareableHandle", ipc, POSIX, 0))
        try:
            imported = _driver.call("cuMemPoolImportFromShareableHandle", fd, POSIX, 0)
        finally:
            os.close(fd)
        assert int(imported) != int(ipc)
        expect(INVALID, "cuMemAllocFromPoolAsync", MiB, imported, stream)
        for attr in (A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT):
            expect(INVALID, "cuMemPoolGetAttribute", imported, attr)
        _driver.call("cuMemPoolDestroy", imported)
        expect(INVALID, "cuMemPoolExportPointer", dev_ptr)
        expect(INVALID, "cuMemPoolExportPointer", plain_ptr)
        data = _driver.call("cuMemPoolExportPointer", ipc_ptr)
        assert isinstance(data, cu.CUmemPoolPtrExportData)
        expect(INVALID, "cuMemPoolImportPointer", ipc, data)  # into its own pool
        for junk in (b"\xab" * 64, bytes(64)):
            expect(INVALID, "cuMemPoolImportPointer", ipc, blob(junk))
        expect(INVALID, "cuMemPoolImportPointer", pool, blob(b"\xab" * 64))
        expect(UNKNOWN, "cuMemPoolImportFromShareableHandle", closed_fd(), POSIX, 0)
    finally:
        _driver.call("cuMemFree", dev_ptr)
        _driver.call("cuMemFreeAsync", ipc_ptr, stream)
        _driver.call("cuMemFreeAsync", plain_ptr, stream)
        _driver.call("cuStreamSynchronize", stream)
        _driver.call("cuMemPoolDestroy", ipc)


# -- GPU run 4: answers the simulator first got wrong ----------------------------------


def test_cumemfree_releases_a_pool_allocation() -> None:
    from cuda_memkit._core._context import ensure_context

    ensure_context(0)
    with cm.MemoryPool(0) as pool:
        stream = _driver.call("cuStreamCreate", 1)
        ptr = _driver.call("cuMemAllocFromPoolAsync", 1 << 20, pool._cu, stream)
        _driver.call("cuStreamSynchronize", stream)
        assert _driver.call("cuMemFree", ptr) is None
        _driver.call("cuStreamSynchronize", stream)
        stats = pool.stats()
        # GPU run 5: the memory goes back (nothing reserved any more), but the
        # driver does not count the free in USED_MEM_CURRENT.
        assert int(stats.reserved_current) == 0
        assert int(stats.used_current) == 1 << 20
        _driver.call("cuStreamDestroy", stream)
        pool.close(force=True)


def test_pointer_export_needs_the_pool_exported_first() -> None:
    from cuda_memkit._core._context import ensure_context

    ensure_context(0)
    with cm.MemoryPool(0, ipc=True) as pool:
        stream = _driver.call("cuStreamCreate", 1)
        ptr = _driver.call("cuMemAllocFromPoolAsync", 1 << 20, pool._cu, stream)
        _driver.call("cuStreamSynchronize", stream)
        try:
            # GPU run 5: exporting a pointer of a never-exported pool is refused.
            with pytest.raises(cm.CudaInvalidValueError):
                _driver.call("cuMemPoolExportPointer", ptr)
            fd = pool.export()
            os.close(fd)
            data = _driver.call("cuMemPoolExportPointer", ptr)
            assert len(ctypes.string_at(data.getPtr(), 64)) == 64
        finally:
            _driver.call("cuMemFreeAsync", ptr, stream)
            _driver.call("cuStreamSynchronize", stream)
            _driver.call("cuStreamDestroy", stream)


def test_memset_of_pinned_pool_memory_is_refused() -> None:
    from cuda_memkit._core._context import ensure_context

    ensure_context(0)
    with cm.MemoryPool(0, location=cm.Location.host()) as pool:
        stream = _driver.call("cuStreamCreate", 1)
        ptr = _driver.call("cuMemAllocFromPoolAsync", 4096, pool._cu, stream)
        _driver.call("cuStreamSynchronize", stream)
        try:
            with pytest.raises(cm.CudaInvalidValueError):
                _driver.call("cuMemsetD8Async", ptr, 1, 4096, stream)
        finally:
            _driver.call("cuMemFreeAsync", ptr, stream)
            _driver.call("cuStreamSynchronize", stream)
            _driver.call("cuStreamDestroy", stream)


def test_copy_of_another_devices_pool_memory_needs_access(two_devices: None) -> None:
    # Two H200s, 2026-11-26: cuMemcpy from device 1's pool memory in device 0's context is
    # INVALID_VALUE until the pool grants device 0 access; then it copies.
    handle = make_pool(props(ident=1))
    try:
        ptr = int(in_fresh_thread(lambda: _on_device1(lambda: _driver.call(
            "cuMemAllocFromPoolAsync", MiB, handle, None))))
        try:
            host = np.zeros(MiB, np.uint8)
            expect_error(cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE, "cuMemcpy",
                         host.ctypes.data, ptr, MiB)
            _driver.call("cuMemPoolSetAccess", handle, [desc(0)], 1)
            _driver.call("cuMemcpy", host.ctypes.data, ptr, MiB)
        finally:
            in_fresh_thread(lambda: _on_device1(lambda: _driver.call(
                "cuMemFreeAsync", ptr, None)))
    finally:
        _driver.call("cuMemPoolDestroy", handle)


def _on_device1(fn: Any) -> Any:
    """``fn()`` with device 1's primary context current (then none), synchronized."""
    c1 = _driver.call("cuDevicePrimaryCtxRetain", cu.CUdevice(1))
    try:
        _driver.call("cuCtxSetCurrent", c1)
        out = fn()
        _driver.call("cuCtxSynchronize")
        return out
    finally:
        _driver.call("cuCtxSetCurrent", None)
        _driver.call("cuDevicePrimaryCtxRelease", cu.CUdevice(1))


def test_an_imported_pool_answers_its_own_devices_access() -> None:
    # F_imported_pool_access (one H200): an ipc pool of device 0 imported in the same
    # process answers READWRITE for device 0, though it answers no attribute query; the
    # imported pool's device is read from it.
    ipc = make_pool(props(handles=1))
    try:
        fd = int(_driver.call("cuMemPoolExportToShareableHandle", ipc, POSIX, 0))
        try:
            imported = _driver.call("cuMemPoolImportFromShareableHandle", fd, POSIX, 0)
        finally:
            os.close(fd)
        try:
            flags = _driver.call("cuMemPoolGetAccess", imported,
                                 location(L.CU_MEM_LOCATION_TYPE_DEVICE, 0))
            assert flags == cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        finally:
            _driver.call("cuMemPoolDestroy", imported)
    finally:
        _driver.call("cuMemPoolDestroy", ipc)
