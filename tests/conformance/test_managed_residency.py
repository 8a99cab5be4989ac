"""Managed memory on a device that fills up: range attributes over sub-ranges, free memory as
pages move, device allocations evicting prefetched pages.

Expected answers are the GPU's (``h100_probe.json``, cases
``C_residency_subrange_attributes``, ``C_residency_meminfo``, ``C_residency_evict``,
recorded on an H200). Each answer is a named constant below; they run on whichever
backend is active and the simulator must agree.
"""

from __future__ import annotations

import ctypes

import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit._core import _driver

from ._helpers import Undo
from .test_managed import managed

pytestmark = pytest.mark.uses_managed_memory

RA = cu.CUmem_range_attribute
ADV = cu.CUmem_advise
KiB = 1 << 10
MiB = 1 << 20
CPU = -1  # CU_DEVICE_CPU
NONE = -2  # CU_DEVICE_INVALID

# -- C_residency_subrange_attributes: LAST_PREFETCH_LOCATION of sub-ranges ------------------
#: (offset, length) of each part asked about in an 8 MiB allocation.
PARTS = {"whole": (0, 8 * MiB), "0-2M": (0, 2 * MiB), "2M-4M": (2 * MiB, 2 * MiB),
         "2M+4K": (2 * MiB, 4 * KiB), "1M-3M": (MiB, 2 * MiB), "3M-4M": (3 * MiB, MiB),
         "4M-8M": (4 * MiB, 4 * MiB), "5M+4K": (5 * MiB, 4 * KiB),
         "5M+4K..+8K": (5 * MiB + 4 * KiB, 4 * KiB), "5M+64K..+68K": (5 * MiB + 64 * KiB, 4 * KiB)}
#: After prefetching [2M, 4M) to device 0: a value holds for a range only if every page has it.
AFTER_PREFETCH_2M_4M = {"whole": NONE, "0-2M": NONE, "2M-4M": 0, "2M+4K": 0, "1M-3M": NONE,
                        "3M-4M": 0, "4M-8M": NONE, "5M+4K": NONE, "5M+4K..+8K": NONE,
                        "5M+64K..+68K": NONE}
#: Then [3M, 5M) to the host.
AFTER_PREFETCH_3M_5M_HOST = {**AFTER_PREFETCH_2M_4M, "2M-4M": NONE, "3M-4M": CPU}
#: Then one page at 5M to device 0: the attribute is kept per page.
AFTER_PREFETCH_5M_PAGE = {**AFTER_PREFETCH_3M_5M_HOST, "5M+4K": 0}
#: A discard leaves the last prefetch location as it was.
DISCARD_KEEPS_LAST_PREFETCH = True
#: A host write after a prefetch to a device leaves the last prefetch location as it was.
HOST_WRITE_KEEPS_LAST_PREFETCH = True

# -- C_residency_meminfo: device memory taken for managed pages --------------------------
#: Managed memory on the host takes none of the device's free memory.
HOST_RESIDENT_TAKES = 0
#: A prefetch to the device takes whole 2 MiB blocks of free memory: 256 MiB for 256 MiB in
#: a fresh process; none where memory the driver kept from earlier managed pages serves it,
#: and once 64 MiB more than the 64 MiB prefetched (after other tests had used managed memory).
RESIDENT_BLOCK = 2 * MiB
PREFETCH_TAKES_AT_MOST_EXTRA = 64 * MiB
#: Free memory does not rise when the pages leave the device (prefetched back, written by the
#: host, discarded; read-mostly copies collapsed): the driver keeps the memory for managed pages
#: and gives it to device allocations that need it (C_residency_evict).
KEPT_WHEN_PAGES_LEAVE = True

# -- C_residency_evict: device allocations larger than what is free -------------------------
#: cuMemAlloc of more than is free succeeds by evicting prefetched managed pages ...
ALLOC_EVICTS_MANAGED = True
#: ... and so does a stream-ordered allocation from the default pool.
POOL_ALLOC_EVICTS_MANAGED = True
#: More than the device has is refused (out of memory), whatever managed pages hold.
ALLOC_BEYOND_EVERYTHING = (cm.CudaOutOfMemoryError, cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY)


