"""Simulated driver functions for pinned host memory and host registration.

``cuMemHostAlloc`` / ``cuMemAllocHost`` / ``cuMemFreeHost``,
``cuMemHostGetDevicePointer``, ``cuMemHostGetFlags`` and
``cuMemHostRegister`` / ``cuMemHostUnregister``.

Pinned allocations are real, page-aligned host memory entered in the
allocation table as kind ``"pinned"``; registrations enter the caller's own
range as kind ``"registered"``. Both are charged to the machine's host memory.
The answers to misuse follow the H100 (see ``tests/conformance/h100_probe.json``
and the module constants below, which record the choices the probe decides).
"""

from __future__ import annotations

from typing import Any

from cuda.bindings import driver as cu

from . import _state as S
from ._state import Allocation, Fail, R, api, host_address, unsigned

__all__ = [
    "cuMemAllocHost",
    "cuMemFreeHost",
    "cuMemHostAlloc",
    "cuMemHostGetDevicePointer",
    "cuMemHostGetFlags",
    "cuMemHostRegister",
    "cuMemHostUnregister",
]

#: Valid ``cuMemHostAlloc`` flag bits: PORTABLE | DEVICEMAP | WRITECOMBINED.
ALLOC_FLAGS = 0x1 | 0x2 | 0x4
#: Valid ``cuMemHostRegister`` flag bits: PORTABLE | DEVICEMAP | IOMEMORY | READ_ONLY.
REGISTER_FLAGS = 0x1 | 0x2 | 0x4 | 0x8
REGISTER_IOMEMORY = 0x4
REGISTER_READ_ONLY = 0x8

# -- behaviour decided by the H100 probe (tests/conformance/h100_probe.json) ----------
#: ``cuMemHostAlloc(0, flags)`` / ``cuMemAllocHost(0)``: CUDA_SUCCESS and a NULL
#: pointer (``None``), or an error code (B_hostalloc_flags: success, NULL).
ZERO_SIZE_ALLOC: R | None = None
#: ``cuMemHostGetDevicePointer`` on memory allocated or registered without
#: DEVICEMAP: with unified addressing every pinned range is mapped, and the driver
#: answers with the host pointer (``None``) rather than an error (B_*: success).
UNMAPPED_DEVICE_POINTER: R | None = None
#: Bits ``cuMemHostGetFlags`` adds to the flags given at allocation or registration:
#: unified addressing implies DEVICEMAP (B_hostalloc_flags: 0 -> 2, 1 -> 3, 4 -> 6).
IMPLIED_FLAGS = 0x2
#: Registration flags ``cuMemHostGetFlags`` reports (B_host_register: READ_ONLY is
#: not reported, 8 -> 2).
REPORTED_REGISTER_FLAGS = 0x1 | 0x2
#: ``cuMemHostRegister`` over memory that ``cuMemHostAlloc`` returned (INVALID_VALUE,
#: not ALREADY_REGISTERED).
REGISTER_PINNED: R = R.CUDA_ERROR_INVALID_VALUE
#: ``cuMemHostRegister`` of ordinary RAM with CU_MEMHOSTREGISTER_IOMEMORY.
REGISTER_IOMEMORY_RAM: R | None = R.CUDA_ERROR_INVALID_VALUE
#: The host page size registrations are made of.
HOST_PAGE = 4096
#: ``cuMemHostRegister`` of bytes on a page that a registration with the other
#: READ_ONLY setting also uses.
SHARED_PAGE_READ_ONLY_MISMATCH: R = R.CUDA_ERROR_INVALID_VALUE
#: ``cuMemHostUnregister`` of an address the driver knows but that is not the base
#: of a registration (interior pointer, cuMemHostAlloc memory, NULL).
UNREGISTER_KNOWN: R = R.CUDA_ERROR_INVALID_VALUE
#: ``cuMemHostUnregister`` of an address the driver does not know (never registered,
#: or already unregistered).
UNREGISTER_UNKNOWN: R = R.CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
#: ``cuMemFreeHost`` of an address that is not a live ``cuMemHostAlloc`` base
#: (double free, interior, pageable or device pointer); ``cuMemFreeHost(0)`` succeeds.
FREE_UNKNOWN: R = R.CUDA_ERROR_INVALID_VALUE

_HOST_KINDS = ("pinned", "registered", "host_pool")


def M() -> S.Machine:
    return S.MACHINE


def _charge_host(m: S.Machine, size: int) -> None:
    if size > m.host_memory - m.host_used:
        raise Fail(R.CUDA_ERROR_OUT_OF_MEMORY)
    m.host_used += size


def _overlapping(m: S.Machine, start: int, size: int) -> list[Allocation]:
    """Allocations of the table that intersect ``[start, start + size)``."""
    out = []
    end = start + size
    for a in m.allocs.values():
        if a.start < end and start < max(a.end, a.start + 1):
            out.append(a)
    return out


