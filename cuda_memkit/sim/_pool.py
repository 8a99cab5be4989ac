"""Simulated stream-ordered memory pools (``cuMemPool*``, ``cuMemAllocFromPoolAsync``).

The model follows what the H100 showed (``tests/conformance/h100_probe.json``,
section E):

* A pool is one contiguous address range. Allocations are placed first-fit
  from its start, 512-byte aligned (1 KiB at offset 0, then 1 MiB at 1024,
  3 MiB at 1 MiB + 1 KiB, ...); an allocation may straddle chunk boundaries.
* Physical memory backs the range in 32 MiB chunks (device and pinned host
  pools alike): ``RESERVED_MEM_CURRENT`` is 32 MiB times the chunks mapped,
  ``USED_MEM_CURRENT`` the bytes of live allocations, dropping at the free.
* Only chunks that no live allocation touches are released: by
  ``cuMemPoolTrimTo(keep)`` (highest first, never below ``keep``) and, down
  to the release threshold, when frees complete. The GPU does the latter at
  the next stream/event/context synchronize; simulated frees complete at
  once, so the simulator releases at the free. Read statistics after a
  synchronize and both backends agree.
* ``MAX_POOL_SIZE`` is rounded up to the chunk size and caps the reserved
  memory (``CUDA_ERROR_OUT_OF_MEMORY`` beyond it).
* Device-pool allocations are kind ``"pool"`` in the allocation table
  (addresses in the device window, private backing), host-located ones
  ``"host_pool"`` (real host memory whose address is the host address) and
  managed ones ``"managed"``.
* Imported pools answer no attribute queries and cannot allocate (as on the
  H100). IPC works inside one simulated process: an exported pool is a real
  file descriptor (a memfd naming the pool), an exported pointer 64 bytes
  naming the pool and allocation; an imported pointer maps the same backing
  memory at a new address.
"""

from __future__ import annotations

import bisect
import ctypes
import os
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cuda.bindings import driver as cu

from . import _state as S
from ._state import Allocation, Fail, R, api

__all__ = [
    "cuDeviceGetDefaultMemPool",
    "cuDeviceGetMemPool",
    "cuMemAllocAsync",
    "cuMemAllocFromPoolAsync",
    "cuMemFreeAsync",
    "cuMemGetDefaultMemPool",
    "cuMemGetMemPool",
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    "cuMemPoolExportPointer",
    "cuMemPoolExportToShareableHandle",
    "cuMemPoolGetAccess",
    "cuMemPoolGetAttribute",
    "cuMemPoolImportFromShareableHandle",
    "cuMemPoolImportPointer",
    "cuMemPoolSetAccess",
    "cuMemPoolSetAttribute",
    "cuMemPoolTrimTo",
]

MiB = 1 << 20
#: Physical memory is mapped into a pool in chunks of this size.
CHUNK = 32 * MiB
#: Alignment of allocations inside a pool.
ALIGN = 512
#: Size of an exported pointer (``CUmemPoolPtrExportData``).
EXPORT_DATA_SIZE = 64