def host_write(ptr: int, n: int, value: int) -> None:
    """Write ``n`` bytes from the host, as a program does (the pages fault back)."""
    ctypes.memset(ptr, value, n)
    if _driver.backend_name() == "sim":
        from cuda_memkit import sim

        sim.host_access(ptr, n, write=True)  # the simulator cannot see host stores


def prefetch(ptr: int, n: int, loc: cm.Location) -> None:
    _driver.call("cuMemPrefetchAsync", ptr, n, loc.to_cu(), 0, 0)
    _driver.call("cuCtxSynchronize")


def last(ptr: int, n: int) -> int:
    return int(_driver.call("cuMemRangeGetAttribute", 4,
                            RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, ptr, n))


def lasts(m: int) -> dict[str, int]:
    return {name: last(m + off, n) for name, (off, n) in PARTS.items()}


def free() -> int:
    _driver.call("cuCtxSynchronize")
    return int(_driver.call("cuMemGetInfo")[0])


D0 = cm.Location.device(0)
HOST = cm.Location.host()


# -- sub-range attributes ------------------------------------------------------------------


def test_last_prefetch_location_of_sub_ranges(undo: Undo) -> None:
    m = managed(undo, 8 * MiB)
    host_write(m, 8 * MiB, 1)
    prefetch(m + 2 * MiB, 2 * MiB, D0)
    assert lasts(m) == AFTER_PREFETCH_2M_4M
    prefetch(m + 3 * MiB, 2 * MiB, HOST)
    assert lasts(m) == AFTER_PREFETCH_3M_5M_HOST
    prefetch(m + 5 * MiB, 4 * KiB, D0)
    assert lasts(m) == AFTER_PREFETCH_5M_PAGE


def test_discard_and_host_writes_leave_the_last_prefetch_location(undo: Undo) -> None:
    m = managed(undo, 4 * MiB)
    prefetch(m, 4 * MiB, D0)
    s = int(_driver.call("cuStreamCreate", 1))
    undo("cuStreamDestroy", s)
    _driver.call("cuMemDiscardBatchAsync", [cu.CUdeviceptr(m)], [MiB], 1, 0, s)
    _driver.call("cuStreamSynchronize", s)
    assert (last(m, MiB) == 0) is DISCARD_KEEPS_LAST_PREFETCH
    host_write(m + 2 * MiB, 4 * KiB, 2)
    assert (last(m + 2 * MiB, 4 * KiB) == 0) is HOST_WRITE_KEEPS_LAST_PREFETCH


def test_advice_on_sub_ranges_reads_per_range(undo: Undo) -> None:
    m = managed(undo, 4 * MiB)
    _driver.call("cuMemAdvise", m + MiB, 2 * MiB, ADV.CU_MEM_ADVISE_SET_READ_MOSTLY, D0.to_cu())
    _driver.call("cuMemAdvise", m, 2 * MiB, ADV.CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
                 HOST.to_cu())

    def rm(off: int, n: int) -> int:
        return int(_driver.call("cuMemRangeGetAttribute", 4,
                                RA.CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, m + off, n))

    def pref(off: int, n: int) -> int:
        return int(_driver.call("cuMemRangeGetAttribute", 4,
                                RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, m + off, n))

    assert (rm(MiB, 2 * MiB), rm(0, 2 * MiB), rm(MiB, 4 * KiB)) == (1, 0, 1)
    assert (pref(0, 2 * MiB), pref(0, 4 * MiB), pref(MiB, 4 * KiB)) == (CPU, NONE, CPU)


# -- free memory as pages move ------------------------------------------------------------------


