"""Simulated virtual memory management (VMM) driver functions.

Model
-----
* ``vmm.ranges``: address reservations (``cuMemAddressReserve``), by start
  address. Reservations come from the device VA window of the machine and are
  aligned to the granularity (2 MiB).
* ``vmm.handles``: allocation handles (``cuMemCreate``, import, retain) ->
  ``[physical allocation, reference count]``. Several handles may name the
  same physical allocation (an import in the same process, a retain).
* ``vmm.mappings``: live mappings by start address. Each mapping is also an
  ``Allocation(kind="vmm")`` in the machine's allocation table, backed by the
  physical allocation's own buffer, so copies and memsets work on it and two
  mappings of one physical allocation alias the same bytes.
* A physical allocation is charged to its device (or to the host) from
  ``cuMemCreate`` until it has neither handles nor mappings: ``cuMemRelease``
  of a mapped allocation succeeds and the memory lives until the last unmap,
  as on the GPU.
* Export to a POSIX file descriptor returns a real descriptor (a memfd) that
  names nothing but itself; import finds the allocation by the descriptor's
  inode. Only this process's simulator can import it. The simulated driver does
  not track when the descriptor is closed: an export does not keep memory alive.
* Access flags are recorded per mapping and location and read back by
  ``cuMemGetAccess``. Copies and memsets through a mapping need access for the
  current context's device (READ to read, READWRITE to write); without it they
  fail with ``CUDA_ERROR_INVALID_VALUE``, as on the H100 (no fault).
* Address hints (``cuMemAddressReserve(addr=...)``) are honoured only inside
  address space the machine has already handed out (e.g. a freed range); the
  H100 placed a range elsewhere when asked for a free address far away.

The error codes for each misuse are in :data:`MISUSE`, chosen to match what the
H100 returns (``tests/conformance/h100_probe.json``, section D).
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass, field
from typing import Any

from cuda.bindings import driver as cu

from . import _state as S
from ._state import Allocation, Fail, R, api

__all__ = [
    "cuMemAddressFree",
    "cuMemAddressReserve",
    "cuMemCreate",
    "cuMemExportToShareableHandle",
    "cuMemGetAccess",
    "cuMemGetAllocationGranularity",
    "cuMemGetAllocationPropertiesFromHandle",
    "cuMemImportFromShareableHandle",
    "cuMemMap",
    "cuMemRelease",
    "cuMemRetainAllocationHandle",
    "cuMemSetAccess",
    "cuMemUnmap",
]

MiB = 1 << 20
#: Minimum and recommended granularity (H100: 2 MiB both, device and host).
GRANULARITY_MINIMUM = 2 * MiB
GRANULARITY_RECOMMENDED = 2 * MiB

#: CUresult for each misuse, as the H100 returns it (h100_probe.json, section D).
#: Not errors there: cuMemRelease of mapped memory (the memory lives until the
#: last unmap) and cuMemUnmap of reserved addresses with nothing mapped.
MISUSE: dict[str, cu.CUresult] = {
    # cuMemMap onto a range that already has a mapping (D_map_access)
    "double_map": R.CUDA_ERROR_INVALID_VALUE,
    # cuMemMap with an offset, or a size other than the allocation's
    "partial_map": R.CUDA_ERROR_NOT_SUPPORTED,
    # cuMemAddressFree of a reservation that still has mappings
    "free_while_mapped": R.CUDA_ERROR_INVALID_VALUE,
    # cuMemSetAccess / cuMemGetAccess on a reserved but unmapped range
    "access_unmapped": R.CUDA_ERROR_INVALID_VALUE,
    "get_access_unmapped": R.CUDA_ERROR_INVALID_VALUE,
    # cuMemSetAccess for a host location on device memory
    "access_host_on_device": R.CUDA_ERROR_NOT_SUPPORTED,
    # copy or memset through a mapping the device has no access to (D_no_access_use)
    "no_access_copy": R.CUDA_ERROR_INVALID_VALUE,
    # cuMemExportToShareableHandle of an allocation created without that type
    "export_without_type": R.CUDA_ERROR_INVALID_VALUE,
    # cuMemImportFromShareableHandle of a closed, unknown or foreign descriptor
    "import_closed_fd": R.CUDA_ERROR_UNKNOWN,
    "import_foreign_fd": R.CUDA_ERROR_UNKNOWN,
    # cuMemCreate with requestedHandleTypes FABRIC (no IMEX channel)
    "create_fabric": R.CUDA_ERROR_NOT_PERMITTED,
}

_LT = cu.CUmemLocationType
_DEVICE = int(_LT.CU_MEM_LOCATION_TYPE_DEVICE)
_HOST = int(_LT.CU_MEM_LOCATION_TYPE_HOST)
_HOST_NUMA = int(_LT.CU_MEM_LOCATION_TYPE_HOST_NUMA)
_HOST_NUMA_CURRENT = int(_LT.CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT)
_HOST_TYPES = (_HOST, _HOST_NUMA, _HOST_NUMA_CURRENT)
_PINNED = int(cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED)
_POSIX_FD = int(cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
_FABRIC = int(cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_FABRIC)
_ACCESS_FLAGS = (0, 1, 3)


@dataclass(eq=False)
class _Phys:
    """One physical allocation (shared by every handle that names it)."""

    size: int
    loc_type: int
    loc_id: int
    device: int  # charged device ordinal, -1 for host memory
    handle_types: int
    backing: Any
    host: int
    handles: int = 0  # handle references (create, import, retain)
    maps: int = 0  # live mappings
    exports: list[tuple[int, int]] = field(default_factory=list)  # (st_dev, st_ino)
    freed: bool = False


@dataclass(eq=False)
class _Handle:
    phys: _Phys
    refs: int = 1
    imported: bool = False  # imported handles report no requested handle types


@dataclass(eq=False)
class _Map:
    start: int
    size: int
    phys: _Phys
    handle: int
    alloc: Allocation
    access: dict[tuple[int, int], int] = field(default_factory=dict)

    @property
    def end(self) -> int:
        return self.start + self.size


@dataclass(eq=False)
class _Range:
    start: int
    size: int
    starts: list[int] = field(default_factory=list)  # sorted starts of its mappings
    maps: dict[int, _Map] = field(default_factory=dict)

    @property
    def end(self) -> int:
        return self.start + self.size


def _table(name: str) -> dict[Any, Any]:
    ext = S.MACHINE.ext
    t = ext.get(name)
    if t is None:
        t = ext[name] = {}
    return t


def _ranges() -> dict[int, _Range]:
    return _table("vmm.ranges")


def _handles() -> dict[int, _Handle]:
    return _table("vmm.handles")


def _mappings() -> dict[int, _Map]:
    return _table("vmm.mappings")


# -- helpers -------------------------------------------------------------------


def _location(loc: Any) -> tuple[int, int]:
    """Validate a CUmemLocation for cuMemCreate; return (type, id).

    As on the H100: HOST becomes HOST_NUMA 0; HOST_NUMA_CURRENT is refused.
    """
    if loc is None:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    t, i = int(loc.type), int(loc.id)
    if t == _DEVICE:
        if not 0 <= i < len(S.MACHINE.devices):
            raise Fail(R.CUDA_ERROR_INVALID_DEVICE)
        return t, i
    if t == _HOST_NUMA and i == 0:  # the simulated host has one NUMA node
        return t, 0
    if t == _HOST:
        return _HOST_NUMA, 0
    raise Fail(R.CUDA_ERROR_INVALID_VALUE)


def _prop(prop: Any) -> tuple[int, int, int]:
    """Validate a CUmemAllocationProp for cuMemCreate; return (loc type, id, handle types)."""
    if prop is None or int(prop.type) != _PINNED:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    t, i = _location(prop.location)
    types = int(prop.requestedHandleTypes)
    if types & _FABRIC:
        raise Fail(MISUSE["create_fabric"])
    if types & ~_POSIX_FD:
        raise Fail(R.CUDA_ERROR_NOT_SUPPORTED)  # Windows handle types on Linux
    return t, i, types


def _find_range(addr: int, size: int) -> _Range | None:
    """The reservation wholly containing [addr, addr+size), if any."""
    for r in _ranges().values():
        if r.start <= addr and addr + size <= r.end:
            return r
    return None


def _covering(r: _Range, addr: int, size: int) -> list[_Map] | None:
    """The mappings that exactly and contiguously cover [addr, addr+size)."""
    i = bisect.bisect_left(r.starts, addr)
    if i == len(r.starts) or r.starts[i] != addr:
        return None
    out: list[_Map] = []
    pos = addr
    end = addr + size
    while pos < end:
        if i == len(r.starts) or r.starts[i] != pos:
            return None
        mp = r.maps[pos]
        out.append(mp)
        pos = mp.end
        i += 1
    return out if pos == end else None


def _has_mapping_in(r: _Range, addr: int, size: int) -> bool:
    i = bisect.bisect_left(r.starts, addr)
    if i > 0 and r.maps[r.starts[i - 1]].end > addr:
        return True
    return i < len(r.starts) and r.starts[i] < addr + size


def _mapping_at(addr: int) -> _Map | None:
    a = S.MACHINE.find(addr)
    if a is None or a.kind != "vmm" or not a.start <= addr < a.end:
        return None
    mp = a.extra.get("vmm_map")
    return mp if isinstance(mp, _Map) else None


def _maybe_free(p: _Phys) -> None:
    """Return a physical allocation's memory once nothing refers to it."""
    if p.freed or p.handles > 0 or p.maps > 0:
        return
    p.freed = True
    m = S.MACHINE
    if p.device >= 0:
        m.uncharge(p.device, p.size)
    else:
        m.host_used -= p.size
    p.backing = None
    p.host = 0