_A = cu.CUmemPool_attribute
_U64_ATTRS = {
    int(_A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD),
    int(_A.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
    int(_A.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH),
    int(_A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
    int(_A.CU_MEMPOOL_ATTR_USED_MEM_HIGH),
    int(_A.CU_MEMPOOL_ATTR_MAX_POOL_SIZE),
}
_REUSE_ATTRS = {
    int(_A.CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES): "follow_event",
    int(_A.CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC): "opportunistic",
    int(_A.CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES): "internal",
}
_LOC_NONE, _LOC_DEVICE, _LOC_HOST, _LOC_HOST_NUMA, _LOC_HOST_NUMA_CURRENT = 0, 1, 2, 3, 4
_TYPE_PINNED, _TYPE_MANAGED = 1, 2
_HANDLE_POSIX_FD, _HANDLE_FABRIC = 1, 8
_PROT_NONE, _PROT_READ, _PROT_RW = 0, 1, 3
_MAGIC = b"CMKSIMPL"
_PTR_MAGIC = b"CMKSIMPT"


def round_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


@dataclass
class SimPool:
    handle: int
    alloc_type: int
    loc_type: int
    loc_id: int
    handle_types: int
    max_size: int  # rounded to CHUNK; 0: no limit
    window: int  # bytes of address range
    base: int = 0  # device pools: start of the address range
    default: bool = False
    source: SimPool | None = None  # imported pools: the exporting pool
    threshold: int = 0
    reuse: dict[str, int] = field(
        default_factory=lambda: {"follow_event": 1, "opportunistic": 1, "internal": 1})
    offs: list[int] = field(default_factory=list)  # sorted offsets of live allocations
    sizes: dict[int, int] = field(default_factory=dict)  # offset -> size
    chunks: set[int] = field(default_factory=set)  # mapped chunk indices
    used: int = 0
    used_high: int = 0
    reserved_high: int = 0
    live: int = 0  # live allocations, imported mappings included
    access: dict[int, int] = field(default_factory=dict)  # device -> flags
    destroyed: bool = False
    exported: bool = False  # cuMemPoolExportToShareableHandle was called (pointer export needs it)

    @property
    def reserved(self) -> int:
        return len(self.chunks) * CHUNK

    @property
    def is_managed(self) -> bool:
        return self.alloc_type == _TYPE_MANAGED

    @property
    def is_host(self) -> bool:
        return not self.is_managed and self.loc_type in (_LOC_HOST, _LOC_HOST_NUMA)

    @property
    def on_device(self) -> bool:
        return not self.is_managed and self.loc_type == _LOC_DEVICE


def M() -> S.Machine:
    return S.MACHINE


def _created() -> dict[int, SimPool]:
    """Pools made by cuMemPoolCreate / import (counted by the leak check)."""
    table: dict[int, SimPool] = M().ext.setdefault("pool.pools", {})
    return table


class _Defaults:
    """Default pools, made on first use; not a leak, so not sized for the leak check."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[int, int, int], SimPool] = {}


def _default_pool(alloc_type: int, loc_type: int, loc_id: int) -> SimPool:
    defaults: _Defaults = M().ext.setdefault("pool.defaults", _Defaults())
    key = (alloc_type, loc_type, loc_id)
    pool = defaults.by_key.get(key)
    if pool is None:
        pool = _new_pool(alloc_type, loc_type, loc_id, 0, 0)
        pool.default = True
        defaults.by_key[key] = pool
    return pool


def _lookup(handle: int) -> SimPool | None:
    pool = _created().get(handle)
    if pool is None:
        defaults: _Defaults | None = M().ext.get("pool.defaults")
        for p in defaults.by_key.values() if defaults else ():
            if p.handle == handle:
                return p
    return pool


def _pool(handle: Any) -> SimPool:
    pool = _lookup(int(handle) if handle is not None else 0)
    if pool is None or pool.destroyed:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    return pool


def _new_pool(alloc_type: int, loc_type: int, loc_id: int, handle_types: int,
              max_size: int) -> SimPool:
    m = M()
    if loc_type == _LOC_DEVICE and alloc_type == _TYPE_PINNED:
        capacity = m.devices[loc_id].total_mem
    else:
        capacity = m.host_memory
    window = round_up(max_size or capacity, CHUNK)
    pool = SimPool(m.new_handle(), alloc_type, loc_type, loc_id, handle_types, max_size, window)
    if pool.on_device:
        pool.base = m.reserve_va(window, CHUNK)
    return pool


# -- chunks and placement --------------------------------------------------------------


def _charge(pool: SimPool, nchunks: int) -> None:
    m = M()
    nbytes = nchunks * CHUNK
    if pool.on_device:
        m.charge(pool.loc_id, nbytes)
    else:
        if m.host_used + nbytes > m.host_memory:
            raise Fail(R.CUDA_ERROR_OUT_OF_MEMORY)
        m.host_used += nbytes


def _uncharge(pool: SimPool, nchunks: int) -> None:
    m = M()
    if pool.on_device:
        m.uncharge(pool.loc_id, nchunks * CHUNK)
    else:
        m.host_used -= nchunks * CHUNK


def _busy(pool: SimPool) -> set[int]:
    busy: set[int] = set()
    for off in pool.offs:
        busy.update(range(off // CHUNK, (off + pool.sizes[off] - 1) // CHUNK + 1))
    return busy


def _release(pool: SimPool, keep: int, *, at_least: bool) -> None:
    """Unmap idle chunks, highest first, while reserved > ``keep``.

    With ``at_least`` (cuMemPoolTrimTo), never go below ``keep``.
    """
    idle = sorted(pool.chunks - _busy(pool), reverse=True)
    n = 0
    for c in idle:
        left = pool.reserved - CHUNK
        if pool.reserved <= keep or (at_least and left < keep):
            break
        pool.chunks.discard(c)
        n += 1
    if n:
        _uncharge(pool, n)


def _place(pool: SimPool, size: int) -> int:
    """First-fit offset for ``size`` bytes."""
    start = 0
    for off in pool.offs:
        if off - start >= size:
            break
        start = max(start, round_up(off + pool.sizes[off], ALIGN))
    return start


def _allocate(pool: SimPool, size: int) -> int:
    if size > pool.window:
        raise Fail(R.CUDA_ERROR_OUT_OF_MEMORY)
    off = _place(pool, size)
    if off + size > pool.window:
        raise Fail(R.CUDA_ERROR_OUT_OF_MEMORY)
    new = set(range(off // CHUNK, (off + size - 1) // CHUNK + 1)) - pool.chunks
    if pool.max_size and pool.reserved + len(new) * CHUNK > pool.max_size:
        raise Fail(R.CUDA_ERROR_OUT_OF_MEMORY)
    if new:
        _charge(pool, len(new))
        pool.chunks |= new
    pool.reserved_high = max(pool.reserved_high, pool.reserved)
    bisect.insort(pool.offs, off)
    pool.sizes[off] = size
    pool.used += size
    pool.used_high = max(pool.used_high, pool.used)
    pool.live += 1
    return off


def _alloc_call(pool: SimPool, size: int, stream: Any) -> int:
    m = M()
    s = m.stream(stream)
    ctx_device = s.device if s is not None else m.need_ctx()
    if pool.source is not None:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if size == 0:
        return 0
    off = _allocate(pool, size)
    extra: dict[str, Any] = {"pool": pool.handle, "offset": off}
    if pool.on_device:
        backing = np.empty(size, np.uint8)
        addr, real, device = pool.base + off, int(backing.ctypes.data), pool.loc_id
    else:
        try:
            backing, real = m.host_block(size)
        except Fail:
            _forget_offset(pool, off)
            raise
        addr, device = real, -1
        extra["ctx_device"] = ctx_device
    kind = "managed" if pool.is_managed else ("pool" if pool.on_device else "host_pool")
    m.add(Allocation(addr, size, kind, device, real, backing, 1 if pool.is_managed else 0,
                     extra))
    if pool.is_managed:  # hint state, as cuMemAllocManaged keeps it; the pool's location
        from ._managed import TABLE, Pages  # is every page's preferred location

        pages = Pages(-(-size // S.PAGE), len(m.devices), 1)
        if pool.loc_type != _LOC_NONE:
            pages.pref[:] = (pool.loc_type, pool.loc_id)
        m.ext.setdefault(TABLE, {})[addr] = pages
    return addr


def _forget_offset(pool: SimPool, off: int) -> None:
    size = pool.sizes.pop(off)
    pool.offs.remove(off)
    pool.used -= size
    pool.live -= 1


def _free(a: Allocation) -> None:
    m = M()
    m.remove(a)
    if a.kind == "managed" and "alias_of" not in a.extra:
        from ._managed import forget_pages

        forget_pages(m, a)
    pool = _lookup(a.extra["pool"])
    assert pool is not None
    if "alias_of" in a.extra:  # an imported pointer: only this mapping goes
        pool.live -= 1
    else:
        _forget_offset(pool, a.extra["offset"])
        if not pool.destroyed:
            _release(pool, pool.threshold, at_least=False)
    if pool.destroyed and pool.live == 0:
        _release(pool, 0, at_least=False)
        _created().pop(pool.handle, None)


# -- allocation --------------------------------------------------------------------------


@api(1)
def cuDeviceGetDefaultMemPool(dev: Any) -> cu.CUmemoryPool:
    d = M().device(dev)
    return cu.CUmemoryPool(_default_pool(_TYPE_PINNED, _LOC_DEVICE, d.ordinal).handle)


@api(1)
def cuDeviceGetMemPool(dev: Any) -> cu.CUmemoryPool:
    d = M().device(dev)
    return cu.CUmemoryPool(_default_pool(_TYPE_PINNED, _LOC_DEVICE, d.ordinal).handle)


def _default_for(location: Any, typename: Any) -> SimPool:
    if location is None:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    alloc_type, loc_type, loc_id = int(typename), int(location.type), int(location.id)
    if loc_type == _LOC_DEVICE:
        if not 0 <= loc_id < len(M().devices):
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    elif loc_type in (_LOC_HOST, _LOC_NONE):
        loc_id = 0
    elif loc_type != _LOC_HOST_NUMA or loc_id != 0:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if alloc_type == _TYPE_PINNED and loc_type != _LOC_NONE:
        return _default_pool(alloc_type, loc_type, loc_id)
    if alloc_type == _TYPE_MANAGED:
        return _default_pool(alloc_type, loc_type, loc_id)
    raise Fail(R.CUDA_ERROR_INVALID_VALUE)


@api(1)
def cuMemGetDefaultMemPool(location: Any, typename: Any) -> cu.CUmemoryPool:
    return cu.CUmemoryPool(_default_for(location, typename).handle)


@api(1)
def cuMemGetMemPool(location: Any, typename: Any) -> cu.CUmemoryPool:
    return cu.CUmemoryPool(_default_for(location, typename).handle)


def _size_t(value: Any) -> int:
    size = int(value)
    if size < 0:
        raise OverflowError("can't convert negative value to size_t")
    return size


@api(1)
def cuMemAllocFromPoolAsync(bytesize: int, pool: Any, hStream: Any) -> cu.CUdeviceptr:
    size = _size_t(bytesize)
    return cu.CUdeviceptr(_alloc_call(_pool(pool), size, hStream))


@api(1)
def cuMemAllocAsync(bytesize: int, hStream: Any) -> cu.CUdeviceptr:
    size = _size_t(bytesize)
    m = M()
    s = m.stream(hStream)
    ordinal = s.device if s is not None else m.need_ctx()
    return cu.CUdeviceptr(
        _alloc_call(_default_pool(_TYPE_PINNED, _LOC_DEVICE, ordinal), size, hStream))


@api(0)
def cuMemFreeAsync(dptr: Any, hStream: Any) -> None:
    m = M()
    if m.stream(hStream) is None:
        m.need_ctx()
    addr = int(dptr)
    if addr == 0:
        return
    a = m.allocs.get(addr)
    if a is not None and a.kind == "device":  # the H100 frees cuMemAlloc memory too
        m.remove(a)
        m.uncharge(a.device, a.size)
        return
    if a is None or "pool" not in a.extra:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    _free(a)


# -- pools -------------------------------------------------------------------------------


def _check_props(props: Any) -> tuple[int, int, int, int, int]:
    m = M()
    if props is None:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    alloc_type = int(props.allocType)
    handle_types = int(props.handleTypes)
    loc_type = int(props.location.type)
    loc_id = int(props.location.id)
    max_size = int(props.maxSize)
    if handle_types & ~(_HANDLE_POSIX_FD | _HANDLE_FABRIC):
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    A = cu.CUdevice_attribute
    attrs0 = m.devices[0].attrs
    if alloc_type == _TYPE_PINNED:
        if loc_type == _LOC_DEVICE:
            if not 0 <= loc_id < len(m.devices):
                raise Fail(R.CUDA_ERROR_INVALID_VALUE)
            if not m.devices[loc_id].attrs.get(int(A.CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)):
                raise Fail(R.CUDA_ERROR_NOT_SUPPORTED)
        elif loc_type == _LOC_HOST:
            if handle_types:
                raise Fail(R.CUDA_ERROR_INVALID_VALUE)
            if not attrs0.get(int(A.CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED)):
                raise Fail(R.CUDA_ERROR_NOT_SUPPORTED)
            loc_id = 0
        elif loc_type == _LOC_HOST_NUMA:
            if loc_id != attrs0.get(int(A.CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID), 0):
                raise Fail(R.CUDA_ERROR_INVALID_VALUE)
            if handle_types:  # the simulator shares no host memory between processes
                raise Fail(R.CUDA_ERROR_NOT_SUPPORTED)
            if not attrs0.get(int(A.CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED)):
                raise Fail(R.CUDA_ERROR_NOT_SUPPORTED)
        else:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    elif alloc_type == _TYPE_MANAGED:
        if handle_types or max_size:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        if loc_type == _LOC_DEVICE:
            if not 0 <= loc_id < len(m.devices):
                raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        elif loc_type in (_LOC_NONE, _LOC_HOST):
            loc_id = 0
        else:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        cma = int(A.CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS)
        if not all(d.attrs.get(cma) for d in m.devices):
            raise Fail(R.CUDA_ERROR_NOT_SUPPORTED)
    else:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    return alloc_type, loc_type, loc_id, handle_types, round_up(max_size, CHUNK)


@api(1)
def cuMemPoolCreate(poolProps: Any) -> cu.CUmemoryPool:
    pool = _new_pool(*_check_props(poolProps))
    _created()[pool.handle] = pool
    return cu.CUmemoryPool(pool.handle)


@api(0)
def cuMemPoolDestroy(pool: Any) -> None:
    p = _pool(pool)
    if p.default:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    p.destroyed = True
    if p.live == 0:
        _release(p, 0, at_least=False)
        _created().pop(p.handle, None)


@api(0)
def cuMemPoolTrimTo(pool: Any, minBytesToKeep: int) -> None:
    keep = _size_t(minBytesToKeep)
    p = _pool(pool)
    if p.source is None:
        _release(p, keep, at_least=True)


# -- attributes ---------------------------------------------------------------------------


def _attr_key(attr: Any) -> int:
    if not isinstance(attr, cu.CUmemPool_attribute):  # as the bindings do
        raise AttributeError(f"'{type(attr).__name__}' object has no attribute 'value'")
    return int(attr)


def _u64(value: Any) -> int:
    """The bindings read 64-bit attributes through ``value.getPtr()``."""
    if not isinstance(value, cu.cuuint64_t):
        raise AttributeError(f"'{type(value).__name__}' object has no attribute 'getPtr'")
    return int(value)


@api(1)
def cuMemPoolGetAttribute(pool: Any, attr: Any) -> Any:
    key = _attr_key(attr)
    p = _pool(pool)
    if p.source is not None:  # the H100 answers no query on an imported pool
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if key in _REUSE_ATTRS:
        return p.reuse[_REUSE_ATTRS[key]]
    A = _A
    u64 = {
        int(A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD): p.threshold,
        int(A.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT): p.reserved,
        int(A.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH): p.reserved_high,
        int(A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT): p.used,
        int(A.CU_MEMPOOL_ATTR_USED_MEM_HIGH): p.used_high,
        int(A.CU_MEMPOOL_ATTR_MAX_POOL_SIZE): p.max_size,
    }
    if key in u64:
        return cu.cuuint64_t(u64[key])
    other = {
        int(A.CU_MEMPOOL_ATTR_ALLOCATION_TYPE): p.alloc_type,
        int(A.CU_MEMPOOL_ATTR_EXPORT_HANDLE_TYPES): p.handle_types,
        int(A.CU_MEMPOOL_ATTR_LOCATION_TYPE): p.loc_type,
        int(A.CU_MEMPOOL_ATTR_LOCATION_ID): p.loc_id,
        int(A.CU_MEMPOOL_ATTR_HW_DECOMPRESS_ENABLED): 0,
        int(A.CU_MEMPOOL_ATTR_LOCALITY_DOMAIN_ID): -1,
    }
    if key in other:
        return other[key]
    raise Fail(R.CUDA_ERROR_INVALID_VALUE)


@api(0)
def cuMemPoolSetAttribute(pool: Any, attr: Any, value: Any) -> None:
    key = _attr_key(attr)
    v = _u64(value) if key in _U64_ATTRS else int(value)
    p = _pool(pool)
    if p.source is not None:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    A = _A
    if key in _REUSE_ATTRS:
        p.reuse[_REUSE_ATTRS[key]] = 1 if v else 0
    elif key == int(A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD):
        p.threshold = v
    elif key == int(A.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) and v == 0:
        p.reserved_high = p.reserved
    elif key == int(A.CU_MEMPOOL_ATTR_USED_MEM_HIGH) and v == 0:
        p.used_high = p.used
    else:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)


# -- access ----------------------------------------------------------------------------------


@api(0)
def cuMemPoolSetAccess(pool: Any, map: Any, count: int) -> None:
    p = _pool(pool)
    n = int(count)
    descs = list(map or [])
    if n > len(descs):
        raise RuntimeError(f"List is too small: {len(descs)} < {n}")  # as the bindings do
    if n == 0:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    ndev = len(M().devices)
    updates: dict[int, int] = {}
    for desc in descs[:n]:
        loc_type, ordinal, flags = int(desc.location.type), int(desc.location.id), int(desc.flags)
        if loc_type != _LOC_DEVICE or flags == _PROT_READ:
            raise Fail(R.CUDA_ERROR_NOT_SUPPORTED)
        if flags not in (_PROT_NONE, _PROT_RW) or not 0 <= ordinal < ndev:
            raise Fail(R.CUDA_ERROR_INVALID_DEVICE)
        if p.on_device and ordinal == p.loc_id:
            if flags != _PROT_RW:  # the owning device keeps its access
                raise Fail(R.CUDA_ERROR_INVALID_DEVICE)
            continue
        updates[ordinal] = flags
    p.access.update(updates)


@api(1)
def cuMemPoolGetAccess(memPool: Any, location: Any) -> cu.CUmemAccess_flags:
    p = _pool(memPool)
    if location is None:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    loc_type, loc_id = int(location.type), int(location.id)
    F = cu.CUmemAccess_flags
    if loc_type == _LOC_DEVICE:
        if not 0 <= loc_id < len(M().devices):
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        if (p.on_device and loc_id == p.loc_id) or p.is_managed:
            return F.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        return F(p.access.get(loc_id, _PROT_NONE))
    if loc_type in (_LOC_HOST, _LOC_HOST_NUMA, _LOC_HOST_NUMA_CURRENT):
        rw = p.is_host or p.is_managed
        return F.CU_MEM_ACCESS_FLAGS_PROT_READWRITE if rw else F.CU_MEM_ACCESS_FLAGS_PROT_NONE
    raise Fail(R.CUDA_ERROR_INVALID_VALUE)


# -- IPC ---------------------------------------------------------------------------------------


def _token() -> int:
    """Names this simulated machine, so blobs from before a reset are refused."""
    return (id(M()) ^ os.getpid()) & 0xFFFF_FFFF_FFFF_FFFF


@api(1)
def cuMemPoolExportToShareableHandle(pool: Any, handleType: Any, flags: int) -> int:
    p = _pool(pool)
    if int(flags) != 0 or int(handleType) != _HANDLE_POSIX_FD:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if p.source is not None or not p.handle_types & _HANDLE_POSIX_FD:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    fd = os.memfd_create("cuda_memkit-sim-pool", os.MFD_CLOEXEC)
    os.write(fd, _MAGIC + struct.pack("<QQ", _token(), p.handle))
    p.exported = True
    return fd


@api(1)
def cuMemPoolImportFromShareableHandle(handle: Any, handleType: Any, flags: int) -> Any:
    if int(flags) != 0 or int(handleType) != _HANDLE_POSIX_FD:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    try:
        raw = os.pread(int(handle), 24, 0)
    except OSError:
        raise Fail(R.CUDA_ERROR_UNKNOWN) from None
    if len(raw) != 24 or raw[:8] != _MAGIC:
        raise Fail(R.CUDA_ERROR_UNKNOWN)
    token, src_handle = struct.unpack("<QQ", raw[8:])
    src = _created().get(src_handle)
    if token != _token() or src is None or src.destroyed:
        raise Fail(R.CUDA_ERROR_UNKNOWN)
    pool = SimPool(M().new_handle(), src.alloc_type, src.loc_type, src.loc_id, 0,
                   src.max_size, src.window, source=src)
    _created()[pool.handle] = pool
    return cu.CUmemoryPool(pool.handle)


@api(1)
def cuMemPoolExportPointer(ptr: Any) -> cu.CUmemPoolPtrExportData:
    a = M().allocs.get(int(ptr))
    pool = _lookup(a.extra.get("pool", 0)) if a is not None else None
    if a is None or pool is None or "alias_of" in a.extra or pool.source is not None:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if not pool.handle_types & _HANDLE_POSIX_FD or not pool.exported:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)  # the H100 wants the pool exported first
    data = cu.CUmemPoolPtrExportData()
    blob = _PTR_MAGIC + struct.pack("<QQQQ", _token(), pool.handle, a.start, a.size)
    ctypes.memmove(data.getPtr(), blob.ljust(EXPORT_DATA_SIZE, b"\0"), EXPORT_DATA_SIZE)
    return data


@api(1)
def cuMemPoolImportPointer(pool: Any, shareData: Any) -> cu.CUdeviceptr:
    p = _pool(pool)
    if shareData is None:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    blob = ctypes.string_at(shareData.getPtr(), EXPORT_DATA_SIZE)
    if blob[:8] != _PTR_MAGIC:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    token, src_handle, start, size = struct.unpack("<QQQQ", blob[8:40])
    if token != _token() or p.source is None or p.source.handle != src_handle:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    m = M()
    a = m.allocs.get(start)
    if a is None or a.extra.get("pool") != src_handle or a.size != size:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    va = m.reserve_va(size, ALIGN)
    extra = dict(a.extra, pool=p.handle, alias_of=start)
    m.add(Allocation(va, size, a.kind, a.device, a.host, a.backing, a.flags, extra))
    p.live += 1
    return cu.CUdeviceptr(va)
