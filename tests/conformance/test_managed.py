"""Managed-memory driver semantics through the gateway: exact class and CUresult.

Expected answers are the H100's (``h100_probe.json``, section C: cases
``C_alloc_managed``, ``C_advise``, ``C_prefetch``, ``C_range_attributes``,
``C_prefetch_batch``, ``C_stream_attach``). They run on whichever backend is
active; the simulator must agree. Each answer is a named constant below, so
a new probe changes constants, not tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit._core import _driver

from ._helpers import Undo, outcome

pytestmark = pytest.mark.uses_managed_memory

R = cu.CUresult
ADV = cu.CUmem_advise
RA = cu.CUmem_range_attribute
KiB = 1 << 10
MiB = 1 << 20
PAGE = 4096

Want = tuple[type[cm.CudaError], R] | None
OK: Want = None
INVALID: Want = (cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE)
BAD_DEVICE: Want = (cm.CudaInvalidDeviceError, R.CUDA_ERROR_INVALID_DEVICE)

CPU = -1  # CU_DEVICE_CPU
NONE = -2  # CU_DEVICE_INVALID
T_INVALID, T_DEVICE, T_HOST, T_NUMA = 0, 1, 2, 3

# -- C_alloc_managed ---------------------------------------------------------------------
ALLOC_FLAGS: dict[int, Want] = {1: OK, 2: OK, 0: INVALID, 3: INVALID, 4: INVALID}
ALLOC_SIZE0 = INVALID
MANAGED_ALIGN = 2 * MiB  # managed allocations start on 2 MiB boundaries
FREE_INTERIOR = INVALID

# -- C_advise: advice x location on managed memory ---------------------------------------
LOCATIONS: dict[str, Callable[[], cu.CUmemLocation]] = {
    "DEVICE0": lambda: cm.Location.device(0).to_cu(),
    "DEVICE7": lambda: cm.Location(cm.LocationType.DEVICE, 7).to_cu(),
    "HOST": lambda: cm.Location.host().to_cu(),
    "HOST_NUMA0": lambda: cm.Location.host_numa(0).to_cu(),
    "HOST_NUMA99": lambda: cm.Location(cm.LocationType.HOST_NUMA, 99).to_cu(),
    "HOST_NUMA_CURRENT": lambda: cm.Location.host_numa_current().to_cu(),
    "INVALID": cu.CUmemLocation,
}
# Advice that ignores the location still refuses CU_MEM_LOCATION_TYPE_INVALID.
_IGNORED: dict[str, Want] = {**{k: OK for k in LOCATIONS}, "INVALID": INVALID}
ADVICE_GRID: dict[str, dict[str, Want]] = {
    "SET_READ_MOSTLY": _IGNORED,
    "UNSET_READ_MOSTLY": _IGNORED,
    "UNSET_PREFERRED_LOCATION": _IGNORED,
    "SET_PREFERRED_LOCATION": {"DEVICE0": OK, "DEVICE7": INVALID, "HOST": OK,
                               "HOST_NUMA0": OK, "HOST_NUMA99": INVALID,
                               "HOST_NUMA_CURRENT": OK, "INVALID": INVALID},
    "SET_ACCESSED_BY": {"DEVICE0": OK, "DEVICE7": INVALID, "HOST": OK,
                        "HOST_NUMA0": INVALID, "HOST_NUMA99": INVALID,
                        "HOST_NUMA_CURRENT": INVALID, "INVALID": INVALID},
    "UNSET_ACCESSED_BY": {"DEVICE0": OK, "DEVICE7": INVALID, "HOST": OK,
                          "HOST_NUMA0": INVALID, "HOST_NUMA99": INVALID,
                          "HOST_NUMA_CURRENT": INVALID, "INVALID": INVALID},
}
ADVISE_DEVICE_MEMORY = INVALID  # cuMemAlloc memory
ADVISE_PINNED_MEMORY = INVALID  # cuMemHostAlloc memory
ADVISE_SIZE0 = INVALID
ADVISE_PAST_END = INVALID
ADVISE_UNKNOWN_POINTER = INVALID
ADVISE_BAD_ADVICE = INVALID

# -- C_prefetch ----------------------------------------------------------------------------
PREFETCH_TO: dict[str, Want] = {"DEVICE0": OK, "DEVICE7": BAD_DEVICE, "HOST": OK,
                                "HOST_NUMA0": OK, "HOST_NUMA99": INVALID,
                                "HOST_NUMA_CURRENT": OK, "INVALID": INVALID}
PREFETCH_SIZE0 = INVALID
PREFETCH_PAST_END = INVALID
PREFETCH_DEVICE_MEMORY = INVALID
PREFETCH_PINNED_MEMORY = INVALID
PREFETCH_FLAGS1 = INVALID
PREFETCH_UNKNOWN_POINTER = INVALID

# -- C_range_attributes ----------------------------------------------------------------------
SCALAR_SIZES_OK = {4}
ACCESSED_BY_SIZES_OK = {4, 8, 12, 16}
RANGE_DEVICE_MEMORY = INVALID
RANGE_SIZE0 = INVALID
RANGE_PAST_END = INVALID
#: (legacy, type, id) of a location kind in the PREFERRED/LAST_PREFETCH attributes.
AS_ATTR = {"none": (NONE, T_INVALID, NONE), "device0": (0, T_DEVICE, 0),
           "host": (CPU, T_HOST, CPU), "numa0": (CPU, T_NUMA, 0)}
#: Order of accessed-by entries: devices, then the CPU.
ACCESSED_BY_CPU_LAST = True

# -- C_prefetch_batch --------------------------------------------------------------------------
BATCH_LEGACY_STREAM = INVALID
BATCH_PER_THREAD_STREAM = OK
BATCH_COUNT0 = INVALID
BATCH_LOC_IDX_NOT_ZERO = INVALID
BATCH_NUMLOCS_GT_COUNT = INVALID
BATCH_IDXS_NOT_INCREASING = OK  # [0, 0] is accepted
BATCH_IDX_EQ_COUNT = INVALID
BATCH_NUMLOCS0 = INVALID
BATCH_SIZE0_ENTRY = INVALID
BATCH_FLAGS1 = INVALID
BATCH_DEVICE7 = INVALID  # (cuMemPrefetchAsync says INVALID_DEVICE)
BATCH_INVALID_LOC = INVALID
BATCH_DEVICE_MEMORY = INVALID
BATCH_PAST_END = INVALID
DISCARD_LEGACY_STREAM = INVALID
DISCARD_DEVICE_MEMORY = INVALID
DISCARD_SIZE0_ENTRY = INVALID
DISCARD_FLAGS1 = INVALID
DISCARD_COUNT0 = INVALID
DP_LEGACY_STREAM = INVALID
DP_LOC_IDX_NOT_ZERO = INVALID
DP_DEVICE_MEMORY = INVALID

# -- C_stream_attach ---------------------------------------------------------------------------
# Flags 0 with length 0 or the full size crash the process on the H100 (SIGSEGV in
# the driver): never called here; cuda_memkit checks flags before the driver call.
ATTACH_FLAGS: dict[int, Want] = {1: OK, 2: OK, 4: OK, 3: INVALID, 8: INVALID}
ATTACH_PARTIAL = INVALID
ATTACH_FLAGS0_PARTIAL = INVALID
ATTACH_INTERIOR = INVALID
ATTACH_SINGLE_LEGACY = INVALID
ATTACH_DEVICE_MEMORY = INVALID
ATTACH_UNKNOWN_POINTER = INVALID


def managed(undo: Undo, n: int, flags: int = 1) -> int:
    p = int(_driver.call("cuMemAllocManaged", n, flags))
    undo("cuMemFree", p)
    return p


def device_mem(undo: Undo, n: int) -> int:
    p = int(_driver.call("cuMemAlloc", n))
    undo("cuMemFree", p)
    return p


def pinned(undo: Undo, n: int) -> int:
    p = int(_driver.call("cuMemHostAlloc", n, 0))
    undo("cuMemFreeHost", p)
    return p


def stream(undo: Undo) -> int:
    s = int(_driver.call("cuStreamCreate", 1))
    undo("cuStreamDestroy", s)
    return s


def d0() -> cu.CUmemLocation:
    return LOCATIONS["DEVICE0"]()


def rga(attr: RA, ptr: int, n: int, size: int = 4) -> Any:
    return _driver.call("cuMemRangeGetAttribute", size, attr, ptr, n)


def legacy_of(ptr: int, n: int) -> tuple[int, int]:
    """(PREFERRED_LOCATION, LAST_PREFETCH_LOCATION): a device, CPU (-1) or NONE (-2)."""
    return (rga(RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, ptr, n),
            rga(RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, ptr, n))


def typed_of(ptr: int, n: int) -> tuple[int, int, int, int] | None:
    """(preferred type, id, last prefetch type, id), or None where the installed
    cuda.bindings cannot read them (13.3, the probe's: TypeError before any call)."""
    try:
        return (rga(RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE, ptr, n),
                rga(RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID, ptr, n),
                rga(RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE, ptr, n),
                rga(RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID, ptr, n))
    except TypeError as exc:
        assert "Unsupported attribute" in str(exc)
        return None


def check(ptr: int, n: int, preferred: str | None = None, last: str | None = None) -> None:
    """Assert the preferred / last-prefetch location kinds of a range."""
    legacy = legacy_of(ptr, n)
    typed = typed_of(ptr, n)
    if preferred is not None:
        assert legacy[0] == AS_ATTR[preferred][0]
        if typed is not None:
            assert typed[0] == AS_ATTR[preferred][1]
            if AS_ATTR[preferred][1] in (T_DEVICE, T_NUMA):
                assert typed[1] == AS_ATTR[preferred][2]
    if last is not None:
        assert legacy[1] == AS_ATTR[last][0]
        if typed is not None:
            assert typed[2] == AS_ATTR[last][1]
            if AS_ATTR[last][1] in (T_DEVICE, T_NUMA):
                assert typed[3] == AS_ATTR[last][2]


# -- C_alloc_managed -------------------------------------------------------------------------


@pytest.mark.parametrize(("flags", "want"), ALLOC_FLAGS.items())
def test_alloc_managed_flags(undo: Undo, flags: int, want: Want) -> None:
    p = outcome(want, "cuMemAllocManaged", 4096, flags)
    if p is not None:
        undo("cuMemFree", int(p))
        attr = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_IS_MANAGED
        assert _driver.call("cuPointerGetAttribute", attr, int(p))
        size = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_RANGE_SIZE
        assert _driver.call("cuPointerGetAttribute", size, int(p)) == 4096
        assert int(p) % MANAGED_ALIGN == 0


def test_alloc_managed_size0(undo: Undo) -> None:
    outcome(ALLOC_SIZE0, "cuMemAllocManaged", 0, 1)


def test_free_interior_managed_pointer(undo: Undo) -> None:
    m = managed(undo, MiB)
    outcome(FREE_INTERIOR, "cuMemFree", m + 256)


def test_managed_memory_is_host_visible(undo: Undo) -> None:
    m = managed(undo, MiB)
    view = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * MiB).from_address(m))
    view[:] = 0x5A
    _driver.call("cuMemsetD8", m, 0x11, 4096)
    _driver.call("cuCtxSynchronize")
    assert list(view[:2]) == [0x11, 0x11]
    assert list(view[4096:4098]) == [0x5A, 0x5A]


