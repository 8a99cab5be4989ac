"""VMM driver semantics through the gateway: exact class and CUresult.

Expected answers are the H100's (``h100_probe.json``, section D). They run on
whichever backend is active; the simulator must agree.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit import _driver
from cuda_memkit._device import ensure_context

R = cu.CUresult
MiB = 1 << 20
G = 2 * MiB
POSIX_FD = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
RW = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
MIN = cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
REC = cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED

# What the H100 returns for each misuse (class, code).
INVALID = (cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE)
DOUBLE_MAP = INVALID
UNMAP_UNMAPPED = INVALID
FREE_WHILE_MAPPED = INVALID
ACCESS_UNMAPPED = INVALID
GET_ACCESS_UNMAPPED = INVALID
EXPORT_WITHOUT_TYPE = INVALID
IMPORT_CLOSED_FD = INVALID
IMPORT_FOREIGN_FD = INVALID
BAD_DEVICE = (cm.CudaInvalidDeviceError, R.CUDA_ERROR_INVALID_DEVICE)


def expect(want: tuple[type[cm.CudaError], R], api: str, *args: Any) -> cm.CudaError:
    cls, code = want
    with pytest.raises(cm.CudaError) as info:
        _driver.call(api, *args)
    err = info.value
    assert err.code == int(code), f"{api}: got {err.name}, expected {code.name}"
    assert type(err) is cls
    assert err.api == api
    return err


def loc(ordinal: int = 0) -> cu.CUmemLocation:
    return cm.Location.device(ordinal).to_cu()


def prop(ordinal: int = 0, handle_types: int = 0) -> cu.CUmemAllocationProp:
    p = cu.CUmemAllocationProp()
    p.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    p.location = loc(ordinal)
    p.requestedHandleTypes = cu.CUmemAllocationHandleType(handle_types)
    return p


def desc(ordinal: int = 0, flags: Any = RW) -> cu.CUmemAccessDesc:
    d = cu.CUmemAccessDesc()
    d.location = loc(ordinal)
    d.flags = flags
    return d


class Undo:
    def __init__(self) -> None:
        self.steps: list[tuple[str, tuple[Any, ...]]] = []

    def __call__(self, api: str, *args: Any) -> None:
        self.steps.append((api, args))

    def run(self) -> None:
        for api, args in reversed(self.steps):
            _driver.call(api, *args)
        self.steps.clear()


@pytest.fixture
def undo() -> Iterator[Undo]:
    ensure_context(0)
    u = Undo()
    yield u
    u.run()


def reserve(undo: Undo, size: int) -> int:
    va = int(_driver.call("cuMemAddressReserve", size, 0, 0, 0))
    undo("cuMemAddressFree", va, size)
    return va


def create(undo: Undo, size: int, p: cu.CUmemAllocationProp | None = None) -> int:
    h = int(_driver.call("cuMemCreate", size, p or prop(), 0))
    undo("cuMemRelease", h)
    return h


def mapped(undo: Undo, va: int, size: int, h: int) -> None:
    _driver.call("cuMemMap", va, size, 0, h, 0)
    undo("cuMemUnmap", va, size)


# -- granularity -----------------------------------------------------------------------


@pytest.mark.parametrize("option", [MIN, REC])
@pytest.mark.parametrize("handle_types", [0, int(POSIX_FD)])
def test_granularity_is_2mib(undo: Undo, option: Any, handle_types: int) -> None:
    assert int(_driver.call("cuMemGetAllocationGranularity", prop(0, handle_types), option)) == G


def test_granularity_bad_option(undo: Undo) -> None:
    expect(INVALID, "cuMemGetAllocationGranularity", prop(), 2)


# -- reservations ----------------------------------------------------------------------


def test_reserve_zero(undo: Undo) -> None:
    expect(INVALID, "cuMemAddressReserve", 0, 0, 0, 0)


def test_reserve_alignment_not_power_of_two(undo: Undo) -> None:
    expect(INVALID, "cuMemAddressReserve", G, 3, 0, 0)


def test_reserve_is_granularity_aligned(undo: Undo) -> None:
    va = reserve(undo, 4 * G)
    assert va % G == 0


def test_free_wrong_size_and_twice(undo: Undo) -> None:
    va = int(_driver.call("cuMemAddressReserve", 2 * G, 0, 0, 0))
    expect(INVALID, "cuMemAddressFree", va, G)
    _driver.call("cuMemAddressFree", va, 2 * G)
    expect(INVALID, "cuMemAddressFree", va, 2 * G)


def test_reserve_hint_collision_moves(undo: Undo) -> None:
    va = reserve(undo, 4 * G)
    other = reserve(undo, 2 * G)  # a hint that is taken is not an error
    moved = int(_driver.call("cuMemAddressReserve", 2 * G, 0, va, 0))
    undo("cuMemAddressFree", moved, 2 * G)
    assert moved != va and other != va


# -- physical memory -------------------------------------------------------------------


def test_create_zero(undo: Undo) -> None:
    expect(INVALID, "cuMemCreate", 0, prop(), 0)


def test_create_unaligned(undo: Undo) -> None:
    expect(INVALID, "cuMemCreate", G + 4096, prop(), 0)


def test_create_bad_device(undo: Undo) -> None:
    expect(BAD_DEVICE, "cuMemCreate", G, prop(7), 0)


def test_create_out_of_memory(undo: Undo) -> None:
    expect((cm.CudaOutOfMemoryError, R.CUDA_ERROR_OUT_OF_MEMORY), "cuMemCreate", 1 << 50,
           prop(), 0)


def test_create_counts_against_device_memory(undo: Undo) -> None:
    free0, _ = _driver.call("cuMemGetInfo")
    create(undo, 64 * MiB)
    free1, _ = _driver.call("cuMemGetInfo")
    assert free0 - free1 >= 64 * MiB


def test_properties_from_handle(undo: Undo) -> None:
    h = create(undo, G, prop(0, int(POSIX_FD)))
    p = _driver.call("cuMemGetAllocationPropertiesFromHandle", h)
    assert int(p.type) == int(cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED)
    assert int(p.location.type) == int(cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE)
    assert int(p.location.id) == 0
    assert int(p.requestedHandleTypes) == int(POSIX_FD)


# -- map / unmap -----------------------------------------------------------------------


def test_map_misuse(undo: Undo) -> None:
    va = reserve(undo, 8 * G)
    h = create(undo, G)
    h2 = create(undo, 2 * G)
    expect(INVALID, "cuMemMap", va, G, 4096, h, 0)  # offset must be 0
    expect(INVALID, "cuMemMap", va, 2 * G, 0, h, 0)  # larger than the physical memory
    expect(INVALID, "cuMemMap", va + 4096, G, 0, h, 0)  # unaligned address
    expect(INVALID, "cuMemMap", va + 7 * G, 2 * G, 0, h2, 0)  # past the reservation's end
    mapped(undo, va, G, h)
    expect(DOUBLE_MAP, "cuMemMap", va, G, 0, h, 0)
    expect(DOUBLE_MAP, "cuMemMap", va, 2 * G, 0, h2, 0)


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


def test_unmap_misuse(undo: Undo) -> None:
    va = reserve(undo, 8 * G)
    h = create(undo, G)
    expect(UNMAP_UNMAPPED, "cuMemUnmap", va, G)
    mapped(undo, va, G, h)
    expect(UNMAP_UNMAPPED, "cuMemUnmap", va + 4 * G, G)
    expect(INVALID, "cuMemUnmap", va, 4096)  # part of a mapping


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
    _driver.call("cuMemUnmap", va, G)
    expect(UNMAP_UNMAPPED, "cuMemUnmap", va, G)


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


# -- access ----------------------------------------------------------------------------


def test_access_flags(undo: Undo) -> None:
    va = reserve(undo, 4 * G)
    h = create(undo, G)
    mapped(undo, va, G, h)
    assert int(_driver.call("cuMemGetAccess", loc(0), va)) == 0
    _driver.call("cuMemSetAccess", va, G, [desc()], 1)
    assert int(_driver.call("cuMemGetAccess", loc(0), va)) == int(RW)
    assert int(_driver.call("cuMemGetAccess", loc(0), va + 4096)) == int(RW)
    expect(ACCESS_UNMAPPED, "cuMemSetAccess", va + 2 * G, G, [desc()], 1)
    expect(GET_ACCESS_UNMAPPED, "cuMemGetAccess", loc(0), va + 2 * G)
    expect(INVALID, "cuMemSetAccess", va, 2 * G, [desc()], 1)  # partly unmapped
    expect(BAD_DEVICE, "cuMemSetAccess", va, G, [desc(7)], 1)


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


# -- handles ---------------------------------------------------------------------------


def test_retain_allocation_handle(undo: Undo) -> None:
    va = reserve(undo, 2 * G)
    h = create(undo, G)
    mapped(undo, va, G, h)
    r = int(_driver.call("cuMemRetainAllocationHandle", va + 4096))
    assert r == h
    _driver.call("cuMemRelease", r)
    expect(INVALID, "cuMemRetainAllocationHandle", va + G)


def test_export_import(undo: Undo) -> None:
    h = create(undo, G, prop(0, int(POSIX_FD)))
    fd = int(_driver.call("cuMemExportToShareableHandle", h, POSIX_FD, 0))
    try:
        h2 = int(_driver.call("cuMemImportFromShareableHandle", fd, POSIX_FD))
    finally:
        os.close(fd)
    undo("cuMemRelease", h2)
    va = reserve(undo, 2 * G)
    mapped(undo, va, G, h)
    mapped(undo, va + G, G, h2)
    _driver.call("cuMemSetAccess", va, 2 * G, [desc()], 1)
    _driver.call("cuMemsetD8", va, 0x6B, 4096)
    out = np.zeros(4, np.uint8)
    _driver.call("cuMemcpyDtoH", out, va + G, 4)
    assert (out == 0x6B).all()


def test_export_without_handle_type(undo: Undo) -> None:
    h = create(undo, G)
    expect(EXPORT_WITHOUT_TYPE, "cuMemExportToShareableHandle", h, POSIX_FD, 0)


def test_import_closed_fd(undo: Undo) -> None:
    rd, wr = os.pipe()
    os.close(rd)
    os.close(wr)
    expect(IMPORT_CLOSED_FD, "cuMemImportFromShareableHandle", rd, POSIX_FD)


def test_import_foreign_fd(undo: Undo) -> None:
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        expect(IMPORT_FOREIGN_FD, "cuMemImportFromShareableHandle", fd, POSIX_FD)
    finally:
        os.close(fd)