def test_free_memory_drops_as_managed_pages_arrive_and_stays_down(undo: Undo) -> None:
    n = 64 * MiB
    f0 = free()
    m = managed(undo, n)
    host_write(m, n, 1)
    assert f0 - free() == HOST_RESIDENT_TAKES
    prefetch(m, n, D0)
    taken = f0 - free()
    assert taken % RESIDENT_BLOCK == 0 and 0 <= taken <= n + PREFETCH_TAKES_AT_MOST_EXTRA
    after = free()
    prefetch(m, n, HOST)
    assert (free() == after) is KEPT_WHEN_PAGES_LEAVE
    prefetch(m, n, D0)
    host_write(m, n, 2)
    assert (free() == after) is KEPT_WHEN_PAGES_LEAVE
    prefetch(m, n, D0)
    s = int(_driver.call("cuStreamCreate", 1))
    undo("cuStreamDestroy", s)
    _driver.call("cuMemDiscardBatchAsync", [cu.CUdeviceptr(m)], [n], 1, 0, s)
    _driver.call("cuStreamSynchronize", s)
    assert (free() == after) is KEPT_WHEN_PAGES_LEAVE


def test_read_mostly_copies_collapsed_by_a_host_write_keep_their_memory(undo: Undo) -> None:
    n = 32 * MiB
    m = managed(undo, n)
    host_write(m, n, 1)
    _driver.call("cuMemAdvise", m, n, ADV.CU_MEM_ADVISE_SET_READ_MOSTLY, D0.to_cu())
    prefetch(m, n, D0)
    after = free()
    host_write(m, n, 2)  # a write collapses the copies to the host
    assert (free() == after) is KEPT_WHEN_PAGES_LEAVE
    assert ctypes.string_at(m + n - 1, 1) == b"\x02"


# -- device allocations evict prefetched managed pages -----------------------------------------


def test_a_device_allocation_evicts_prefetched_managed_pages(undo: Undo) -> None:
    n = 64 * MiB
    m = managed(undo, n)
    host_write(m, n, 0x5A)
    prefetch(m, n, D0)
    # More than is free, less than free + the 64 MiB of managed pages on the device.
    big = (free() + 32 * MiB) // (2 * MiB) * (2 * MiB)
    if ALLOC_EVICTS_MANAGED:
        p = int(_driver.call("cuMemAlloc", big))
        _driver.call("cuMemFree", p)
    else:
        with pytest.raises(cm.CudaOutOfMemoryError):
            _driver.call("cuMemAlloc", big)
    assert ctypes.string_at(m, 2) == b"ZZ" and ctypes.string_at(m + n - 2, 2) == b"ZZ"


def test_a_pool_allocation_evicts_prefetched_managed_pages(undo: Undo) -> None:
    n = 64 * MiB
    m = managed(undo, n)
    prefetch(m, n, D0)
    s = int(_driver.call("cuStreamCreate", 1))
    undo("cuStreamDestroy", s)
    big = (free() + 32 * MiB) // (2 * MiB) * (2 * MiB)
    if POOL_ALLOC_EVICTS_MANAGED:
        p = int(_driver.call("cuMemAllocAsync", big, s))
        _driver.call("cuMemFreeAsync", p, s)
        _driver.call("cuStreamSynchronize", s)
        pool = _driver.call("cuDeviceGetDefaultMemPool", 0)
        _driver.call("cuMemPoolTrimTo", pool, 0)
    else:
        with pytest.raises(cm.CudaOutOfMemoryError):
            _driver.call("cuMemAllocAsync", big, s)


def test_more_than_the_device_has_is_refused(undo: Undo) -> None:
    n = 64 * MiB
    m = managed(undo, n)
    prefetch(m, n, D0)
    cls, code = ALLOC_BEYOND_EVERYTHING
    total = int(_driver.call("cuMemGetInfo")[1])
    with pytest.raises(cls) as info:
        _driver.call("cuMemAlloc", total + 1024 * MiB)
    assert info.value.code == int(code)
    assert last(m, n) == 0