def _new_handle(p: _Phys) -> int:
    h = S.MACHINE.new_handle()
    _handles()[h] = _Handle(p)
    p.handles += 1
    return h


def _handle(handle: Any) -> _Handle:
    entry = _handles().get(int(handle) if handle is not None else 0)
    if entry is None:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    return entry


def _va_free(start: int, size: int) -> bool:
    """Whether [start, start+size) overlaps no reservation and no allocation."""
    end = start + size
    if start < S.DEVICE_VA_BASE or end > S.DEVICE_VA_END:
        return False
    for r in _ranges().values():
        if r.start < end and start < r.end:
            return False
    for a in S.MACHINE.allocs.values():
        if a.start < end and start < a.end:
            return False
    return True


# -- granularity ---------------------------------------------------------------


@api(1)
def cuMemGetAllocationGranularity(prop: Any, option: Any) -> int:
    # The H100 answers for any properties (even an invalid type, device or
    # location); only the option is checked.
    if prop is None:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    opt = int(option)
    if opt == int(cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM):
        return GRANULARITY_MINIMUM
    if opt == int(cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED):
        return GRANULARITY_RECOMMENDED
    raise Fail(R.CUDA_ERROR_INVALID_VALUE)


# -- address reservations ----------------------------------------------------------


@api(1)
def cuMemAddressReserve(size: int, alignment: int, addr: Any, flags: int) -> cu.CUdeviceptr:
    m = S.MACHINE
    size, alignment, hint = int(size), int(alignment), int(addr or 0)
    if int(flags) != 0 or size <= 0 or size % GRANULARITY_MINIMUM:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if alignment < 0 or alignment & (alignment - 1):
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if hint % GRANULARITY_MINIMUM:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    align = max(alignment, GRANULARITY_MINIMUM)
    if hint and hint % align == 0 and hint + size <= m._next_va and _va_free(hint, size):
        va = hint  # honoured only inside address space already handed out
    else:
        va = m.reserve_va(size, align)
    _ranges()[va] = _Range(va, size)
    return cu.CUdeviceptr(va)