def test_address_range_of_interior_managed_pointer(undo: Undo) -> None:
    m = managed(undo, MiB)
    base, size = _driver.call("cuMemGetAddressRange", m + 100)
    assert int(base) == m and int(size) >= MiB


# -- C_advise ----------------------------------------------------------------------------------


@pytest.mark.parametrize("advice", list(ADVICE_GRID))
@pytest.mark.parametrize("where", list(LOCATIONS))
def test_advice_by_location(undo: Undo, advice: str, where: str) -> None:
    m = managed(undo, 4 * MiB)
    adv = getattr(ADV, f"CU_MEM_ADVISE_{advice}")
    outcome(ADVICE_GRID[advice][where], "cuMemAdvise", m, 4 * MiB, adv, LOCATIONS[where]())


def test_advise_device_memory(undo: Undo) -> None:
    p = device_mem(undo, 2 * MiB)
    outcome(ADVISE_DEVICE_MEMORY, "cuMemAdvise", p, 2 * MiB,
            ADV.CU_MEM_ADVISE_SET_READ_MOSTLY, d0())
    outcome(ADVISE_DEVICE_MEMORY, "cuMemAdvise", p, 2 * MiB,
            ADV.CU_MEM_ADVISE_SET_PREFERRED_LOCATION, d0())


