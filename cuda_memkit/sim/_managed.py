"""Simulated managed memory: allocation, advice, prefetch, discard, range attributes.

Covers ``cuMemAllocManaged``, ``cuStreamAttachMemAsync``, ``cuMemAdvise``,
``cuMemPrefetchAsync``, the CUDA 13 batch calls and
``cuMemRangeGetAttribute(s)``.

Managed allocations are real, page-aligned host memory (host-visible, numpy
views work) in the allocation table with kind ``"managed"``. Their hint state
is kept per 4 KiB page in ``MACHINE.ext["managed.pages"]`` so range
attributes answer for any sub-range exactly as the driver does: a value
holds for a range only if every page in it agrees. Ranges are rounded out to
whole pages, like the driver does.

``MACHINE.batch_calls = False`` makes the three batch functions raise
``FunctionNotFoundError`` (a driver older than CUDA 13.0).

Residency: a GPU that fills up
------------------------------
The data always lives in the host backing (so numpy views work); what moves
is the bookkeeping of *where* each 2 MiB block of an allocation is resident
(:data:`BLOCK`, the driver's unit of device memory for managed pages: a
prefetch of 4 KiB takes a whole 2 MiB block of the device's free memory).
A block is on the host, on one device, or, read-mostly, on the host and on
any number of devices at once (duplicates).

* A prefetch moves blocks to its destination; read-mostly blocks are copied
  (the other copies stay).
* A device access (a copy or memset through the device's context, a kernel
  of the simulator) faults the blocks in as a prefetch would, except where
  the block stays put: it is at its preferred location on the host (the
  device reads it through the mapping: zero-copy), or at its preferred
  location on another device that the accessor has accessed-by advice for.
  A write to a read-mostly block collapses its copies to the writer.
* Host accesses the simulator cannot see (numpy views); :func:`host_access`
  tells it of one (tests), which faults the blocks back as the host does.
* Device-resident blocks take the device's memory: ``cuMemGetInfo``'s free
  memory drops by them. As on the H200, it does not rise when they leave
  (a prefetch back, a host fault, a discard, eviction, freeing the
  allocation): the driver keeps that memory (``SimDevice.managed_cached``)
  for the next managed pages and gives it to device allocations that need
  it. When a prefetch or a fault needs memory the device lacks, the least
  recently used blocks on it are evicted; a device allocation (``cuMemAlloc``,
  pools, ``cuMemCreate``) that does not fit takes the kept memory, then
  evicts. A read-mostly duplicate (another valid copy exists) is dropped
  without a write-back, any other block is written back to the host. Device
  allocations fail only if the kept memory and every managed block are not
  enough.
* A discard drops every copy of the blocks without writing them back.

``Machine.managed_evictions`` counts the bytes evicted, written back and
dropped, for tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cuda.bindings import driver as cu

from .._core._host_os import host_numa_nodes
from . import _state as S
from ._state import PAGE, Allocation, Fail, R, api

__all__ = [
    "cuMemAdvise",
    "cuMemAllocManaged",
    "cuMemDiscardAndPrefetchBatchAsync",
    "cuMemDiscardBatchAsync",
    "cuMemPrefetchAsync",
    "cuMemPrefetchBatchAsync",
    "cuMemRangeGetAttribute",
    "cuMemRangeGetAttributes",
    "cuStreamAttachMemAsync",
]

TABLE = "managed.pages"
#: Residency is kept per block of this many bytes (the driver's device-memory unit).
BLOCK = 2 << 20

INVALID, DEVICE, HOST, HOST_NUMA, HOST_NUMA_CURRENT = 0, 1, 2, 3, 4
ALL_KINDS = frozenset({DEVICE, HOST, HOST_NUMA, HOST_NUMA_CURRENT})
ACCESS_KINDS = frozenset({DEVICE, HOST})
DEVICE_CPU = -1
DEVICE_INVALID = -2

#: Managed allocations on the H100 start on 2 MiB boundaries.
MANAGED_ALIGN = 2 << 20

_A = cu.CUdevice_attribute
_RA = cu.CUmem_range_attribute


def M() -> S.Machine:
    return S.MACHINE


NUMA_NODES = host_numa_nodes()
CURRENT_NODE = min(NUMA_NODES)


@dataclass
class Pages:
    """Hint state of one managed allocation, one row per page."""

    npages: int
    ndev: int
    attach: int
    attach_stream: int = 0
    read_mostly: np.ndarray = field(init=False)
    pref: np.ndarray = field(init=False)  # (type, id) per page
    accessed: np.ndarray = field(init=False)  # devices..., host
    last: np.ndarray = field(init=False)  # (type, id) per page
    discarded: np.ndarray = field(init=False)
    on_host: np.ndarray = field(init=False)  # per block: a valid copy on the host
    on_dev: np.ndarray = field(init=False)  # (block, device): a copy on the device

    def __post_init__(self) -> None:
        n = self.npages
        self.read_mostly = np.zeros(n, bool)
        self.pref = np.zeros((n, 2), np.int32)
        self.accessed = np.zeros((n, self.ndev + 1), bool)
        self.last = np.zeros((n, 2), np.int32)
        self.discarded = np.zeros(n, bool)
        nblocks = -(-n // BLOCK_PAGES)
        self.on_host = np.ones(nblocks, bool)
        self.on_dev = np.zeros((nblocks, self.ndev), bool)


BLOCK_PAGES = BLOCK // PAGE


def _table() -> dict[int, Pages]:
    t: dict[int, Pages] = M().ext.setdefault(TABLE, {})
    return t


def release_managed(m: S.Machine, a: Allocation) -> None:
    """Forget a managed allocation's state (called by ``cuMemFree``)."""
    m.host_used -= a.size
    forget_pages(m, a)