@api(0)
def cuMemAddressFree(ptr: Any, size: int) -> None:
    ranges = _ranges()
    r = ranges.get(int(ptr))
    if r is None or r.size != int(size):
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if r.maps:
        raise Fail(MISUSE["free_while_mapped"])
    del ranges[r.start]


# -- physical memory ---------------------------------------------------------------


@api(1)
def cuMemCreate(size: int, prop: Any, flags: int) -> cu.CUmemGenericAllocationHandle:
    m = S.MACHINE
    size = int(size)
    if int(flags) != 0:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    t, i, types = _prop(prop)
    if size <= 0 or size % GRANULARITY_MINIMUM:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if t == _DEVICE:
        backing, host = m.device_block(i, size)
        device = i
    else:
        backing, host = m.host_block(size)
        m.host_used += size
        device = -1
    p = _Phys(size, t, i, device, types, backing, host)
    return cu.CUmemGenericAllocationHandle(_new_handle(p))


@api(0)
def cuMemRelease(handle: Any) -> None:
    h = int(handle) if handle is not None else 0
    entry = _handle(h)
    entry.refs -= 1
    if entry.refs == 0:
        del _handles()[h]
    entry.phys.handles -= 1
    _maybe_free(entry.phys)  # a mapped allocation lives on until its last unmap


@api(1)
def cuMemRetainAllocationHandle(addr: Any) -> cu.CUmemGenericAllocationHandle:
    mp = _mapping_at(int(addr))
    if mp is None:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    handles = _handles()
    entry = handles.get(mp.handle)
    if entry is not None and entry.phys is mp.phys:
        entry.refs += 1
    elif entry is None:  # released while mapped: the H100 hands the same value back
        handles[mp.handle] = _Handle(mp.phys)
    else:
        return cu.CUmemGenericAllocationHandle(_new_handle(mp.phys))
    mp.phys.handles += 1
    return cu.CUmemGenericAllocationHandle(mp.handle)