def test_advise_pinned_memory(undo: Undo) -> None:
    h = pinned(undo, 2 * MiB)
    outcome(ADVISE_PINNED_MEMORY, "cuMemAdvise", h, 2 * MiB,
            ADV.CU_MEM_ADVISE_SET_READ_MOSTLY, d0())


def test_unaligned_advice_covers_whole_pages(undo: Undo) -> None:
    m = managed(undo, 4 * MiB)
    rm = RA.CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY
    _driver.call("cuMemAdvise", m + 100, 1000, ADV.CU_MEM_ADVISE_SET_READ_MOSTLY, d0())
    assert rga(rm, m, PAGE) == 1
    assert rga(rm, m + PAGE, PAGE) == 0


@pytest.mark.parametrize(("label", "want", "offset", "n", "advice"), [
    ("size 0", ADVISE_SIZE0, 0, 0, 1),
    ("past end", ADVISE_PAST_END, 0, 8 * MiB, 1),
    ("interior", OK, 2 * MiB, 2 * MiB, 1),
    ("advice 99", ADVISE_BAD_ADVICE, 0, PAGE, 99),
    ("int advice", OK, 0, PAGE, 1),
])
def test_advise_ranges(undo: Undo, label: str, want: Want, offset: int, n: int,
                       advice: int) -> None:
    m = managed(undo, 4 * MiB)
    outcome(want, "cuMemAdvise", m + offset, n, advice, d0())