# -- pinned allocations -------------------------------------------------------------


def _host_alloc(size: int, flags: int) -> int:
    m = M()
    ordinal = m.need_ctx()
    if flags & ~ALLOC_FLAGS:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if size == 0:
        if ZERO_SIZE_ALLOC is not None:
            raise Fail(ZERO_SIZE_ALLOC)
        return 0
    _charge_host(m, size)
    try:
        backing, addr = m.host_block(size)
    except BaseException:
        m.host_used -= size
        raise
    m.add(Allocation(addr, size, "pinned", -1, addr, backing, flags,
                     {"ctx_device": ordinal}))
    return addr


@api(1)
def cuMemHostAlloc(bytesize: Any, Flags: Any) -> int:
    return _host_alloc(unsigned(bytesize), unsigned(Flags, 32))


@api(1)
def cuMemAllocHost(bytesize: Any) -> int:
    return _host_alloc(unsigned(bytesize), 0)


@api(0)
def cuMemFreeHost(p: Any) -> None:
    m = M()  # no context needed: the H100 frees on a thread without one
    addr = host_address(p)
    if addr == 0:
        return
    a = m.allocs.get(addr)
    if a is None or a.kind != "pinned":
        raise Fail(FREE_UNKNOWN)
    m.remove(a)
    m.host_used -= a.size


def _host_range(addr: int) -> Allocation:
    a = M().find(addr)
    if a is None or a.kind not in _HOST_KINDS or not a.start <= addr < max(a.end, a.start + 1):
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    return a


@api(1)
def cuMemHostGetDevicePointer(p: Any, Flags: Any) -> cu.CUdeviceptr:
    M().need_ctx()
    if unsigned(Flags, 32) != 0:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    addr = host_address(p)
    a = _host_range(addr)
    if a.kind == "host_pool":  # the H100 answers INVALID_VALUE for pool memory (conformance)
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if not a.flags & 0x2 and UNMAPPED_DEVICE_POINTER is not None:
        raise Fail(UNMAPPED_DEVICE_POINTER)
    base = int(a.extra.get("device_ptr", a.start))
    return cu.CUdeviceptr(base + (addr - a.start))


@api(1)
def cuMemHostGetFlags(p: Any) -> int:
    M().need_ctx()
    a = _host_range(host_address(p))
    if a.kind == "registered":
        return (a.flags & REPORTED_REGISTER_FLAGS) | IMPLIED_FLAGS
    return a.flags | IMPLIED_FLAGS


# -- registration -------------------------------------------------------------------


@api(0)
def cuMemHostRegister(p: Any, bytesize: Any, Flags: Any) -> None:
    m = M()
    ordinal = m.need_ctx()
    addr = host_address(p)
    size = unsigned(bytesize)
    flags = unsigned(Flags, 32)
    if flags & ~REGISTER_FLAGS or addr == 0 or size == 0:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if flags & REGISTER_READ_ONLY:
        attr = int(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED)
        if not m.devices[ordinal].attrs.get(attr, 0):
            raise Fail(R.CUDA_ERROR_NOT_SUPPORTED)
    if S.DEVICE_VA_BASE <= addr < S.DEVICE_VA_END:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    for a in _overlapping(m, addr, size):
        if a.kind == "registered":
            raise Fail(R.CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
        if a.kind in ("pinned", "host_pool"):
            raise Fail(REGISTER_PINNED)
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    # Disjoint bytes on a page another registration uses: the H100 accepts them
    # when both agree on READ_ONLY and refuses them otherwise (the page's mapping
    # cannot be both).
    first, last = addr // HOST_PAGE, (addr + size - 1) // HOST_PAGE
    for a in _overlapping(m, first * HOST_PAGE, (last - first + 1) * HOST_PAGE):
        if a.kind == "registered" and (a.flags ^ flags) & REGISTER_READ_ONLY:
            raise Fail(SHARED_PAGE_READ_ONLY_MISMATCH)
    if flags & REGISTER_IOMEMORY and REGISTER_IOMEMORY_RAM is not None:
        raise Fail(REGISTER_IOMEMORY_RAM)
    _charge_host(m, size)
    m.add(Allocation(addr, size, "registered", -1, addr, None, flags, {"ctx_device": ordinal}))


@api(0)
def cuMemHostUnregister(p: Any) -> None:
    m = M()  # no current context needed, as on the H100 (invalid_context_probe, "none")
    addr = host_address(p)
    a = m.allocs.get(addr)
    if a is None or a.kind != "registered":
        if addr == 0 or m.find(addr) is not None:
            raise Fail(UNREGISTER_KNOWN)
        raise Fail(UNREGISTER_UNKNOWN)
    m.remove(a)
    m.host_used -= a.size
