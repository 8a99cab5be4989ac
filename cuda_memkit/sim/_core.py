"""Simulated core driver functions.

Init, devices, contexts, streams, events, device memory, copies, memsets,
pointer queries and error strings.
"""

from __future__ import annotations

import time
from typing import Any

from cuda.bindings import driver as cu

from . import _state as S
from ._errors_table import ERROR_STRINGS
from ._peer import forget_context, linked, note_copy, reaches
from ._state import Allocation, Fail, R, SimEvent, SimStream, api, host_address, memmove
from ._vmm import move_runs, real_runs

__all__ = [
    "cuCtxGetCurrent",
    "cuCtxGetDevice",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuDeviceCanAccessPeer",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetCount",
    "cuDeviceGetName",
    "cuDevicePrimaryCtxRelease",
    "cuDevicePrimaryCtxRetain",
    "cuDeviceTotalMem",
    "cuDriverGetVersion",
    "cuEventCreate",
    "cuEventDestroy",
    "cuEventElapsedTime",
    "cuEventQuery",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuInit",
    "cuMemAlloc",
    "cuMemFree",
    "cuMemGetAddressRange",
    "cuMemGetInfo",
    "cuMemcpy",
    "cuMemcpyAsync",
    "cuMemcpyDtoD",
    "cuMemcpyDtoDAsync",
    "cuMemcpyDtoH",
    "cuMemcpyDtoHAsync",
    "cuMemcpyHtoD",
    "cuMemcpyHtoDAsync",
    "cuMemcpyPeer",
    "cuMemcpyPeerAsync",
    "cuMemsetD8",
    "cuMemsetD8Async",
    "cuMemsetD16",
    "cuMemsetD16Async",
    "cuMemsetD32",
    "cuMemsetD32Async",
    "cuPointerGetAttribute",
    "cuStreamCreate",
    "cuStreamCreateWithPriority",
    "cuStreamDestroy",
    "cuStreamGetDevice",
    "cuStreamQuery",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
]


def M() -> S.Machine:
    return S.MACHINE


# -- init, version, errors ------------------------------------------------------


@api(0)
def cuInit(flags: int) -> None:
    if int(flags) != 0:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    M().initialized = True


@api(1)
def cuDriverGetVersion() -> int:
    return M().driver_version


@api(1)
def cuGetErrorString(error: Any) -> bytes:
    text = ERROR_STRINGS.get(int(error))
    if text is None:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    return text.encode()


@api(1)
def cuGetErrorName(error: Any) -> bytes:
    try:
        return str(R(int(error)).name).encode()
    except ValueError:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE) from None


# -- devices --------------------------------------------------------------------


@api(1)
def cuDeviceGetCount() -> int:
    return len(M().devices)


@api(1)
def cuDeviceGet(ordinal: int) -> cu.CUdevice:
    o = int(ordinal)
    if not 0 <= o < len(M().devices):
        raise Fail(R.CUDA_ERROR_INVALID_DEVICE)
    return cu.CUdevice(o)


@api(1)
def cuDeviceGetName(length: int, dev: Any) -> bytes:
    n = int(length)
    name = M().device(dev).name.encode()[: max(n - 1, 0)]
    return name + b"\x00" * (n - len(name))  # the driver fills all `length` bytes


@api(1)
def cuDeviceTotalMem(dev: Any) -> int:
    return M().device(dev).total_mem


@api(1)
def cuDeviceGetAttribute(attrib: Any, dev: Any) -> int:
    d = M().device(dev)
    value = d.attrs.get(int(attrib))
    if value is None:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    return value


@api(1)
def cuDeviceCanAccessPeer(dev: Any, peer: Any) -> int:
    a = M().device(dev)
    b = M().device(peer)
    return int(linked(a.ordinal, b.ordinal))


# -- contexts -------------------------------------------------------------------


@api(1)
def cuDevicePrimaryCtxRetain(dev: Any) -> cu.CUcontext:
    d = M().device(dev)
    M().primary_retain[d.ordinal] += 1
    return cu.CUcontext(M().ctx_handle(d.ordinal))


@api(0)
def cuDevicePrimaryCtxRelease(dev: Any) -> None:
    d = M().device(dev)
    if M().primary_retain[d.ordinal] <= 0:
        raise Fail(R.CUDA_ERROR_INVALID_CONTEXT)
    M().primary_retain[d.ordinal] -= 1
    if not M().primary_retain[d.ordinal]:
        forget_context(d.ordinal)  # the context is destroyed, its peer access with it