def test_advise_unknown_pointer(undo: Undo) -> None:
    outcome(ADVISE_UNKNOWN_POINTER, "cuMemAdvise", 0x1234000, PAGE,
            ADV.CU_MEM_ADVISE_SET_READ_MOSTLY, d0())


def test_advise_takes_a_cudeviceptr(undo: Undo) -> None:
    m = managed(undo, MiB)
    _driver.call("cuMemAdvise", cu.CUdeviceptr(m), PAGE, ADV.CU_MEM_ADVISE_SET_READ_MOSTLY, d0())


# -- C_prefetch --------------------------------------------------------------------------------


@pytest.mark.parametrize("where", list(LOCATIONS))
def test_prefetch_to(undo: Undo, where: str) -> None:
    m = managed(undo, 4 * MiB)
    s = stream(undo)
    outcome(PREFETCH_TO[where], "cuMemPrefetchAsync", m, 4 * MiB, LOCATIONS[where](), 0, s)


@pytest.mark.parametrize(("label", "want", "offset", "n", "flags"), [
    ("size 0", PREFETCH_SIZE0, 0, 0, 0),
    ("unaligned", OK, 100, 1000, 0),
    ("past end", PREFETCH_PAST_END, 0, 8 * MiB, 0),
    ("interior", OK, MiB, MiB, 0),
    ("flags 1", PREFETCH_FLAGS1, 0, 4 * MiB, 1),
])
def test_prefetch_ranges(undo: Undo, label: str, want: Want, offset: int, n: int,
                         flags: int) -> None:
    m = managed(undo, 4 * MiB)
    s = stream(undo)
    outcome(want, "cuMemPrefetchAsync", m + offset, n, d0(), flags, s)