@api(1)
def cuMemGetAllocationPropertiesFromHandle(handle: Any) -> cu.CUmemAllocationProp:
    entry = _handle(handle)
    p = entry.phys
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    loc = cu.CUmemLocation()
    loc.type = _LT(p.loc_type)
    loc.id = p.loc_id
    prop.location = loc
    types = 0 if entry.imported else p.handle_types
    prop.requestedHandleTypes = cu.CUmemAllocationHandleType(types)
    return prop


# -- mapping -------------------------------------------------------------------------


@api(0)
def cuMemMap(ptr: Any, size: int, offset: int, handle: Any, flags: int) -> None:
    m = S.MACHINE
    addr, size, offset = int(ptr), int(size), int(offset)
    if int(flags) != 0 or size <= 0:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    entry = _handle(handle)
    p = entry.phys
    if offset != 0 or size != p.size:
        raise Fail(MISUSE["partial_map"])
    if addr % GRANULARITY_MINIMUM:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    r = _find_range(addr, size)
    if r is None:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if _has_mapping_in(r, addr, size):
        raise Fail(MISUSE["double_map"])
    alloc = Allocation(addr, size, "vmm", p.device, p.host, p.backing)
    if p.device < 0:
        alloc.extra["ctx_device"] = 0
    mp = _Map(addr, size, p, int(handle), alloc)
    alloc.extra["vmm_map"] = mp
    m.add(alloc)
    bisect.insort(r.starts, addr)
    r.maps[addr] = mp
    _mappings()[addr] = mp
    p.maps += 1


@api(0)
def cuMemUnmap(ptr: Any, size: int) -> None:
    m = S.MACHINE
    addr, size = int(ptr), int(size)
    if size <= 0 or addr % GRANULARITY_MINIMUM or size % GRANULARITY_MINIMUM:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    r = _find_range(addr, size)
    if r is None:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    end = addr + size
    maps = [r.maps[s] for s in r.starts if s < end and r.maps[s].end > addr]
    if any(mp.start < addr or mp.end > end for mp in maps):
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)  # it would cut a mapping
    # Nothing mapped there at all is not an error on the H100.
    table = _mappings()
    for mp in maps:
        m.remove(mp.alloc)
        del r.maps[mp.start]
        r.starts.remove(mp.start)
        del table[mp.start]
        mp.phys.maps -= 1
        _maybe_free(mp.phys)


# -- access -----------------------------------------------------------------------------


def _access_location(loc: Any, p: _Phys, *, getting: bool) -> tuple[int, int]:
    """Validate an access location: (type, id) key of the access table."""
    if loc is None:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    t, i = int(loc.type), int(loc.id)
    if t == _DEVICE:
        if not 0 <= i < len(S.MACHINE.devices):
            # the H100: INVALID_DEVICE from cuMemGetAccess, INVALID_VALUE from cuMemSetAccess
            raise Fail(R.CUDA_ERROR_INVALID_DEVICE if getting else R.CUDA_ERROR_INVALID_VALUE)
        return t, i
    if t in _HOST_TYPES:
        if not getting and p.device >= 0:
            raise Fail(MISUSE["access_host_on_device"])
        return t, 0
    raise Fail(R.CUDA_ERROR_INVALID_VALUE)


@api(0)
def cuMemSetAccess(ptr: Any, size: int, desc: Any, count: int) -> None:
    addr, size, n = int(ptr), int(size), int(count)
    descs = list(desc or ())
    if n <= 0 or n > len(descs) or size <= 0:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    r = _find_range(addr, size)
    if r is None:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    maps = _covering(r, addr, size)
    if maps is None:
        if not _has_mapping_in(r, addr, size):
            raise Fail(MISUSE["access_unmapped"])
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    updates: list[tuple[tuple[int, int], int]] = []
    for d in descs[:n]:
        flags = int(d.flags)
        if flags not in _ACCESS_FLAGS:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        for mp in maps:
            _access_location(d.location, mp.phys, getting=False)
        updates.append((_access_location(d.location, maps[0].phys, getting=False), flags))
    for key, flags in updates:
        for mp in maps:
            mp.access[key] = flags