@api(1)
def cuCtxGetCurrent() -> cu.CUcontext:
    return cu.CUcontext(M().current_ctx)


@api(0)
def cuCtxSetCurrent(ctx: Any) -> None:
    m = M()
    h = int(ctx) if ctx is not None else 0
    if h and m.ctx_device(h) is None:
        raise Fail(R.CUDA_ERROR_INVALID_CONTEXT)
    if not h:  # NULL pops the thread's context stack (a no-op on an empty one)
        stack = m.ctx_stack()
        m.current_ctx = stack.pop() if stack else 0
        return
    m.current_ctx = h  # replaces the top of the stack


@api(1)
def cuCtxGetDevice() -> cu.CUdevice:
    m = M()
    if m.stale_current():  # the H100 still answers for a destroyed context
        return cu.CUdevice(m.stale_ctx[m.current_ctx])
    return cu.CUdevice(m.need_ctx())


@api(0)
def cuCtxSynchronize() -> None:
    M().need_ctx()


# -- streams and events -----------------------------------------------------------


def _stream_create(flags: int, priority: int) -> cu.CUstream:
    m = M()
    ordinal = m.need_ctx()
    if int(flags) not in (0, 1):
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    h = m.new_handle()
    m.streams[h] = SimStream(h, ordinal, int(flags), int(priority))
    return cu.CUstream(h)


@api(1)
def cuStreamCreate(flags: int) -> cu.CUstream:
    return _stream_create(flags, 0)


@api(1)
def cuStreamCreateWithPriority(flags: int, priority: int) -> cu.CUstream:
    return _stream_create(flags, priority)


@api(0)
def cuStreamDestroy(stream: Any) -> None:
    m = M()
    if int(stream or 0) in (0, 1, 2):
        raise Fail(R.CUDA_ERROR_INVALID_HANDLE)
    s = m.stream(stream)
    if s is None:
        raise Fail(R.CUDA_ERROR_INVALID_HANDLE)
    del m.streams[s.handle]


def _stream_or_ctx(stream: Any) -> None:
    """Validate a stream argument; default streams need a current context."""
    if M().stream(stream) is None:
        M().need_ctx()


@api(0)
def cuStreamSynchronize(stream: Any) -> None:
    _stream_or_ctx(stream)


@api(0)
def cuStreamQuery(stream: Any) -> None:
    _stream_or_ctx(stream)


@api(1)
def cuStreamGetDevice(stream: Any) -> cu.CUdevice:
    s = M().stream(stream)
    return cu.CUdevice(M().need_ctx() if s is None else s.device)


@api(0)
def cuStreamWaitEvent(stream: Any, event: Any, flags: int) -> None:
    _stream_or_ctx(stream)
    _event(event)


@api(1)
def cuEventCreate(flags: int) -> cu.CUevent:
    m = M()
    m.need_ctx()
    if int(flags) & ~0xF:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    h = m.new_handle()
    m.events[h] = SimEvent(h, int(flags))
    return cu.CUevent(h)


def _event(event: Any) -> SimEvent:
    h = int(event) if event is not None else 0
    if h == 0:
        raise Fail(R.CUDA_ERROR_INVALID_HANDLE)
    ev = M().events.get(h)
    if ev is None:  # a destroyed event: the H100 says its context is gone
        raise Fail(R.CUDA_ERROR_CONTEXT_IS_DESTROYED)
    return ev


@api(0)
def cuEventRecord(event: Any, stream: Any) -> None:
    ev = _event(event)
    _stream_or_ctx(stream)
    ev.time = time.perf_counter()
    ev.recorded = True


@api(0)
def cuEventQuery(event: Any) -> None:
    _event(event)


@api(0)
def cuEventSynchronize(event: Any) -> None:
    _event(event)


@api(0)
def cuEventDestroy(event: Any) -> None:
    ev = _event(event)
    del M().events[ev.handle]


@api(1)
def cuEventElapsedTime(start: Any, end: Any) -> float:
    a, b = _event(start), _event(end)
    if not (a.recorded and b.recorded):
        raise Fail(R.CUDA_ERROR_INVALID_HANDLE)
    if (a.flags | b.flags) & 0x2:  # CU_EVENT_DISABLE_TIMING
        raise Fail(R.CUDA_ERROR_INVALID_HANDLE)
    return (b.time - a.time) * 1e3


