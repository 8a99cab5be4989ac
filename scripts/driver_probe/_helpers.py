"""Helpers shared by the feature modules: locations, resources freed at case end, checks.

Resource helpers (``new_stream``, ``dalloc``, ``managed``, ``pinned``) make a setup
call that must succeed and register its undo with ``c.defer``; ``ctx_after(c)``
ends an isolated case with the two steps that show whether the context survived.
"""

from __future__ import annotations

import ctypes
import statistics

import numpy as np

from ._framework import PAGE, RUN, Case, MiB, call, d, ok, tv

# ---------------------------------------------------------------------------
# locations, pointers, host buffers
# ---------------------------------------------------------------------------


def loc(type_, id_=0):
    m = d.CUmemLocation()
    m.type = type_
    m.id = id_
    return m


LT = d.CUmemLocationType
DEV_LOC_T = LT.CU_MEM_LOCATION_TYPE_DEVICE


def dev_loc(i=0):
    return loc(DEV_LOC_T, i)


def host_loc():
    return loc(LT.CU_MEM_LOCATION_TYPE_HOST, 0)


def numa_loc(i=0):
    return loc(LT.CU_MEM_LOCATION_TYPE_HOST_NUMA, i)


def numa_cur_loc():
    return loc(LT.CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, 0)


def inv_loc():
    return loc(LT.CU_MEM_LOCATION_TYPE_INVALID, 0)


LOCS = {
    "DEVICE0": lambda: dev_loc(0),
    "DEVICE7": lambda: dev_loc(7),
    "HOST": host_loc,
    "HOST_NUMA0": lambda: numa_loc(0),
    "HOST_NUMA99": lambda: numa_loc(99),
    "HOST_NUMA_CURRENT": numa_cur_loc,
    "INVALID": inv_loc,
}


def P(x) -> int:
    """int address of a pointer-ish value."""
    return int(x) if x is not None else 0


def dp(x) -> d.CUdeviceptr:
    return d.CUdeviceptr(P(x))


def median_ms(samples) -> float:
    return round(statistics.median(samples) * 1e3, 4)


def host_buf(nbytes: int, align: int = PAGE, offset: int = 0):
    """(numpy owner, address) of a pageable host buffer aligned to ``align`` (+offset)."""
    a = np.zeros(nbytes + align + offset, dtype=np.uint8)
    addr = a.ctypes.data
    pad = (-addr) % align
    return a, addr + pad + offset


# ---------------------------------------------------------------------------
# resources released when the case ends
# ---------------------------------------------------------------------------


def new_stream(c: Case, flags=1):
    r = ok(d.cuStreamCreate, flags)
    c.defer(d.cuStreamDestroy, r.v)
    return r.v


def dalloc(c: Case, n):
    r = ok(d.cuMemAlloc, n)
    c.defer(d.cuMemFree, r.v)
    return r.v


def managed(c: Case, n, flags=1):
    assert n <= 256 * MiB
    r = ok(d.cuMemAllocManaged, n, flags)
    c.defer(d.cuMemFree, r.v)
    return r.v


def pinned(c: Case, n, flags=0):
    r = ok(d.cuMemHostAlloc, n, flags)
    c.defer(d.cuMemFreeHost, r.v)
    return r.v


def host_memset(addr: int, value: int, n: int):
    if not RUN.dry:
        ctypes.memset(addr, value, n)


def host_bytes(addr: int, n: int) -> bytes:
    if RUN.dry:
        return bytes(n)
    return ctypes.string_at(addr, n)


# ---------------------------------------------------------------------------
# checks and property structs used by several features
# ---------------------------------------------------------------------------


def ctx_after(c: Case):
    """Last steps of an isolated case: is the context still usable?"""
    c("cuCtxSynchronize#after", d.cuCtxSynchronize)
    r = call(d.cuMemAlloc, 4096)
    c.record("cuMemAlloc#after", r.name)
    if r.ok:
        call(d.cuMemFree, r.v)


PTR_ATTRS = [a for a in d.CUpointer_attribute]


def ptr_attrs(c: Case, label: str, ptr):
    """Every pointer attribute of ``ptr`` as value ``label``; step ``label:MEMORY_TYPE``."""
    out = {}
    for a in PTR_ATTRS:
        short = a.name.replace("CU_POINTER_ATTRIBUTE_", "")
        r = call(d.cuPointerGetAttribute, a, ptr)
        ent = {"result": r.name}
        if r.ok:
            ent.update(tv(r.v))
            if short in ("RANGE_START_ADDR", "DEVICE_POINTER", "HOST_POINTER", "MAPPING_BASE_ADDR"):
                ent["equals_ptr"] = P(r.v) == P(ptr)
        out[short] = ent
    c.record(f"{label}:MEMORY_TYPE", out["MEMORY_TYPE"]["result"])
    c.val(label, out)


AT = d.CUmemAllocationType
HT = d.CUmemAllocationHandleType
POSIX_FD = HT.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
RW = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE


def access_desc(loc_, flags=RW):
    """A ``CUmemAccessDesc`` for ``loc_`` (read-write unless told otherwise)."""
    a = d.CUmemAccessDesc()
    a.location = loc_
    a.flags = flags
    return a


def vmm_prop(dev=0, handle_types=0, loc_=None, type_=None):
    """A ``CUmemAllocationProp`` (pinned on device ``dev`` unless told otherwise)."""
    prop = d.CUmemAllocationProp()
    prop.type = type_ if type_ is not None else d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location = loc_ if loc_ is not None else dev_loc(dev)
    prop.requestedHandleTypes = handle_types
    return prop