def test_prefetch_non_managed(undo: Undo) -> None:
    s = stream(undo)
    p = device_mem(undo, 2 * MiB)
    outcome(PREFETCH_DEVICE_MEMORY, "cuMemPrefetchAsync", p, 2 * MiB, d0(), 0, s)
    h = pinned(undo, 2 * MiB)
    outcome(PREFETCH_PINNED_MEMORY, "cuMemPrefetchAsync", h, 2 * MiB, d0(), 0, s)
    outcome(PREFETCH_UNKNOWN_POINTER, "cuMemPrefetchAsync", 0x1234000, PAGE, d0(), 0, s)


@pytest.mark.parametrize("legacy", [0, 1, 2])
def test_prefetch_on_default_streams(undo: Undo, legacy: int) -> None:
    m = managed(undo, MiB)
    _driver.call("cuMemPrefetchAsync", m, MiB, d0(), 0, legacy)


# -- C_range_attributes --------------------------------------------------------------------------


@pytest.mark.parametrize("attr", list(RA))
@pytest.mark.parametrize("size", [0, 1, 3, 4, 8, 12, 16])
def test_range_attribute_data_sizes(undo: Undo, attr: RA, size: int) -> None:
    m = managed(undo, MiB)
    if int(attr) >= int(RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE) and \
            typed_of(m, MiB) is None:
        # cuda.bindings 13.3 (the probe's) refuses the typed attributes before the driver
        with pytest.raises(TypeError, match="Unsupported attribute"):
            _driver.call("cuMemRangeGetAttribute", size, attr, m, MiB)
        return
    accessed = attr == RA.CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY
    ok = size in (ACCESSED_BY_SIZES_OK if accessed else SCALAR_SIZES_OK)
    value = outcome(OK if ok else INVALID, "cuMemRangeGetAttribute", size, attr, m, MiB)
    if ok and accessed:
        assert value == [NONE] * (size // 4)


def test_fresh_range(undo: Undo) -> None:
    m = managed(undo, MiB)
    assert rga(RA.CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, m, MiB) == 0
    check(m, MiB, preferred="none", last="none")


def test_range_attributes_after_mixed_advice(undo: Undo) -> None:
    n, half = 4 * MiB, 2 * MiB
    m = managed(undo, n)
    rm = RA.CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY
    _driver.call("cuMemAdvise", m, half, ADV.CU_MEM_ADVISE_SET_READ_MOSTLY, d0())
    assert (rga(rm, m, n), rga(rm, m, half), rga(rm, m + half, half)) == (0, 1, 0)
    _driver.call("cuMemAdvise", m + half, half, ADV.CU_MEM_ADVISE_SET_PREFERRED_LOCATION, d0())
    check(m + half, half, preferred="device0")
    check(m, n, preferred="none")
    check(m, half, preferred="none")
    _driver.call("cuMemAdvise", m, half, ADV.CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
                 LOCATIONS["HOST"]())
    check(m, half, preferred="host")
    check(m, n, preferred="none")
    _driver.call("cuMemAdvise", m, half, ADV.CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
                 LOCATIONS["HOST_NUMA0"]())
    check(m, half, preferred="numa0")  # the classic attribute says CPU (-1)


def test_accessed_by_lists(undo: Undo) -> None:
    n = 4 * MiB
    m = managed(undo, n)
    ab = RA.CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY
    _driver.call("cuMemAdvise", m, n, ADV.CU_MEM_ADVISE_SET_ACCESSED_BY, d0())
    assert rga(ab, m, n, 4) == [0]
    assert rga(ab, m, n, 8) == [0, NONE]
    assert rga(ab, m, n, 12) == [0, NONE, NONE]
    _driver.call("cuMemAdvise", m, n, ADV.CU_MEM_ADVISE_SET_ACCESSED_BY, LOCATIONS["HOST"]())
    both = [0, CPU] if ACCESSED_BY_CPU_LAST else [CPU, 0]
    assert rga(ab, m, n, 12) == [*both, NONE]
    assert rga(ab, m, n, 4) == both[:1]
    _driver.call("cuMemAdvise", m, MiB, ADV.CU_MEM_ADVISE_UNSET_ACCESSED_BY, d0())
    assert rga(ab, m, n, 8) == [CPU, NONE]
    assert rga(ab, m + MiB, MiB, 12) == [*both, NONE]


def test_last_prefetch_location(undo: Undo) -> None:
    n, half = 4 * MiB, 2 * MiB
    m = managed(undo, n)
    s = stream(undo)
    _driver.call("cuMemPrefetchAsync", m, n, d0(), 0, s)
    _driver.call("cuStreamSynchronize", s)
    check(m, n, last="device0")
    _driver.call("cuMemPrefetchAsync", m, half, LOCATIONS["HOST"](), 0, s)
    _driver.call("cuStreamSynchronize", s)
    check(m, n, last="none")
    check(m, half, last="host")
    check(m + half, half, last="device0")
    _driver.call("cuMemPrefetchAsync", m, half, LOCATIONS["HOST_NUMA0"](), 0, s)
    _driver.call("cuStreamSynchronize", s)
    check(m, half, last="numa0")  # the classic attribute says CPU (-1)


def test_range_get_attributes_plural(undo: Undo) -> None:
    n = MiB
    m = managed(undo, n)
    attrs = list(RA)
    ndev = cm.device_count()
    sizes = [4 * ndev if a == RA.CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY else 4 for a in attrs]
    if typed_of(m, n) is None:  # cuda.bindings 13.3: the typed attributes are refused
        with pytest.raises(TypeError, match="Unsupported attribute"):
            _driver.call("cuMemRangeGetAttributes", sizes, attrs, len(attrs), m, n)
        attrs, sizes = attrs[:4], sizes[:4]
    values = _driver.call("cuMemRangeGetAttributes", sizes, attrs, len(attrs), m, n)
    assert isinstance(values, list) and len(values) == len(attrs)
    assert values[0] == 0 and values[2] == [NONE] * ndev
    two = _driver.call("cuMemRangeGetAttributes", [4, 4], attrs[:2], 2, m, n)
    assert two == [0, NONE]
    outcome(INVALID, "cuMemRangeGetAttributes", [8], attrs[:1], 1, m, n)
    with pytest.raises(TypeError):
        _driver.call("cuMemRangeGetAttributes", [4], [1], 1, m, n)
    with pytest.raises(RuntimeError, match="too small"):
        _driver.call("cuMemRangeGetAttributes", [4], attrs[:1], 2, m, n)


def test_range_attribute_misuse(undo: Undo) -> None:
    m = managed(undo, 4 * MiB)
    rm = RA.CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY
    p = device_mem(undo, 2 * MiB)
    outcome(RANGE_DEVICE_MEMORY, "cuMemRangeGetAttribute", 4, rm, p, 2 * MiB)
    outcome(OK, "cuMemRangeGetAttribute", 4, rm, m + 100, 1000)
    outcome(RANGE_SIZE0, "cuMemRangeGetAttribute", 4, rm, m, 0)
    outcome(RANGE_PAST_END, "cuMemRangeGetAttribute", 4, rm, m, 8 * MiB)


# -- C_prefetch_batch ------------------------------------------------------------------------------


def ptrs_of(base: int, n: int, chunk: int) -> list[cu.CUdeviceptr]:
    return [cu.CUdeviceptr(base + i * chunk) for i in range(n)]


@pytest.fixture
def batch(undo: Undo) -> tuple[int, int, list[cu.CUdeviceptr], list[int]]:
    m = managed(undo, 4 * MiB)
    s = stream(undo)
    return m, s, ptrs_of(m, 4, MiB), [MiB] * 4


B = "cuMemPrefetchBatchAsync"
DB = "cuMemDiscardBatchAsync"
DP = "cuMemDiscardAndPrefetchBatchAsync"


def test_batch_prefetch_works(batch: Any) -> None:
    m, s, ptrs, sizes = batch
    _driver.call(B, ptrs, sizes, 4, [d0()], [0], 1, 0, s)
    _driver.call("cuStreamSynchronize", s)
    assert rga(RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m, 4 * MiB) == 0
    host = LOCATIONS["HOST"]()
    _driver.call(B, ptrs, sizes, 4, [d0(), host], [0, 2], 2, 0, s)
    _driver.call("cuStreamSynchronize", s)
    assert rga(RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m + 2 * MiB, 2 * MiB) == CPU
    _driver.call(B, ptrs, sizes, 4, [d0(), host, d0(), host], [0, 1, 2, 3], 4, 0, s)
    _driver.call(B, [ptrs[0], ptrs[0]], [MiB, MiB], 2, [d0()], [0], 1, 0, s)  # overlapping
    _driver.call(B, [cu.CUdeviceptr(m + 100), *ptrs[1:]], [1000, *sizes[1:]], 4, [d0()], [0], 1,
                 0, s)
    _driver.call(B, ptrs, sizes, 2, [d0()], [0], 1, 0, s)  # count < len(lists)


def test_batch_wants_cudeviceptr_objects(batch: Any) -> None:
    _m, s, ptrs, sizes = batch
    with pytest.raises(TypeError, match="dptrs"):
        _driver.call(B, [int(p) for p in ptrs], sizes, 4, [d0()], [0], 1, 0, s)
    with pytest.raises(TypeError):
        _driver.call(B, ptrs, sizes, 4, [0], [0], 1, 0, s)
    with pytest.raises(RuntimeError, match="too small"):
        _driver.call(B, ptrs, sizes, 5, [d0()], [0], 1, 0, s)
    with pytest.raises(RuntimeError, match="too small"):
        _driver.call(B, ptrs, sizes[:3], 4, [d0()], [0], 1, 0, s)


@pytest.mark.parametrize(("label", "want", "args"), [
    ("legacy stream 0", BATCH_LEGACY_STREAM, {"stream": 0}),
    ("per-thread stream", BATCH_PER_THREAD_STREAM, {"stream": 2}),
    ("count 0", BATCH_COUNT0, {"count": 0}),
    ("locIdxs [1]", BATCH_LOC_IDX_NOT_ZERO, {"idxs": [1]}),
    ("numLocs 5 > count 4", BATCH_NUMLOCS_GT_COUNT,
     {"locs": ["DEVICE0", "HOST"] * 2 + ["DEVICE0"], "idxs": [0, 1, 2, 3, 4]}),
    ("idxs [0,0]", BATCH_IDXS_NOT_INCREASING, {"locs": ["DEVICE0", "HOST"], "idxs": [0, 0]}),
    ("idxs [0,4]", BATCH_IDX_EQ_COUNT, {"locs": ["DEVICE0", "HOST"], "idxs": [0, 4]}),
    ("numLocs 0", BATCH_NUMLOCS0, {"locs": [], "idxs": []}),
    ("sizes with 0", BATCH_SIZE0_ENTRY, {"sizes": [MiB, 0, MiB, MiB]}),
    ("flags 1", BATCH_FLAGS1, {"flags": 1}),
    ("DEVICE7", BATCH_DEVICE7, {"locs": ["DEVICE7"]}),
    ("INVALID location", BATCH_INVALID_LOC, {"locs": ["INVALID"]}),
    ("HOST", OK, {"locs": ["HOST"]}),
    ("HOST_NUMA0", PREFETCH_TO["HOST_NUMA0"], {"locs": ["HOST_NUMA0"]}),
])
def test_batch_argument_rules(batch: Any, label: str, want: Want, args: dict[str, Any]) -> None:
    _m, s, ptrs, sizes = batch
    count = args.get("count", 4)
    locs = [LOCATIONS[k]() for k in args.get("locs", ["DEVICE0"])]
    idxs = args.get("idxs", [0])
    outcome(want, B, ptrs, args.get("sizes", sizes), count, locs, idxs,
            len(locs), args.get("flags", 0), args.get("stream", s))


def test_batch_non_managed_and_past_end(batch: Any, undo: Undo) -> None:
    m, s, _ptrs, _sizes = batch
    p = device_mem(undo, 2 * MiB)
    outcome(BATCH_DEVICE_MEMORY, B, [cu.CUdeviceptr(p)], [2 * MiB], 1, [d0()], [0], 1, 0, s)
    outcome(BATCH_PAST_END, B, [cu.CUdeviceptr(m)], [8 * MiB], 1, [d0()], [0], 1, 0, s)


def test_discard_batch_rules(batch: Any, undo: Undo) -> None:
    m, s, ptrs, sizes = batch
    _driver.call(DB, ptrs, sizes, 4, 0, s)
    _driver.call(DB, [cu.CUdeviceptr(m + 100)], [1000], 1, 0, s)
    p = device_mem(undo, 2 * MiB)
    outcome(DISCARD_DEVICE_MEMORY, DB, [cu.CUdeviceptr(p)], [2 * MiB], 1, 0, s)
    outcome(DISCARD_SIZE0_ENTRY, DB, ptrs[:2], [MiB, 0], 2, 0, s)
    outcome(DISCARD_LEGACY_STREAM, DB, ptrs, sizes, 4, 0, 0)
    outcome(DISCARD_FLAGS1, DB, ptrs, sizes, 4, 1, s)
    outcome(DISCARD_COUNT0, DB, [], [], 0, 0, s)
    with pytest.raises(TypeError):
        _driver.call(DB, [m], [MiB], 1, 0, s)


def test_discard_and_prefetch_batch_rules(batch: Any, undo: Undo) -> None:
    m, s, ptrs, sizes = batch
    _driver.call(DP, ptrs, sizes, 4, [d0()], [0], 1, 0, s)
    _driver.call("cuStreamSynchronize", s)
    assert rga(RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m, 4 * MiB) == 0
    _driver.call(DP, [cu.CUdeviceptr(m + 100)], [1000], 1, [d0()], [0], 1, 0, s)
    p = device_mem(undo, 2 * MiB)
    outcome(DP_DEVICE_MEMORY, DP, [cu.CUdeviceptr(p)], [2 * MiB], 1, [d0()], [0], 1, 0, s)
    outcome(DP_LOC_IDX_NOT_ZERO, DP, ptrs, sizes, 4, [d0()], [1], 1, 0, s)
    outcome(DP_LEGACY_STREAM, DP, ptrs, sizes, 4, [d0()], [0], 1, 0, 0)


# -- C_stream_attach ---------------------------------------------------------------------


@pytest.mark.parametrize(("flags", "want"), ATTACH_FLAGS.items())
@pytest.mark.parametrize("length", ["len0", "full", "partial"])
def test_stream_attach(undo: Undo, flags: int, want: Want, length: str) -> None:
    n = 4 * MiB
    m = managed(undo, n)
    s = stream(undo)
    ln = {"len0": 0, "full": n, "partial": MiB}[length]
    if length == "partial" and want is OK:
        want = ATTACH_PARTIAL
    outcome(want, "cuStreamAttachMemAsync", s, m, ln, flags)


def test_stream_attach_misuse(undo: Undo) -> None:
    m = managed(undo, 4 * MiB)
    s = stream(undo)
    outcome(ATTACH_FLAGS0_PARTIAL, "cuStreamAttachMemAsync", s, m, MiB, 0)
    outcome(ATTACH_INTERIOR, "cuStreamAttachMemAsync", s, m + MiB, 0, 1)
    outcome(ATTACH_SINGLE_LEGACY, "cuStreamAttachMemAsync", 0, m, 0, 4)
    outcome(OK, "cuStreamAttachMemAsync", 0, m, 0, 1)
    outcome(OK, "cuStreamAttachMemAsync", 0, m, 0, 2)
    p = device_mem(undo, 2 * MiB)
    outcome(ATTACH_DEVICE_MEMORY, "cuStreamAttachMemAsync", s, p, 0, 1)
    outcome(ATTACH_UNKNOWN_POINTER, "cuStreamAttachMemAsync", s, 0x1234000, 0, 1)