@api(1)
def cuMemGetAccess(location: Any, ptr: Any) -> int:
    addr = int(ptr)
    mp = _mapping_at(addr)
    if mp is None:
        a = S.MACHINE.find(addr)
        if a is not None and a.kind == "device" and a.start <= addr < a.end:
            # cuMemAlloc memory: its device reads and writes it
            if location is None or int(location.type) != _DEVICE:
                return 0
            i = int(location.id)
            if not 0 <= i < len(S.MACHINE.devices):
                raise Fail(R.CUDA_ERROR_INVALID_DEVICE)
            return 3 if i == a.device else 0
        raise Fail(MISUSE["get_access_unmapped"])
    key = _access_location(location, mp.phys, getting=True)
    return mp.access.get(key, 0)


# -- sharing ----------------------------------------------------------------------------


def _fake_fd() -> int:
    make = getattr(os, "memfd_create", None)
    if make is not None:
        return int(make("cuda_memkit-sim-vmm", getattr(os, "MFD_CLOEXEC", 0)))
    rd, wr = os.pipe()
    os.close(wr)
    return rd


def _fd_identity(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except (OSError, OverflowError, ValueError):
        return None
    return (st.st_dev, st.st_ino)


@api(1)
def cuMemExportToShareableHandle(handle: Any, handleType: Any, flags: int) -> int:
    p = _handle(handle).phys
    kind = int(handleType)
    if int(flags) != 0 or kind != _POSIX_FD:  # NONE and FABRIC too, on the H100
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if not p.handle_types & _POSIX_FD:
        raise Fail(MISUSE["export_without_type"])
    fd = _fake_fd()
    ident = _fd_identity(fd)
    assert ident is not None
    p.exports.append(ident)
    return fd


@api(1)
def cuMemImportFromShareableHandle(
    osHandle: Any, shHandleType: Any
) -> cu.CUmemGenericAllocationHandle:
    if int(shHandleType) != _POSIX_FD:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    fd = int(osHandle or 0)
    ident = _fd_identity(fd) if fd >= 0 else None
    if ident is None:
        raise Fail(MISUSE["import_closed_fd"])
    candidates = [e.phys for e in _handles().values()]
    candidates += [mp.phys for mp in _mappings().values()]
    for p in candidates:
        if not p.freed and ident in p.exports:
            h = _new_handle(p)
            _handles()[h].imported = True
            return cu.CUmemGenericAllocationHandle(h)
    raise Fail(MISUSE["import_foreign_fd"])



# -- copies across adjacent mappings (used by _core's copies and memsets) ---------------


def _check_access(a: Allocation, write: bool) -> None:
    mp = a.extra.get("vmm_map")
    if not isinstance(mp, _Map):
        return
    dev = S.MACHINE.ctx_device(S.MACHINE.current_ctx)
    flags = mp.access.get((_DEVICE, dev if dev is not None else 0), 0)
    if flags < (3 if write else 1):
        raise Fail(MISUSE["no_access_copy"])


def real_runs(addr: int, n: int, write: bool, check: bool = True) -> list[tuple[int, int]]:
    """Translate ``[addr, addr+n)`` to ``(real address, length)`` runs.

    Anything but a VMM mapping is one run (``Machine.real``); a range that
    starts in a mapping may continue into the mappings right after it, as
    on the GPU, where adjacent mappings form one contiguous device range.
    Mappings need access for the current device (READWRITE to ``write``),
    unless ``check`` is false (``cuMemcpyPeer``, which two H200s ran without).
    """
    m = S.MACHINE
    a = m.find(addr) if n > 0 else None
    if a is not None and a.kind == "managed":
        from ._managed import device_access

        real = m.real(addr, n)
        device = m.ctx_device(m.current_ctx)
        device_access(a, addr, n, device if device is not None else 0, write)
        return [(real, n)]
    if a is None or a.kind != "vmm":
        return [(m.real(addr, n), n)]
    if addr + n <= a.end:
        if check:
            _check_access(a, write)
        return [(m.real(addr, n), n)]
    runs: list[tuple[int, int]] = []
    while n > 0:
        a = m.find(addr)
        if a is None or a.kind != "vmm" or not a.start <= addr < a.end or a.host == 0:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        if check:
            _check_access(a, write)
        k = min(n, a.end - addr)
        runs.append((a.host + (addr - a.start), k))
        addr += k
        n -= k
    return runs


def move_runs(dst: list[tuple[int, int]], src: list[tuple[int, int]], n: int) -> None:
    """Copy ``n`` bytes from the ``src`` runs to the ``dst`` runs (through a buffer)."""
    import ctypes

    tmp = ctypes.create_string_buffer(n)
    base = ctypes.addressof(tmp)
    pos = 0
    for real, k in src:
        ctypes.memmove(base + pos, real, k)
        pos += k
    pos = 0
    for real, k in dst:
        ctypes.memmove(real, base + pos, k)
        pos += k