# -- device memory ----------------------------------------------------------------


@api(1)
def cuMemAlloc(bytesize: int) -> cu.CUdeviceptr:
    m = M()
    ordinal = m.need_ctx()
    size = int(bytesize)
    if size == 0:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    backing, real = m.device_block(ordinal, size)
    va = m.reserve_va(size)
    m.add(Allocation(va, size, "device", ordinal, real, backing))
    return cu.CUdeviceptr(va)


@api(0)
def cuMemFree(dptr: Any) -> None:
    m = M()
    addr = int(dptr)
    if addr == 0:
        return  # freeing NULL succeeds, as on the H100
    a = m.allocs.get(addr)
    if a is not None and "pool" in a.extra:
        m.need_ctx()
        from ._pool import _free, _lookup

        # The H100 frees a pool allocation through cuMemFree too (its memory
        # goes back), but leaves the pool's USED_MEM_CURRENT as it was.
        pool = _lookup(a.extra["pool"])
        _free(a)
        if pool is not None and "alias_of" not in a.extra:
            pool.used += a.size
        return
    if a is None or a.kind not in ("device", "managed"):
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)  # checked before the context, as on the H100
    # No current context needed: the H100 frees device and managed memory on a
    # thread with none (scripts/probes/invalid_context_probe.py, situation "none").
    m.remove(a)
    if a.kind == "managed":
        from ._managed import release_managed

        release_managed(m, a)
        return
    m.uncharge(a.device, a.size)


@api(2)
def cuMemGetInfo() -> tuple[int, int]:
    m = M()
    d = m.devices[m.need_ctx()]
    return d.room, d.total_mem


@api(2)
def cuMemGetAddressRange(dptr: Any) -> tuple[cu.CUdeviceptr, int]:
    m = M()
    m.need_ctx()
    a = m.find(int(dptr))
    if a is None:
        raise Fail(R.CUDA_ERROR_NOT_FOUND)
    if a.kind == "vmm":
        # The H100 finds a VMM mapping only once the device may access it.
        from ._vmm import _check_access

        try:
            _check_access(a, write=False)
        except Fail:
            raise Fail(R.CUDA_ERROR_NOT_FOUND) from None
    return cu.CUdeviceptr(a.start), a.size


# -- copies -----------------------------------------------------------------------


def _copy(dst: int, src: int, n: int, check: bool = True) -> None:
    """Copy ``n`` bytes; ``check``: mappings need the current device's access."""
    m = M()
    m.need_ctx()
    n = int(n)
    if n < 0:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    _writable(dst, n)
    d = real_runs(dst, n, True, check)  # several runs only across adjacent VMM mappings
    s = real_runs(src, n, False, check)
    if len(d) == 1 and len(s) == 1:
        memmove(d[0][0], s[0][0], n)
    else:
        move_runs(d, s, n)


def _writable(dst: int, n: int) -> None:
    """Writes into a READ_ONLY host registration fail (the H100: INVALID_VALUE)."""
    if n:
        a = M().find(int(dst))
        if a is not None and a.kind == "registered" and a.flags & 0x8:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)


def _device_side(addr: Any, n: int) -> int:
    """A pointer that must be device-accessible (known to the table)."""
    a = int(addr)
    if int(n) and M().find(a) is None:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    return a


@api(0)
def cuMemcpy(dst: Any, src: Any, ByteCount: int) -> None:
    copy_between(dst, src, ByteCount)


def copy_between(dst: Any, src: Any, n: int) -> None:
    """``cuMemcpy``'s work, shared by the copies that name no contexts.

    Pool or mapped memory of another device is refused unless it granted the
    current device access; a copy between two devices is counted
    (``_peer.note_copy``).
    """
    refuse_unreachable_pool(dst, src)
    note_copy(dst, src)
    _copy(host_address(dst), host_address(src), n)