def forget_pages(m: S.Machine, a: Allocation) -> None:
    """Drop a managed allocation's pages: hint state and the device memory its blocks held."""
    t = m.ext.get(TABLE)
    if t is None:
        return
    pg = t.pop(a.start, None)
    if pg is None:
        return
    for b, d in zip(*np.nonzero(pg.on_dev), strict=True):
        _drop(m, a.start, pg, int(b), int(d))  # the driver keeps the memory


# -- residency ------------------------------------------------------------------------


def _lru(m: S.Machine) -> list[dict[tuple[int, int], None]]:
    """Per device: resident blocks ``(allocation start, block)``, least recently used first."""
    return [dev.lru for dev in m.devices]


def _drop(m: S.Machine, start: int, pg: Pages, b: int, d: int) -> None:
    """Block ``b`` leaves device ``d``; the driver keeps its memory (free does not rise)."""
    pg.on_dev[b, d] = False
    dev = m.devices[d]
    dev.managed_used -= BLOCK
    dev.managed_cached += BLOCK
    _lru(m)[d].pop((start, b), None)


def evict(m: S.Machine, ordinal: int, need: int, keep: tuple[int, int] | None = None) -> int:
    """Evict least recently used blocks from device ``ordinal`` until ``need`` bytes are freed.

    ``keep`` (a block being brought in) is never chosen. Returns the bytes freed.
    """
    lru = _lru(m)[ordinal]
    table = _table()
    c = m.managed_evictions
    freed = 0
    while freed < need:
        it = iter(lru)
        key = next(it, None)
        if key is not None and key == keep:
            key = next(it, None)
        if key is None:
            break  # nothing left to evict
        start, b = key
        pg = table[start]
        _drop(m, start, pg, b, ordinal)
        if pg.on_host[b] or pg.on_dev[b].any():
            c["dropped"] += BLOCK  # a read-mostly duplicate: another copy is valid
        else:
            pg.on_host[b] = True
            c["written_back"] += BLOCK
        c["evicted"] += BLOCK
        freed += BLOCK
    return freed


