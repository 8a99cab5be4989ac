"""VMM driver semantics through the gateway: exact class and CUresult.

Expected answers are the H100's (``h100_probe.json``, section D). They run on
whichever backend is active; the simulator must agree.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit._core import _driver
from cuda_memkit._core._context import ensure_context

from ._helpers import Undo, expect

R = cu.CUresult
MiB = 1 << 20
G = 2 * MiB
POSIX_FD = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
RW = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
MIN = cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
REC = cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED

# What the H100 returns (h100_probe.json, section D): (class, code).
INVALID = (cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE)
NOT_SUPPORTED = (cm.CudaNotSupportedError, R.CUDA_ERROR_NOT_SUPPORTED)
BAD_DEVICE = (cm.CudaInvalidDeviceError, R.CUDA_ERROR_INVALID_DEVICE)
OOM = (cm.CudaOutOfMemoryError, R.CUDA_ERROR_OUT_OF_MEMORY)
UNKNOWN = (cm.CudaError, R.CUDA_ERROR_UNKNOWN)
DOUBLE_MAP = INVALID
PARTIAL_MAP = NOT_SUPPORTED  # an offset, or a size other than the allocation's
FREE_WHILE_MAPPED = INVALID
ACCESS_UNMAPPED = INVALID
NO_ACCESS_COPY = INVALID  # a refused copy, not a fault: the context survives
EXPORT_WITHOUT_TYPE = INVALID
IMPORT_BAD_FD = UNKNOWN  # closed, never opened, or not an export


def loc(ordinal: int = 0) -> cu.CUmemLocation:
    return cm.Location(cm.LocationType.DEVICE, ordinal).to_cu()


def prop_at(where: cm.Location, handle_types: int = 0) -> cu.CUmemAllocationProp:
    p = cu.CUmemAllocationProp()
    p.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    p.location = where.to_cu()
    p.requestedHandleTypes = cu.CUmemAllocationHandleType(handle_types)
    return p


def prop(ordinal: int = 0, handle_types: int = 0) -> cu.CUmemAllocationProp:
    return prop_at(cm.Location(cm.LocationType.DEVICE, ordinal), handle_types)


def desc_at(where: cm.Location, flags: Any = RW) -> cu.CUmemAccessDesc:
    d = cu.CUmemAccessDesc()
    d.location = where.to_cu()
    d.flags = flags
    return d


def desc(ordinal: int = 0, flags: Any = RW) -> cu.CUmemAccessDesc:
    return desc_at(cm.Location(cm.LocationType.DEVICE, ordinal), flags)


@pytest.fixture
def undo() -> Iterator[Undo]:
    ensure_context(0)
    u = Undo()
    yield u
    u.run()


def reserve(undo: Undo, size: int, alignment: int = 0, hint: int = 0) -> int:
    va = int(_driver.call("cuMemAddressReserve", size, alignment, hint, 0))
    undo("cuMemAddressFree", va, size)
    return va


def create(undo: Undo, size: int, p: cu.CUmemAllocationProp | None = None) -> int:
    h = int(_driver.call("cuMemCreate", size, p or prop(), 0))
    undo("cuMemRelease", h)
    return h


def mapped(undo: Undo, va: int, size: int, h: int) -> None:
    _driver.call("cuMemMap", va, size, 0, h, 0)
    undo("cuMemUnmap", va, size)


# -- granularity ---------------------------------------------------------------------


@pytest.mark.parametrize("option", [MIN, REC])
@pytest.mark.parametrize("handle_types", [0, int(POSIX_FD)])
def test_granularity_is_2mib(undo: Undo, option: Any, handle_types: int) -> None:
    assert int(_driver.call("cuMemGetAllocationGranularity", prop(0, handle_types), option)) == G


def test_granularity_checks_nothing_but_the_option(undo: Undo) -> None:
    odd = [prop(7), prop(0, int(cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_FABRIC))]
    bad_type = prop()
    bad_type.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_INVALID
    bad_loc = prop()
    bad_loc.location = cm.Location.host_numa_current().to_cu()
    for p in [*odd, bad_type, bad_loc, prop_at(cm.Location.host())]:
        assert int(_driver.call("cuMemGetAllocationGranularity", p, MIN)) == G
    assert int(_driver.call("cuMemGetAllocationGranularity", prop(), 0)) == G
    expect(INVALID, "cuMemGetAllocationGranularity", prop(), 2)


# -- reservations ----------------------------------------------------------------------


@pytest.mark.parametrize(("size", "alignment", "flags"), [
    (0, 0, 0), (4096, 0, 0), (G + 4096, 0, 0), (G, 3, 0), (G, 0, 1),
])
def test_reserve_bad_arguments(undo: Undo, size: int, alignment: int, flags: int) -> None:
    expect(INVALID, "cuMemAddressReserve", size, alignment, 0, flags)


def test_reserve_too_large(undo: Undo) -> None:
    expect(OOM, "cuMemAddressReserve", 1 << 60, 0, 0, 0)


def test_reserve_alignment(undo: Undo) -> None:
    assert reserve(undo, 4 * G) % G == 0
    assert reserve(undo, G, 4096) % G == 0  # small alignments still give 2 MiB
    assert reserve(undo, G, 1 << 30) % (1 << 30) == 0


def test_free_misuse(undo: Undo) -> None:
    va = int(_driver.call("cuMemAddressReserve", 2 * G, 0, 0, 0))
    expect(INVALID, "cuMemAddressFree", va, G)
    expect(INVALID, "cuMemAddressFree", va + G, G)
    _driver.call("cuMemAddressFree", va, 2 * G)
    expect(INVALID, "cuMemAddressFree", va, 2 * G)
    expect(INVALID, "cuMemAddressFree", 0x1234000, G)
    expect(INVALID, "cuMemAddressFree", 0, 0)


def test_reserve_and_cumemalloc_do_not_mix(undo: Undo) -> None:
    va = reserve(undo, G)
    p = int(_driver.call("cuMemAlloc", G))
    undo("cuMemFree", p)
    expect(INVALID, "cuMemAddressFree", p, G)
    expect(INVALID, "cuMemFree", va)


def test_reserve_hint(undo: Undo) -> None:
    va = reserve(undo, 4 * G)
    moved = reserve(undo, 2 * G, 0, va)  # a taken hint is not an error: placed elsewhere
    assert moved != va
    expect(INVALID, "cuMemAddressReserve", 2 * G, 0, va + MiB, 0)  # unaligned hint


# -- physical memory ----------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 4096, G + 4096])
def test_create_bad_size(undo: Undo, size: int) -> None:
    expect(INVALID, "cuMemCreate", size, prop(), 0)


def test_create_bad_properties(undo: Undo) -> None:
    expect(BAD_DEVICE, "cuMemCreate", G, prop(7), 0)
    expect(INVALID, "cuMemCreate", G, prop(), 1)
    managed = prop()
    managed.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_MANAGED
    expect(INVALID, "cuMemCreate", G, managed, 0)
    expect(INVALID, "cuMemCreate", G, prop_at(cm.Location.host_numa_current()), 0)
    fabric = int(cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_FABRIC)
    expect((cm.CudaNotPermittedError, R.CUDA_ERROR_NOT_PERMITTED), "cuMemCreate", G,
           prop(0, fabric), 0)


def test_create_out_of_memory(undo: Undo) -> None:
    expect(OOM, "cuMemCreate", 1 << 50, prop(), 0)


def test_create_counts_against_device_memory(undo: Undo) -> None:
    free0, _ = _driver.call("cuMemGetInfo")
    create(undo, 64 * MiB)
    free1, _ = _driver.call("cuMemGetInfo")
    assert free0 - free1 >= 64 * MiB


@pytest.mark.parametrize("where", [cm.Location.host(), cm.Location.host_numa(0)])
def test_create_host_memory_is_numa_located(undo: Undo, where: cm.Location) -> None:
    h = create(undo, G, prop_at(where))
    p = _driver.call("cuMemGetAllocationPropertiesFromHandle", h)
    assert int(p.location.type) == int(cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST_NUMA)
    assert int(p.location.id) == 0


def test_properties_from_handle(undo: Undo) -> None:
    h = create(undo, G, prop(0, int(POSIX_FD)))
    p = _driver.call("cuMemGetAllocationPropertiesFromHandle", h)
    assert int(p.type) == int(cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED)
    assert int(p.location.type) == int(cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE)
    assert int(p.location.id) == 0
    assert int(p.requestedHandleTypes) == int(POSIX_FD)
    expect(INVALID, "cuMemGetAllocationPropertiesFromHandle", 0)
    expect(INVALID, "cuMemRelease", 0)


# -- map / unmap ------------------------------------------------------------------------------


def test_map_misuse(undo: Undo) -> None:
    va = reserve(undo, 8 * G)
    h = create(undo, G)
    h2 = create(undo, 2 * G)
    expect(PARTIAL_MAP, "cuMemMap", va, G, 4096, h, 0)
    expect(PARTIAL_MAP, "cuMemMap", va, G, G, h2, 0)
    expect(PARTIAL_MAP, "cuMemMap", va, 2 * G, 0, h, 0)  # larger than the allocation
    expect(PARTIAL_MAP, "cuMemMap", va, 4096, 0, h, 0)
    expect(INVALID, "cuMemMap", va + 4096, G, 0, h, 0)
    expect(INVALID, "cuMemMap", va, G, 0, h, 1)
    expect(INVALID, "cuMemMap", va, G, 0, 0, 0)
    expect(INVALID, "cuMemMap", 0x1234000000, G, 0, h, 0)  # not reserved
    mapped(undo, va, G, h)
    expect(DOUBLE_MAP, "cuMemMap", va, G, 0, h, 0)
    expect(DOUBLE_MAP, "cuMemMap", va, 2 * G, 0, h2, 0)
    expect(INVALID, "cuMemFree", va)


def test_same_handle_mapped_twice(undo: Undo) -> None:
    va = reserve(undo, 2 * G)
    h = create(undo, G)
    mapped(undo, va, G, h)
    mapped(undo, va + G, G, h)
    _driver.call("cuMemSetAccess", va, 2 * G, [desc()], 1)
    _driver.call("cuMemsetD8", va, 0x21, 16)
    out = np.zeros(16, np.uint8)
    _driver.call("cuMemcpyDtoH", out, va + G, 16)
    assert (out == 0x21).all()


def test_unmap(undo: Undo) -> None:
    va = reserve(undo, 8 * G)
    h = create(undo, G)
    _driver.call("cuMemUnmap", va, G)  # nothing mapped there: not an error
    mapped(undo, va, G, h)
    _driver.call("cuMemUnmap", va + 4 * G, G)
    expect(INVALID, "cuMemUnmap", va + 4096, G)
    expect(INVALID, "cuMemUnmap", va, 4096)  # part of a mapping
    expect(INVALID, "cuMemUnmap", 0x1234000000, G)  # not reserved


def test_free_while_mapped(undo: Undo) -> None:
    va = reserve(undo, 2 * G)
    h = create(undo, G)
    mapped(undo, va, G, h)
    expect(FREE_WHILE_MAPPED, "cuMemAddressFree", va, 2 * G)


def test_release_while_mapped_defers(undo: Undo) -> None:
    va = reserve(undo, 2 * G)
    h = int(_driver.call("cuMemCreate", G, prop(), 0))
    _driver.call("cuMemMap", va, G, 0, h, 0)
    _driver.call("cuMemSetAccess", va, G, [desc()], 1)
    _driver.call("cuMemRelease", h)  # succeeds: the memory lives until unmapped
    _driver.call("cuMemsetD8", va, 0x4D, G)
    out = np.zeros(16, np.uint8)
    _driver.call("cuMemcpyDtoH", out, va, 16)
    assert (out == 0x4D).all()
    again = int(_driver.call("cuMemRetainAllocationHandle", va))
    assert again == h  # the same handle value comes back
    _driver.call("cuMemRelease", again)
    expect(INVALID, "cuMemRelease", h)
    _driver.call("cuMemUnmap", va, G)
    _driver.call("cuMemUnmap", va, G)  # twice: still not an error


def test_unmap_returns_memory(undo: Undo) -> None:
    va = reserve(undo, 32 * MiB)
    free0, _ = _driver.call("cuMemGetInfo")
    h = int(_driver.call("cuMemCreate", 32 * MiB, prop(), 0))
    _driver.call("cuMemMap", va, 32 * MiB, 0, h, 0)
    _driver.call("cuMemRelease", h)
    free1, _ = _driver.call("cuMemGetInfo")
    _driver.call("cuMemUnmap", va, 32 * MiB)
    free2, _ = _driver.call("cuMemGetInfo")
    assert free0 - free1 >= 32 * MiB
    assert free2 - free1 >= 32 * MiB - (4 << 20)


def test_address_range_of_a_mapping(undo: Undo) -> None:
    va = reserve(undo, 8 * G)
    mapped(undo, va, G, create(undo, G))
    # GPU run 2: without access the driver does not find the mapping at all.
    with pytest.raises(cm.CudaError) as info:
        _driver.call("cuMemGetAddressRange", va + 100)
    assert info.value.code == int(cu.CUresult.CUDA_ERROR_NOT_FOUND)
    _driver.call("cuMemSetAccess", va, G, [desc()], 1)
    base, size = _driver.call("cuMemGetAddressRange", va + 100)
    assert int(base) == va and int(size) == G


# -- access ---------------------------------------------------------------------------------------


def test_access_flags(undo: Undo) -> None:
    va = reserve(undo, 4 * G)
    mapped(undo, va, G, create(undo, G))
    mapped(undo, va + G, G, create(undo, G))
    assert int(_driver.call("cuMemGetAccess", loc(0), va)) == 0
    _driver.call("cuMemSetAccess", va, G, [desc(), desc()], 2)  # duplicates are fine
    assert int(_driver.call("cuMemGetAccess", loc(0), va)) == int(RW)
    assert int(_driver.call("cuMemGetAccess", loc(0), va + 4096)) == int(RW)
    assert int(_driver.call("cuMemGetAccess", loc(0), va + G)) == 0  # per mapping
    for flags, want in ((1, 1), (0, 0), (3, 3)):
        _driver.call("cuMemSetAccess", va, G, [desc(0, cu.CUmemAccess_flags(flags))], 1)
        assert int(_driver.call("cuMemGetAccess", loc(0), va)) == want


def test_access_misuse(undo: Undo) -> None:
    va = reserve(undo, 8 * G)
    mapped(undo, va, G, create(undo, G))
    expect(ACCESS_UNMAPPED, "cuMemSetAccess", va + 4 * G, G, [desc()], 1)
    expect(INVALID, "cuMemSetAccess", va, 4 * G, [desc()], 1)  # partly unmapped
    expect(INVALID, "cuMemSetAccess", va, G, [desc(7)], 1)
    expect(INVALID, "cuMemSetAccess", va, G, [], 0)
    expect(NOT_SUPPORTED, "cuMemSetAccess", va, G, [desc_at(cm.Location.host())], 1)
    expect(INVALID, "cuMemGetAccess", loc(0), va + 4 * G)
    expect(BAD_DEVICE, "cuMemGetAccess", loc(7), va)
    # the refused host set changed nothing: the host has no access
    assert int(_driver.call("cuMemGetAccess", cm.Location.host().to_cu(), va)) == 0
    _driver.call("cuMemSetAccess", va, G, [desc()], 1)
    assert int(_driver.call("cuMemGetAccess", loc(0), va)) == int(RW)  # the flags set


def test_get_access_of_cumemalloc_memory(undo: Undo) -> None:
    p = int(_driver.call("cuMemAlloc", G))
    undo("cuMemFree", p)
    _driver.call("cuMemGetAccess", loc(0), p)


def test_no_access_refuses_copies(undo: Undo) -> None:
    va = reserve(undo, G)
    mapped(undo, va, G, create(undo, G))
    expect(NO_ACCESS_COPY, "cuMemsetD8", va, 1, 4096)
    out = np.zeros(16, np.uint8)
    expect(NO_ACCESS_COPY, "cuMemcpyDtoH", out, va, 16)
    _driver.call("cuCtxSynchronize")  # the context is fine
    p = int(_driver.call("cuMemAlloc", 4096))
    _driver.call("cuMemFree", p)


def test_access_spans_adjacent_mappings(undo: Undo) -> None:
    va = reserve(undo, 3 * G)
    for i in range(3):
        mapped(undo, va + i * G, G, create(undo, G))
    _driver.call("cuMemSetAccess", va, 3 * G, [desc()], 1)
    for i in range(3):
        assert int(_driver.call("cuMemGetAccess", loc(0), va + i * G)) == int(RW)
    data = (np.arange(3 * G) % 233).astype(np.uint8)
    _driver.call("cuMemcpyHtoD", va, data, data.nbytes)
    out = np.zeros_like(data)
    _driver.call("cuMemcpyDtoH", out, va, out.nbytes)
    assert (out == data).all()


def test_access_for_two_devices(undo: Undo, two_devices: None) -> None:
    if not cm.Device(0).can_access_peer(1):
        pytest.skip("devices 0 and 1 are not peers")
    va = reserve(undo, G)
    mapped(undo, va, G, create(undo, G))
    _driver.call("cuMemSetAccess", va, G, [desc(0), desc(1)], 2)
    assert int(_driver.call("cuMemGetAccess", loc(1), va)) == int(RW)
    _driver.call("cuMemSetAccess", va, G, [desc(1, cu.CUmemAccess_flags(0))], 1)
    assert int(_driver.call("cuMemGetAccess", loc(1), va)) == 0
    assert int(_driver.call("cuMemGetAccess", loc(0), va)) == int(RW)


# -- handles ------------------------------------------------------------------------------


def test_retain_allocation_handle(undo: Undo) -> None:
    va = reserve(undo, 2 * G)
    h = create(undo, G)
    mapped(undo, va, G, h)
    for addr in (va, va + 4096):
        r = int(_driver.call("cuMemRetainAllocationHandle", addr))
        assert r == h
        _driver.call("cuMemRelease", r)
    expect(INVALID, "cuMemRetainAllocationHandle", va + G)
    p = int(_driver.call("cuMemAlloc", 4096))
    undo("cuMemFree", p)
    expect(INVALID, "cuMemRetainAllocationHandle", p)


def test_export_import(undo: Undo) -> None:
    h = create(undo, G, prop(0, int(POSIX_FD)))
    fd = _driver.call("cuMemExportToShareableHandle", h, POSIX_FD, 0)
    assert type(fd) is int
    try:
        h2 = int(_driver.call("cuMemImportFromShareableHandle", fd, POSIX_FD))
    finally:
        os.close(fd)
    undo("cuMemRelease", h2)
    assert h2 != h
    p = _driver.call("cuMemGetAllocationPropertiesFromHandle", h2)
    assert int(p.location.type) == int(cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE)
    assert int(p.requestedHandleTypes) == 0  # not carried over to the import
    va = reserve(undo, 2 * G)
    mapped(undo, va, G, h)
    mapped(undo, va + G, G, h2)
    _driver.call("cuMemSetAccess", va, 2 * G, [desc()], 1)
    _driver.call("cuMemsetD8", va, 0x6B, 4096)
    out = np.zeros(4, np.uint8)
    _driver.call("cuMemcpyDtoH", out, va + G, 4)
    assert (out == 0x6B).all()


def test_export_misuse(undo: Undo) -> None:
    h_fd = create(undo, G, prop(0, int(POSIX_FD)))
    h = create(undo, G)
    E = "cuMemExportToShareableHandle"
    HT = cu.CUmemAllocationHandleType
    expect(EXPORT_WITHOUT_TYPE, E, h, POSIX_FD, 0)
    expect(INVALID, E, h_fd, HT.CU_MEM_HANDLE_TYPE_NONE, 0)
    expect(INVALID, E, h_fd, HT.CU_MEM_HANDLE_TYPE_FABRIC, 0)
    expect(INVALID, E, h_fd, POSIX_FD, 1)
    expect(INVALID, E, 0, POSIX_FD, 0)


def test_import_misuse(undo: Undo) -> None:
    rd, wr = os.pipe()
    os.close(rd)
    os.close(wr)
    expect(IMPORT_BAD_FD, "cuMemImportFromShareableHandle", rd, POSIX_FD)
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        expect(IMPORT_BAD_FD, "cuMemImportFromShareableHandle", fd, POSIX_FD)
    finally:
        os.close(fd)
    expect(INVALID, "cuMemImportFromShareableHandle", 9999,
           cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE)


def test_vmm_needs_no_context() -> None:
    """Granularity, reserve and create work on a thread without a current context."""
    out: list[Any] = []

    def body() -> None:
        try:
            assert int(_driver.call("cuCtxGetCurrent")) == 0
            out.append(int(_driver.call("cuMemGetAllocationGranularity", prop(), MIN)))
            out.append(int(_driver.call("cuMemAddressReserve", G, 0, 0, 0)))
            out.append(int(_driver.call("cuMemCreate", G, prop(), 0)))
        except BaseException as exc:  # handed back to the test thread
            out.append(exc)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    ensure_context(0)
    done = [x for x in out if not isinstance(x, BaseException)]
    if len(done) == 3:  # clean up here, where there is a context
        _driver.call("cuMemRelease", done[2])
        _driver.call("cuMemAddressFree", done[1], G)
    for item in out:
        if isinstance(item, BaseException):
            raise item
    assert done[0] == G