def refuse_unreachable_pool(*ptrs: Any) -> None:
    """INVALID_VALUE for a device pool's memory the current device was given no access to.

    The driver refuses ``cuMemcpy``, ``cuMemcpyDtoD``, ``cuMemcpyAsync`` and
    ``cuMemcpyBatchAsync`` of device 1's pool memory in device 0's context
    until the pool grants device 0 access, peer access between the contexts
    or not (conformance test_copy_of_another_devices_pool_memory_needs_access,
    test_copies_of_pool_and_mapped_memory_need_their_grant); ``cuMemcpyPeer``
    does not (``_peer``). Mapped memory is checked where it is translated
    (``_vmm.real_runs``).
    """
    from ._kernels import pool_grants

    m = M()
    current = m.need_ctx()
    for p in ptrs:
        a = m.find(int(p)) if p is not None else None
        if (a is not None and a.kind == "pool" and a.device not in (-1, current)
                and not pool_grants(a, current, False)):
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)


@api(0)
def cuMemcpyAsync(dst: Any, src: Any, ByteCount: int, hStream: Any) -> None:
    M().stream(hStream)
    copy_between(dst, src, ByteCount)


@api(0)
def cuMemcpyHtoD(dstDevice: Any, srcHost: Any, ByteCount: int) -> None:
    _copy(_device_side(dstDevice, ByteCount), host_address(srcHost), ByteCount)


@api(0)
def cuMemcpyHtoDAsync(dstDevice: Any, srcHost: Any, ByteCount: int, hStream: Any) -> None:
    M().stream(hStream)
    _copy(_device_side(dstDevice, ByteCount), host_address(srcHost), ByteCount)


@api(0)
def cuMemcpyDtoH(dstHost: Any, srcDevice: Any, ByteCount: int) -> None:
    _copy(host_address(dstHost), _device_side(srcDevice, ByteCount), ByteCount)


@api(0)
def cuMemcpyDtoHAsync(dstHost: Any, srcDevice: Any, ByteCount: int, hStream: Any) -> None:
    M().stream(hStream)
    _copy(host_address(dstHost), _device_side(srcDevice, ByteCount), ByteCount)


@api(0)
def cuMemcpyDtoD(dstDevice: Any, srcDevice: Any, ByteCount: int) -> None:
    copy_between(_device_side(dstDevice, ByteCount), _device_side(srcDevice, ByteCount),
                 ByteCount)


@api(0)
def cuMemcpyDtoDAsync(dstDevice: Any, srcDevice: Any, ByteCount: int, hStream: Any) -> None:
    M().stream(hStream)
    copy_between(_device_side(dstDevice, ByteCount), _device_side(srcDevice, ByteCount),
                 ByteCount)


def _peer_copy(dst: Any, dst_ctx: Any, src: Any, src_ctx: Any, n: int) -> None:
    """A copy naming both contexts: no grant of a pool or mapping is needed.

    The H200s copied device 1's pool and mapped memory from device 0's
    context without one (h200x2_probe: F_copy_pool_memory, F_copy_vmm_memory).
    """
    m = M()
    for ctx in (dst_ctx, src_ctx):
        h = int(ctx) if ctx is not None else 0
        if not h or m.ctx_device(h) is None:
            raise Fail(R.CUDA_ERROR_INVALID_CONTEXT)
    note_copy(dst, src)
    _copy(host_address(dst), host_address(src), n, check=False)


@api(0)
def cuMemcpyPeer(dstDevice: Any, dstContext: Any, srcDevice: Any, srcContext: Any,
                 ByteCount: int) -> None:
    _peer_copy(dstDevice, dstContext, srcDevice, srcContext, ByteCount)


@api(0)
def cuMemcpyPeerAsync(dstDevice: Any, dstContext: Any, srcDevice: Any, srcContext: Any,
                      ByteCount: int, hStream: Any) -> None:
    M().stream(hStream)
    _peer_copy(dstDevice, dstContext, srcDevice, srcContext, ByteCount)


# -- memset -----------------------------------------------------------------------


_CTYPE = {8: "unsigned char", 16: "unsigned short", 32: "unsigned int"}


def _check_unsigned(value: Any, bits: int) -> int:
    """A memset value, refused with the bindings' messages for its C type."""
    return S.unsigned(value, bits, _CTYPE[bits])