def give_back(m: S.Machine, ordinal: int, need: int) -> None:
    """Free ``need`` bytes for a device allocation: kept memory first, then by eviction."""
    dev = m.devices[ordinal]
    if need > dev.managed_cached:
        evict(m, ordinal, need - dev.managed_cached)
    dev.managed_cached -= min(dev.managed_cached, -(-need // BLOCK) * BLOCK)


S.evict_managed = give_back


def _read_mostly(pg: Pages, b: int) -> bool:
    return bool(pg.read_mostly[b * BLOCK_PAGES:(b + 1) * BLOCK_PAGES].all())


def _to_device(start: int, pg: Pages, b: int, d: int, duplicate: bool) -> None:
    """Make block ``b`` resident on device ``d`` (a copy, if ``duplicate``)."""
    m = M()
    lru = _lru(m)[d]
    key = (start, b)
    if not pg.on_dev[b, d]:
        dev = m.devices[d]
        if dev.managed_cached < BLOCK and dev.room < BLOCK:
            evict(m, d, BLOCK, keep=key)
        if dev.managed_cached >= BLOCK:
            dev.managed_cached -= BLOCK  # memory the driver kept for managed pages
        elif dev.room < BLOCK:
            return  # device allocations hold the memory: the block stays where it is
        pg.on_dev[b, d] = True
        dev.managed_used += BLOCK
    else:
        lru.pop(key, None)
    lru[key] = None
    if not duplicate:
        for e in np.nonzero(pg.on_dev[b])[0]:
            if int(e) != d:
                _drop(m, start, pg, b, int(e))
        pg.on_host[b] = False


def _to_host(start: int, pg: Pages, b: int, duplicate: bool) -> None:
    pg.on_host[b] = True
    if not duplicate:
        m = M()
        for e in np.nonzero(pg.on_dev[b])[0]:
            _drop(m, start, pg, b, int(e))


def _blocks(p0: int, p1: int) -> range:
    return range(p0 // BLOCK_PAGES, -(-p1 // BLOCK_PAGES))


def _move(start: int, pg: Pages, p0: int, p1: int, dest: tuple[int, int]) -> None:
    """A prefetch of pages ``[p0, p1)`` to ``dest`` (a stored (type, id))."""
    for b in _blocks(p0, p1):
        dup = _read_mostly(pg, b)
        if dest[0] == DEVICE:
            _to_device(start, pg, b, dest[1], dup)
        else:
            _to_host(start, pg, b, dup)


def _stays(pg: Pages, b: int, d: int) -> bool:
    """Whether a device ``d`` access leaves block ``b`` where it is (a mapping serves it)."""
    t, i = (int(v) for v in pg.pref[b * BLOCK_PAGES])
    if t in (HOST, HOST_NUMA):
        return bool(pg.on_host[b]) and not pg.on_dev[b].any()
    if t == DEVICE and i != d:
        return bool(pg.on_dev[b, i]) and bool(pg.accessed[b * BLOCK_PAGES, d])
    return False


def device_access(a: Allocation, addr: int, n: int, d: int, write: bool) -> None:
    """Device ``d`` read (or wrote) ``[addr, addr+n)`` of managed allocation ``a``."""
    pg = _table().get(a.start)
    if pg is None or n <= 0:
        return
    p0 = (addr - a.start) // PAGE
    p1 = -(-(addr + n - a.start) // PAGE)
    for b in _blocks(p0, min(p1, pg.npages)):
        if _stays(pg, b, d):
            continue
        _to_device(a.start, pg, b, d, _read_mostly(pg, b) and not write)


def _checked(ptr: int, nbytes: int) -> tuple[Pages, int, int]:
    try:
        return _range(ptr, nbytes)
    except Fail:
        raise ValueError(f"[0x{int(ptr):x}, +{int(nbytes)}) is not a range of one managed "
                         "allocation") from None


def host_access(ptr: int, nbytes: int, write: bool = True) -> None:
    """The host read (or wrote) a managed range: its blocks fault back to the host.

    The simulator cannot see loads and stores through numpy views; tests call
    this where a program on a GPU would fault pages back. A read of a
    read-mostly block makes a host copy and keeps the device copies.
    """
    with M().lock:
        pg, p0, p1 = _checked(ptr, nbytes)
        start = _start(ptr)
        for b in _blocks(p0, p1):
            _to_host(start, pg, b, _read_mostly(pg, b) and not write)


def resident_bytes(ptr: int, nbytes: int) -> dict[int, int]:
    """Where a managed range's blocks are now: device ordinal (-1: host) -> bytes.

    Whole blocks are counted; a read-mostly block with several copies counts
    at each. The simulator's truth, which the driver does not report.
    """
    with M().lock:
        pg, p0, p1 = _checked(ptr, nbytes)
        out: dict[int, int] = {}
        for b in _blocks(p0, p1):
            if pg.on_host[b]:
                out[-1] = out.get(-1, 0) + BLOCK
            for e in np.nonzero(pg.on_dev[b])[0]:
                out[int(e)] = out.get(int(e), 0) + BLOCK
        return out


# -- argument helpers --------------------------------------------------------------


def _location(loc: Any, kinds: frozenset[int],
              bad_device: R = R.CUDA_ERROR_INVALID_VALUE) -> tuple[int, int]:
    """Resolve a ``CUmemLocation`` to a stored (type, id); HOST_NUMA_CURRENT → HOST_NUMA.

    A device that does not exist is ``bad_device``: the H100 answers
    INVALID_DEVICE from ``cuMemPrefetchAsync`` and INVALID_VALUE from
    ``cuMemAdvise`` and the batch calls.
    """
    t, i = _loc_fields(loc)
    if t not in kinds:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if t == DEVICE:
        if not 0 <= i < len(M().devices):
            raise Fail(bad_device)
        if not M().devices[i].attrs.get(int(_A.CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS)):
            raise Fail(bad_device)
        return DEVICE, i
    if t == HOST:
        return HOST, 0
    if t == HOST_NUMA:
        if i not in NUMA_NODES:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        return HOST_NUMA, i
    return HOST_NUMA, CURRENT_NODE


def _loc_fields(loc: Any) -> tuple[int, int]:
    if not isinstance(loc, cu.CUmemLocation):
        raise TypeError(f"Argument 'location' has incorrect type (expected "
                        f"cuda.bindings.driver.CUmemLocation, got {type(loc).__name__})")
    return int(loc.type), int(loc.id)


def _range(ptr: Any, count: Any) -> tuple[Pages, int, int]:
    """The page slice ``[p0, p1)`` of the managed allocation holding the range."""
    addr, n = int(ptr), int(count)
    if n <= 0:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    a = M().find(addr)
    if a is None or a.kind != "managed" or not a.start <= addr < a.end:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    pages = _table()[a.start]
    p0 = (addr - a.start) // PAGE
    p1 = -(-(addr + n - a.start) // PAGE)
    if p1 > pages.npages:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    return pages, p0, p1


def _start(ptr: Any) -> int:
    """The start of the (checked) managed allocation holding ``ptr``."""
    a = M().find(int(ptr))
    assert a is not None
    return a.start


def _stream_ok(h_stream: Any) -> int:
    m = M()
    h = int(h_stream) if h_stream is not None else 0
    if m.stream(h) is None:
        m.need_ctx()
    return h


# -- allocation and attach ---------------------------------------------------------


@api(1)
def cuMemAllocManaged(bytesize: int, flags: int) -> cu.CUdeviceptr:
    m = M()
    ordinal = m.need_ctx()
    size, f = int(bytesize), int(flags)
    if size == 0 or f not in (1, 2):
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if not m.devices[ordinal].attrs.get(int(_A.CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY)):
        raise Fail(R.CUDA_ERROR_NOT_SUPPORTED)
    backing, addr = m.host_block(size, MANAGED_ALIGN)
    m.host_used += size
    m.add(Allocation(addr, size, "managed", ordinal, addr, backing, flags=f))
    _table()[addr] = Pages(-(-size // PAGE), len(m.devices), f)
    return cu.CUdeviceptr(addr)


@api(0)
def cuStreamAttachMemAsync(hStream: Any, dptr: Any, length: int, flags: int) -> None:
    m = M()
    h = _stream_ok(hStream)
    f = int(flags)
    if f not in (1, 2, 4):
        # (the H100 crashes the process for flags 0 with length 0 or the full size)
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if f == 4 and h in (0, 1):
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    addr = int(dptr)
    a = m.allocs.get(addr)  # the allocation's start: the H100 refuses interior pointers
    if a is None or a.kind != "managed":
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if int(length) not in (0, a.size):
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    pages = _table()[a.start]
    pages.attach = f
    pages.attach_stream = h


# -- advice and prefetch -------------------------------------------------------------


@api(0)
def cuMemAdvise(devPtr: Any, count: int, advice: Any, location: Any) -> None:
    t, _i = _loc_fields(location)
    adv = int(advice)
    if not 1 <= adv <= 6:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    pg, p0, p1 = _range(devPtr, count)
    if adv in (1, 2, 4) and t not in ALL_KINDS:
        # The location is ignored for these, but its type must still be valid
        # (the H100 refuses CU_MEM_LOCATION_TYPE_INVALID, accepts device 7).
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if adv in (1, 2):
        pg.read_mostly[p0:p1] = adv == 1
    elif adv == 3:
        pg.pref[p0:p1] = _location(location, ALL_KINDS)
    elif adv == 4:
        pg.pref[p0:p1] = (INVALID, 0)
    else:
        dt, di = _location(location, ACCESS_KINDS)
        pg.accessed[p0:p1, di if dt == DEVICE else pg.ndev] = adv == 5


@api(0)
def cuMemPrefetchAsync(devPtr: Any, count: int, location: Any, flags: int, hStream: Any) -> None:
    _loc_fields(location)
    if int(flags) != 0:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    _stream_ok(hStream)
    pg, p0, p1 = _range(devPtr, count)
    dest = _location(location, ALL_KINDS, R.CUDA_ERROR_INVALID_DEVICE)
    pg.last[p0:p1] = dest
    pg.discarded[p0:p1] = False
    _move(_start(devPtr), pg, p0, p1, dest)


# -- batch calls (CUDA >= 13.0) ---------------------------------------------------------


def _need_batch(name: str) -> None:
    if not S.MACHINE.batch_calls:
        raise S.FunctionNotFoundError(f'Function "{name}" not found')


def _list_arg(name: str, value: Any, count: Any, typ: type, typename: str) -> list[Any]:
    """The bindings' own checks on a list argument (before any driver call)."""
    items = [] if value is None else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(v, typ) for v in items):
        raise TypeError(f"Argument '{name}' is not instance of type (expected "
                        f"tuple[cydriver.{typename},] or list[cydriver.{typename},]")
    if int(count) > len(items):
        raise RuntimeError(f"List is too small: {len(items)} < {int(count)}")
    return list(items)


def _int_list(value: Any, count: Any) -> list[int]:
    items = list(value) if value is not None else []
    if int(count) > len(items):
        raise RuntimeError(f"List is too small: {len(items)} < {int(count)}")
    return [int(v) for v in items]


def _batch_head(count: Any, flags: Any, hStream: Any) -> int:
    n = int(count)
    if int(flags) != 0 or n == 0:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    h = int(hStream) if hStream is not None else 0
    if h in (0, 1):  # the legacy NULL stream is refused
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    _stream_ok(h)
    return n


def _batch_ranges(dptrs: list[Any], sizes: list[int], n: int) -> list[tuple[Pages, int, int]]:
    return [_range(dptrs[k], sizes[k]) for k in range(n)]


def _batch_dests(locs: list[Any], idxs: list[int], nlocs: Any, n: int) -> list[tuple[int, int]]:
    """Destination of each operation.

    The H100 checks ``0 < numLocs <= count``, ``idxs[0] == 0`` and every index
    ``< count``; it does not check that the indices increase.
    """
    k = int(nlocs)
    if k == 0 or k > n:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    starts = idxs[:k]
    if starts[0] != 0 or any(not 0 <= x < n for x in starts):
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    resolved = [_location(loc, ALL_KINDS) for loc in locs[:k]]
    out = [resolved[0]] * n
    for j in range(k):
        end = starts[j + 1] if j + 1 < k else n
        for op in range(starts[j], end):
            out[op] = resolved[j]
    return out


@api(0)
def _prefetch_batch(dptrs: list[Any], sizes: list[int], count: int, locs: list[Any],
                    idxs: list[int], nlocs: int, flags: int, hStream: Any,
                    discard: bool) -> None:
    n = _batch_head(count, flags, hStream)
    ranges = _batch_ranges(dptrs, sizes, n)
    dests = _batch_dests(locs, idxs, nlocs, n)
    for k, ((pg, p0, p1), dest) in enumerate(zip(ranges, dests, strict=True)):
        pg.last[p0:p1] = dest
        pg.discarded[p0:p1] = False
        if discard:
            _discard_blocks(_start(dptrs[k]), pg, p0, p1)
        _move(_start(dptrs[k]), pg, p0, p1, dest)


@api(0)
def _discard_batch(dptrs: list[Any], sizes: list[int], count: int, flags: int,
                   hStream: Any) -> None:
    n = _batch_head(count, flags, hStream)
    for k, (pg, p0, p1) in enumerate(_batch_ranges(dptrs, sizes, n)):
        pg.discarded[p0:p1] = True
        _discard_blocks(_start(dptrs[k]), pg, p0, p1)


def _discard_blocks(start: int, pg: Pages, p0: int, p1: int) -> None:
    """Drop the copies of the blocks wholly inside ``[p0, p1)`` (no write-back)."""
    m = M()
    for b in range(-(-p0 // BLOCK_PAGES), p1 // BLOCK_PAGES if p1 < pg.npages
                   else -(-p1 // BLOCK_PAGES)):
        for e in np.nonzero(pg.on_dev[b])[0]:
            _drop(m, start, pg, b, int(e))
        pg.on_host[b] = False


def _prefetch_call(name: str, dptrs: Any, sizes: Any, count: int, prefetchLocs: Any,
                   prefetchLocIdxs: Any, numPrefetchLocs: int, flags: int,
                   hStream: Any) -> Any:
    """A prefetch batch call; discarding first leaves the pages' state as prefetching does."""
    _need_batch(name)
    d = _list_arg("dptrs", dptrs, count, cu.CUdeviceptr, "CUdeviceptr")
    s = _int_list(sizes, count)
    locs = _list_arg("prefetchLocs", prefetchLocs, numPrefetchLocs, cu.CUmemLocation,
                     "CUmemLocation")
    idxs = _int_list(prefetchLocIdxs, numPrefetchLocs)
    return _prefetch_batch(d, s, count, locs, idxs, numPrefetchLocs, flags, hStream,
                           name == "cuMemDiscardAndPrefetchBatchAsync")


def cuMemPrefetchBatchAsync(dptrs: Any, sizes: Any, count: int, prefetchLocs: Any,
                            prefetchLocIdxs: Any, numPrefetchLocs: int, flags: int,
                            hStream: Any) -> Any:
    return _prefetch_call("cuMemPrefetchBatchAsync", dptrs, sizes, count, prefetchLocs,
                          prefetchLocIdxs, numPrefetchLocs, flags, hStream)


def cuMemDiscardBatchAsync(dptrs: Any, sizes: Any, count: int, flags: int,
                           hStream: Any) -> Any:
    _need_batch("cuMemDiscardBatchAsync")
    d = _list_arg("dptrs", dptrs, count, cu.CUdeviceptr, "CUdeviceptr")
    s = _int_list(sizes, count)
    return _discard_batch(d, s, count, flags, hStream)


def cuMemDiscardAndPrefetchBatchAsync(dptrs: Any, sizes: Any, count: int, prefetchLocs: Any,
                                      prefetchLocIdxs: Any, numPrefetchLocs: int, flags: int,
                                      hStream: Any) -> Any:
    return _prefetch_call("cuMemDiscardAndPrefetchBatchAsync", dptrs, sizes, count,
                          prefetchLocs, prefetchLocIdxs, numPrefetchLocs, flags, hStream)


# -- range attributes ----------------------------------------------------------------


def _uniform(rows: np.ndarray) -> tuple[int, int]:
    """The (type, id) every page shares, or (INVALID, 0)."""
    first = rows[0]
    if (rows == first).all():
        return int(first[0]), int(first[1])
    return INVALID, 0


def _legacy(t: int, i: int) -> int:
    if t == DEVICE:
        return i
    if t in (HOST, HOST_NUMA):
        return DEVICE_CPU
    return DEVICE_INVALID


def _loc_id(t: int, i: int) -> int:
    if t in (DEVICE, HOST_NUMA):
        return i
    return DEVICE_CPU if t == HOST else DEVICE_INVALID


def _attribute(pg: Pages, p0: int, p1: int, attr: int, size: int) -> Any:
    if attr == int(_RA.CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY):
        return int(pg.read_mostly[p0:p1].all())
    if attr == int(_RA.CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY):
        every: np.ndarray = np.asarray(pg.accessed[p0:p1].all(axis=0))
        ids = [d for d in range(pg.ndev) if every[d]]
        if every[pg.ndev]:
            ids.append(DEVICE_CPU)
        slots = size // 4
        return (ids + [DEVICE_INVALID] * slots)[:slots]
    pref = _uniform(pg.pref[p0:p1])
    last = _uniform(pg.last[p0:p1])
    table = {
        int(_RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION): _legacy(*pref),
        int(_RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE): pref[0],
        int(_RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID): _loc_id(*pref),
        int(_RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION): _legacy(*last),
        int(_RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE): last[0],
        int(_RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID): _loc_id(*last),
    }
    return table[attr]


def _check_size(attr: int, size: int) -> None:
    known = {int(a) for a in _RA}
    if attr not in known:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if attr == int(_RA.CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY):
        if size <= 0 or size % 4:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    elif size != 4:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)


@api(1)
def _range_attribute(size: int, attr: int, devPtr: Any, count: int) -> Any:
    _check_size(attr, size)
    pg, p0, p1 = _range(devPtr, count)
    return _attribute(pg, p0, p1, attr, size)


#: Whether the installed cuda.bindings can read the ``*_TYPE`` / ``*_ID`` range
#: attributes: 13.3 cannot (its helper raises ``TypeError: Unsupported attribute``
#: before calling the driver, as the H100 probe recorded); later versions can.
#: ``None``: find out on first use. Tests may set it.
TYPED_RANGE_ATTRIBUTES: bool | None = None
_TYPED = frozenset(int(a) for a in (
    _RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE,
    _RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID,
    _RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE,
    _RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID,
))


def _typed_supported() -> bool:
    global TYPED_RANGE_ATTRIBUTES
    if TYPED_RANGE_ATTRIBUTES is None:
        try:  # the bindings build their result helper before touching the driver
            cu.cuMemRangeGetAttribute(4, _RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE, 0, 0)
            TYPED_RANGE_ATTRIBUTES = True
        except TypeError:
            TYPED_RANGE_ATTRIBUTES = False
        except Exception:  # no libcuda: the helper accepted the attribute
            TYPED_RANGE_ATTRIBUTES = True
    return TYPED_RANGE_ATTRIBUTES


def _bindings_accept(attr: Any) -> int:
    a = int(attr.value)  # the bindings read .value (an int raises AttributeError)
    if a in _TYPED and not _typed_supported():
        raise TypeError(f"Unsupported attribute: {attr.name}")
    return a


def cuMemRangeGetAttribute(dataSize: int, attribute: Any, devPtr: Any, count: int) -> Any:
    attr = _bindings_accept(attribute)
    return _range_attribute(int(dataSize), attr, devPtr, count)


@api(1)
def _range_attributes(sizes: list[int], attrs: list[int], devPtr: Any, count: int) -> list[Any]:
    if not attrs:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    for a, s in zip(attrs, sizes, strict=True):
        _check_size(a, s)
    pg, p0, p1 = _range(devPtr, count)
    return [_attribute(pg, p0, p1, a, s) for a, s in zip(attrs, sizes, strict=True)]


def cuMemRangeGetAttributes(dataSizes: Any, attributes: Any, numAttributes: int, devPtr: Any,
                            count: int) -> Any:
    attrs = _list_arg("attributes", attributes, numAttributes, cu.CUmem_range_attribute,
                      "CUmem_range_attribute")
    sizes = _int_list(dataSizes, numAttributes)
    k = int(numAttributes)
    codes = [_bindings_accept(a) for a in attrs[:k]]
    return _range_attributes(sizes[:k], codes, devPtr, count)