def _memset(dst: Any, value: int, count: int, width: int, sync: bool = False) -> None:
    import numpy as np


    m = M()
    current = m.need_ctx()
    n = int(count)
    addr = int(dst)
    if n == 0:
        return
    if addr % width:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32}[width]
    target = m.find(addr)
    if target is not None and target.kind == "host_pool":
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)  # the H100 will not memset pinned-pool memory
    if (target is not None and target.kind != "managed" and target.device not in (-1, current)
            and (sync or target.kind == "device")  # (host memory: device -1)
            and not (target.kind == "device" and reaches(current, target.device))):
        # Another device's memory from this device's context is refused, a cuMemAlloc
        # allocation's unless this device has peer access to it (conformance
        # test_sync_memset_of_another_devices_memory_is_refused,
        # test_memset_of_another_devices_memory_needs_peer_access).
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    _writable(addr, n)
    for real, k in real_runs(_device_side(addr, n), n * width, True):
        arr = np.ctypeslib.as_array((__import__("ctypes").c_char * k).from_address(real))
        arr.view(dtype)[:] = value


@api(0)
def cuMemsetD8(dstDevice: Any, uc: int, N: int) -> None:
    _memset(dstDevice, _check_unsigned(uc, 8), N, 1, sync=True)


@api(0)
def cuMemsetD16(dstDevice: Any, us: int, N: int) -> None:
    _memset(dstDevice, _check_unsigned(us, 16), N, 2, sync=True)


@api(0)
def cuMemsetD32(dstDevice: Any, ui: int, N: int) -> None:
    _memset(dstDevice, _check_unsigned(ui, 32), N, 4, sync=True)


@api(0)
def cuMemsetD8Async(dstDevice: Any, uc: int, N: int, hStream: Any) -> None:
    v = _check_unsigned(uc, 8)
    M().stream(hStream)
    _memset(dstDevice, v, N, 1)


@api(0)
def cuMemsetD16Async(dstDevice: Any, us: int, N: int, hStream: Any) -> None:
    v = _check_unsigned(us, 16)
    M().stream(hStream)
    _memset(dstDevice, v, N, 2)


@api(0)
def cuMemsetD32Async(dstDevice: Any, ui: int, N: int, hStream: Any) -> None:
    v = _check_unsigned(ui, 32)
    M().stream(hStream)
    _memset(dstDevice, v, N, 4)


# -- pointer attributes -------------------------------------------------------------

_P = cu.CUpointer_attribute
_MEMTYPE = {
    "device": cu.CUmemorytype.CU_MEMORYTYPE_DEVICE,
    "pool": cu.CUmemorytype.CU_MEMORYTYPE_DEVICE,
    "vmm": cu.CUmemorytype.CU_MEMORYTYPE_DEVICE,
    "managed": cu.CUmemorytype.CU_MEMORYTYPE_DEVICE,
    "pinned": cu.CUmemorytype.CU_MEMORYTYPE_HOST,
    "registered": cu.CUmemorytype.CU_MEMORYTYPE_HOST,
    "host_pool": cu.CUmemorytype.CU_MEMORYTYPE_HOST,
}


@api(1)
def cuPointerGetAttribute(attribute: Any, ptr: Any) -> Any:
    m = M()
    addr = int(ptr)
    attr = _P(int(attribute))
    a = m.find(addr)
    if a is None or (a.size and not a.start <= addr < a.end):
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if attr == _P.CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        return int(_MEMTYPE.get(a.kind, cu.CUmemorytype.CU_MEMORYTYPE_DEVICE))
    if attr == _P.CU_POINTER_ATTRIBUTE_IS_MANAGED:
        return a.kind == "managed"
    if attr == _P.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        # 0 for every pointer, as read through cuda-bindings 13.3/13.4 (conformance
        # test_pointer_device_ordinal_reads_0_through_the_bindings).
        return 0
    if attr == _P.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        return cu.CUdeviceptr(a.start)
    if attr == _P.CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        return a.size
    if attr == _P.CU_POINTER_ATTRIBUTE_CONTEXT:
        if a.kind in ("pool", "vmm", "host_pool"):
            return cu.CUcontext(0)  # stream-ordered and mapped memory belong to no context
        return cu.CUcontext(m.ctx_handle(max(a.device, 0)))
    if attr == _P.CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        return cu.CUdeviceptr(a.extra.get("device_ptr", a.start) + (addr - a.start))
    if attr == _P.CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if a.host == 0 or a.kind in ("device", "pool", "vmm"):
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        return addr
    if attr == _P.CU_POINTER_ATTRIBUTE_MAPPED:
        return True
    if attr == _P.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        return cu.CUmemoryPool(a.extra.get("pool", 0))
    raise Fail(R.CUDA_ERROR_INVALID_VALUE)
