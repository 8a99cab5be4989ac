"""A. Core: init, devices, contexts, plain device memory, memset/memcpy,
streams, events, pointer attributes, error strings, device attributes; then the
risky cases (each in a child process of its own).
"""

from __future__ import annotations

import threading

import numpy as np

from ._framework import PAGE, RUN, Case, Ctx, KiB, MiB, call, d, jv, ok, probe, tv
from ._helpers import (
    P,
    ctx_after,
    dalloc,
    dp,
    host_buf,
    host_bytes,
    managed,
    new_stream,
    pinned,
    ptr_attrs,
    vmm_prop,
)


@probe("A_init_version_devices")
def a_init(c: Case):
    c("cuInit(0)#again", d.cuInit, 0)
    c("cuInit(1)", d.cuInit, 1)
    r = c("cuDriverGetVersion", d.cuDriverGetVersion)
    c.val("driver_version", r.v)
    r = c("cuDeviceGetCount", d.cuDeviceGetCount)
    c.val("device_count", r.v)
    r = c("cuDeviceGet(-1)", d.cuDeviceGet, -1)
    c.val("cuDeviceGet(-1)", tv(r.v))
    r = c("cuDeviceGet(count)", d.cuDeviceGet, Ctx.count)
    c.val("cuDeviceGet(count)", tv(r.v))
    r = c("cuDeviceGet(0)", d.cuDeviceGet, 0)
    c.val("cuDeviceGet(0)", tv(r.v))
    r = c("cuDeviceGetName(256)", d.cuDeviceGetName, 256, Ctx.dev)
    c.val(
        "name_256",
        {
            "repr": repr(r.v),
            "type": type(r.v).__name__,
            "len": len(r.v) if r.v is not None else None,
        },
    )
    r = c("cuDeviceGetName(8)", d.cuDeviceGetName, 8, Ctx.dev)
    c.val("name_8", repr(r.v))
    r = c("cuDeviceGetName(0)", d.cuDeviceGetName, 0, Ctx.dev)
    c.val("name_0", repr(r.v))
    r = c("cuDeviceGetName(256,dev7)", d.cuDeviceGetName, 256, 7)
    r = c("cuDeviceTotalMem", d.cuDeviceTotalMem, Ctx.dev)
    c.val("total_mem", r.v)
    r = c("cuDeviceTotalMem(dev7)", d.cuDeviceTotalMem, 7)
    r = c("cuDeviceCanAccessPeer(0,0)", d.cuDeviceCanAccessPeer, Ctx.dev, Ctx.dev)
    c.val("can_access_peer_0_0", r.v)
    r = c("cuDeviceCanAccessPeer(0,7)", d.cuDeviceCanAccessPeer, Ctx.dev, 7)
    r = c("cuDevicePrimaryCtxGetState", d.cuDevicePrimaryCtxGetState, Ctx.dev)
    c.val("primary_state", {"flags": r.outs[0], "active": r.outs[1]})
    r = c("cuDevicePrimaryCtxRetain(dev7)", d.cuDevicePrimaryCtxRetain, 7)
    r = c("cuCtxGetStreamPriorityRange", d.cuCtxGetStreamPriorityRange)
    c.val("stream_priority_range", {"least": r.outs[0], "greatest": r.outs[1]})
    r = c("cuDeviceGetUuid", d.cuDeviceGetUuid, Ctx.dev)
    c.val("uuid", jv(r.v))


@probe("A_no_context_thread")
def a_no_ctx(c: Case):
    """Calls made from a fresh thread where no context is current."""

    def body():
        r = c("cuCtxGetCurrent", d.cuCtxGetCurrent)
        c.val(
            "ctx_current",
            {
                "int": P(r.v) if r.v is not None else None,
                "repr": repr(r.v),
                "type": type(r.v).__name__,
            },
        )
        r = c("cuMemAlloc(1024)", d.cuMemAlloc, 1024)
        if r.ok:
            c.note("cuMemAlloc succeeded without context!")
            c.defer(d.cuMemFree, r.v)
        r = c("cuCtxGetDevice", d.cuCtxGetDevice)
        c.val("ctx_device", tv(r.v))
        r = c("cuMemGetInfo", d.cuMemGetInfo)
        r = c("cuStreamCreate(0)", d.cuStreamCreate, 0)
        if r.ok:
            c.defer(d.cuStreamDestroy, r.v)
        c("cuCtxSynchronize", d.cuCtxSynchronize)
        c("cuMemFree(0x1234000)", d.cuMemFree, 0x1234000)
        r = c("cuEventCreate(0)", d.cuEventCreate, 0)
        if r.ok:
            c.defer(d.cuEventDestroy, r.v)
        r = c("cuMemHostAlloc(4096,0)", d.cuMemHostAlloc, 4096, 0)
        if r.ok:
            c.defer(d.cuMemFreeHost, r.v)
        r = c("cuMemAllocManaged(4096,1)", d.cuMemAllocManaged, 4096, 1)
        if r.ok:
            c.defer(d.cuMemFree, r.v)
        r = c("cuDeviceGetDefaultMemPool", d.cuDeviceGetDefaultMemPool, Ctx.dev)
        prop = vmm_prop()
        r = c("cuMemGetAllocationGranularity", d.cuMemGetAllocationGranularity, prop, 0)
        r = c("cuMemCreate(2MiB)", d.cuMemCreate, 2 * MiB, prop, 0)
        if r.ok:
            c.defer(d.cuMemRelease, r.v)
        r = c("cuMemAddressReserve(2MiB)", d.cuMemAddressReserve, 2 * MiB, 0, 0, 0)
        if r.ok:
            c.defer(d.cuMemAddressFree, r.v, 2 * MiB)
        c(
            "cuDeviceGetAttribute",
            d.cuDeviceGetAttribute,
            d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            Ctx.dev,
        )
        c("cuStreamSynchronize(0)", d.cuStreamSynchronize, 0)
        c("cuStreamQuery(0)", d.cuStreamQuery, 0)
        c("cuMemsetD8(0x1234000)", d.cuMemsetD8, 0x1234000, 0, 1)
        c(
            "cuPointerGetAttribute(MEMORY_TYPE, 0x1234000)",
            d.cuPointerGetAttribute,
            d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            0x1234000,
        )
        # cleanup needs a context
        call(d.cuCtxSetCurrent, Ctx.ctx)
        c.finish()

    t = threading.Thread(target=body)
    t.start()
    t.join()


@probe("A_mem_alloc_free")
def a_alloc_free(c: Case):
    c("cuMemAlloc(0)", d.cuMemAlloc, 0)
    c("cuMemAlloc(1<<60)", d.cuMemAlloc, 1 << 60)
    c("cuMemAlloc(total+1)", d.cuMemAlloc, ok(d.cuDeviceTotalMem, Ctx.dev).v + 1)
    c("cuMemFree(0x1234000)", d.cuMemFree, 0x1234000)
    r = c("cuMemGetInfo#before", d.cuMemGetInfo)
    free0 = r.outs[0]
    c.val("mem_info_before", {"free": r.outs[0], "total": r.outs[1]})
    r = c("cuMemAlloc(64MiB)", d.cuMemAlloc, 64 * MiB)
    big = r.v
    r = c("cuMemGetInfo#after64MiB", d.cuMemGetInfo)
    if r.ok and free0 is not None:
        c.val("free_delta_after_64MiB", free0 - r.outs[0])
    r = c("cuMemAlloc(4096)", d.cuMemAlloc, 4096)
    p = r.v
    c.val("alloc_ptr_type", type(p).__name__)
    c("cuMemFree(base+256)", d.cuMemFree, P(p) + 256)
    c("cuMemFree(p)", d.cuMemFree, p)
    c("cuMemFree(p)#double", d.cuMemFree, p)
    c("cuMemFree(0)", d.cuMemFree, 0)
    c("cuMemFree(CUdeviceptr(0))", d.cuMemFree, d.CUdeviceptr(0))
    c("cuMemFree(big)", d.cuMemFree, big)
    r = c("cuMemGetInfo#afterfree", d.cuMemGetInfo)
    if r.ok and free0 is not None:
        c.val("free_delta_after_free", free0 - r.outs[0])
    # address pattern / rounding of sizes
    pats = {}
    ptrs = []
    for n in (1, 256, 1000, 4096, 65536, 2 * MiB + 1):
        r = call(d.cuMemAlloc, n)
        if not r.ok:
            pats[n] = r.name
            continue
        ptrs.append(r.v)
        a = P(r.v)
        rr = call(d.cuMemGetAddressRange, r.v)
        pats[n] = {
            "ptr_hex": hex(a),
            "mod512": a % 512,
            "mod4096": a % 4096,
            "mod2MiB": a % (2 * MiB),
            "range_size": jv(rr.outs[1]),
            "range_base_eq": P(rr.outs[0]) == a if rr.ok else rr.name,
        }
    for q in ptrs:
        call(d.cuMemFree, q)
    c.val("alloc_patterns", pats)


@probe("A_memset")
def a_memset(c: Case):
    p = dalloc(c, 4096)
    c("cuMemsetD8(256)", d.cuMemsetD8, p, 256, 16)
    c("cuMemsetD8(-1)", d.cuMemsetD8, p, -1, 16)
    c("cuMemsetD16(65536)", d.cuMemsetD16, p, 65536, 16)
    c("cuMemsetD32(1<<32)", d.cuMemsetD32, p, 1 << 32, 16)
    c("cuMemsetD8(0xAB,4096)", d.cuMemsetD8, p, 0xAB, 4096)
    c("cuMemsetD8(N=0)", d.cuMemsetD8, p, 1, 0)
    c("cuMemsetD8(int ptr)", d.cuMemsetD8, P(p), 0xAB, 16)
    c("cuMemsetD16(p+1) misaligned", d.cuMemsetD16, P(p) + 1, 0x1234, 16)
    c("cuMemsetD32(p+2) misaligned", d.cuMemsetD32, P(p) + 2, 0x12345678, 16)
    c("cuMemsetD32(p+4) aligned", d.cuMemsetD32, P(p) + 4, 0x12345678, 16)
    c("cuMemsetD16(p+2) aligned", d.cuMemsetD16, P(p) + 2, 0x1234, 4)
    s = new_stream(c)
    c("cuMemsetD8Async", d.cuMemsetD8Async, p, 7, 4096, s)
    c("cuMemsetD16Async(p+1)", d.cuMemsetD16Async, P(p) + 1, 7, 4, s)
    c("cuStreamSynchronize", d.cuStreamSynchronize, s)
    h = np.zeros(4096, np.uint8)
    c("cuMemcpyDtoH", d.cuMemcpyDtoH, h, p, 4096)
    c.val("bytes_0_8_after", [int(x) for x in h[:8]])
    c("cuCtxSynchronize#after", d.cuCtxSynchronize)


@probe("A_memcpy")
def a_memcpy(c: Case):
    n = 4096
    p = dalloc(c, n)
    q = dalloc(c, n)
    src = (np.arange(n) % 251).astype(np.uint8)
    dst = np.zeros(n, np.uint8)
    c("cuMemcpyHtoD(ndarray)", d.cuMemcpyHtoD, p, src, n)
    c("cuMemcpyHtoD(int addr)", d.cuMemcpyHtoD, p, src.ctypes.data, n)
    c("cuMemcpyHtoD(bytes)", d.cuMemcpyHtoD, p, bytes(src), n)
    c("cuMemcpyDtoH(interior p+256, 256)", d.cuMemcpyDtoH, dst, P(p) + 256, 256)
    c.val("dtoh_interior_ok", bool(RUN.dry or (dst[:256] == src[256:512]).all()))
    c("cuMemcpyHtoD(size 0)", d.cuMemcpyHtoD, p, src, 0)
    c("cuMemcpyDtoH(size 0)", d.cuMemcpyDtoH, dst, p, 0)
    c("cuMemcpyDtoD(size 0)", d.cuMemcpyDtoD, q, p, 0)
    c("cuMemcpyDtoD(0,0,size 0)", d.cuMemcpyDtoD, 0, 0, 0)
    c("cuMemcpyHtoD(0x1234000,size 0)", d.cuMemcpyHtoD, 0x1234000, src, 0)
    c("cuMemcpyDtoD", d.cuMemcpyDtoD, q, p, n)
    dst[:] = 0
    c("cuMemcpy(host<-dev)", d.cuMemcpy, dst.ctypes.data, P(q), n)
    c.val("unified_dtoh_ok", bool(RUN.dry or (dst == src).all()))
    src2 = src[::-1].copy()
    c("cuMemcpy(dev<-host)", d.cuMemcpy, P(p), src2.ctypes.data, n)
    dst[:] = 0
    c("cuMemcpyDtoH#check", d.cuMemcpyDtoH, dst, p, n)
    c.val("unified_htod_ok", bool(RUN.dry or (dst == src2).all()))
    dst[:] = 0
    c("cuMemcpy(host<-host)", d.cuMemcpy, dst.ctypes.data, src.ctypes.data, n)
    c.val("unified_htoh_ok", bool(RUN.dry or (dst == src).all()))
    c("cuMemcpy(dev<-dev)", d.cuMemcpy, P(q), P(p), n)
    c("cuMemcpy(CUdeviceptr args)", d.cuMemcpy, dp(q), dp(p), n)
    c("cuMemcpyDtoD(p+1 -> q+3, 100) unaligned", d.cuMemcpyDtoD, P(q) + 3, P(p) + 1, 100)
    s = new_stream(c)
    c("cuMemcpyAsync(int ptrs)", d.cuMemcpyAsync, P(p), src.ctypes.data, n, s)
    c("cuMemcpyHtoDAsync(ndarray)", d.cuMemcpyHtoDAsync, p, src, n, s)
    c("cuMemcpyDtoHAsync(ndarray)", d.cuMemcpyDtoHAsync, dst, p, n, s)
    c("cuMemcpyDtoDAsync", d.cuMemcpyDtoDAsync, q, p, n, s)
    c("cuMemcpyAsync(legacy stream 0)", d.cuMemcpyAsync, P(q), P(p), n, 0)
    c("cuMemcpyAsync(CU_STREAM_PER_THREAD)", d.cuMemcpyAsync, P(q), P(p), n, d.CU_STREAM_PER_THREAD)
    c("cuStreamSynchronize", d.cuStreamSynchronize, s)
    c("cuCtxSynchronize#after", d.cuCtxSynchronize)


@probe("A_streams")
def a_streams(c: Case):
    for f in (0, 1, 2, 8):
        r = c(f"cuStreamCreate({f})", d.cuStreamCreate, f)
        if r.ok:
            rf = call(d.cuStreamGetFlags, r.v)
            c.val(f"flags_of_stream_created_with_{f}", jv(rf.v))
            call(d.cuStreamDestroy, r.v)
    for f, pr in ((1, 0), (0, -1), (0, -5), (0, 3), (0, -100)):
        r = c(f"cuStreamCreateWithPriority({f},{pr})", d.cuStreamCreateWithPriority, f, pr)
        if r.ok:
            rp = call(d.cuStreamGetPriority, r.v)
            c.val(f"priority_of_stream_created_with_{pr}", jv(rp.v))
            call(d.cuStreamDestroy, r.v)
    r = ok(d.cuStreamCreate, 1)
    s = r.v
    c.val("stream_type", type(s).__name__)
    c("cuStreamQuery(new)", d.cuStreamQuery, s)
    c("cuStreamSynchronize(new)", d.cuStreamSynchronize, s)
    r = c("cuStreamGetDevice", d.cuStreamGetDevice, s) if hasattr(d, "cuStreamGetDevice") else None
    if r is not None:
        c.val("stream_device", jv(r.v))
    c("cuStreamGetCtx", d.cuStreamGetCtx, s)
    c("cuStreamDestroy", d.cuStreamDestroy, s)
    for name, h in (
        ("0", 0),
        ("LEGACY", d.CU_STREAM_LEGACY),
        ("PER_THREAD", d.CU_STREAM_PER_THREAD),
    ):
        c(f"cuStreamQuery({name})", d.cuStreamQuery, h)
        c(f"cuStreamSynchronize({name})", d.cuStreamSynchronize, h)
        r = c(f"cuStreamGetFlags({name})", d.cuStreamGetFlags, h)
        c.val(f"flags_{name}", jv(r.v))
    c("cuStreamDestroy(0)", d.cuStreamDestroy, 0)
    c("cuStreamSynchronize(CUstream(0))", d.cuStreamSynchronize, d.CUstream(0))
    c("cuCtxSynchronize", d.cuCtxSynchronize)


@probe("A_events")
def a_events(c: Case):
    s = new_stream(c)
    p = dalloc(c, 16 * MiB)
    r = c("cuEventCreate(0)#a", d.cuEventCreate, 0)
    e1 = r.v
    r = c("cuEventCreate(0)#b", d.cuEventCreate, 0)
    e2 = r.v
    c.val("event_type", type(e1).__name__)
    c("cuEventQuery(unrecorded)", d.cuEventQuery, e1)
    c("cuEventSynchronize(unrecorded)", d.cuEventSynchronize, e1)
    c("cuEventElapsedTime(unrecorded)", d.cuEventElapsedTime, e1, e2)
    c("cuEventRecord(a)", d.cuEventRecord, e1, s)
    for _ in range(20):
        call(d.cuMemsetD8Async, p, 1, 16 * MiB, s)
    c("cuEventRecord(b)", d.cuEventRecord, e2, s)
    c("cuEventQuery(b) right after record", d.cuEventQuery, e2)
    c("cuEventElapsedTime(before sync)", d.cuEventElapsedTime, e1, e2)
    c("cuEventSynchronize(b)", d.cuEventSynchronize, e2)
    c("cuEventQuery(b)", d.cuEventQuery, e2)
    r = c("cuEventElapsedTime", d.cuEventElapsedTime, e1, e2)
    c.val("elapsed_ms", tv(r.v))
    r = c("cuEventElapsedTime(b,a) reversed", d.cuEventElapsedTime, e2, e1)
    c.val("elapsed_reversed_ms", jv(r.v))
    c("cuEventRecord(legacy stream 0)", d.cuEventRecord, e1, 0)
    c("cuStreamWaitEvent", d.cuStreamWaitEvent, s, e1, 0)
    r = c("cuEventCreate(DISABLE_TIMING=2)", d.cuEventCreate, 2)
    e3 = r.v
    c("cuEventRecord(e3)", d.cuEventRecord, e3, s)
    c("cuEventSynchronize(e3)", d.cuEventSynchronize, e3)
    c("cuEventElapsedTime(disable-timing)", d.cuEventElapsedTime, e1, e3)
    c("cuEventCreate(0x100 bad flags)", d.cuEventCreate, 0x100)
    c("cuEventDestroy(a)", d.cuEventDestroy, e1)
    c("cuEventDestroy(b)", d.cuEventDestroy, e2)
    c("cuEventDestroy(e3)", d.cuEventDestroy, e3)
    c("cuEventDestroy(0)", d.cuEventDestroy, 0)
    c("cuEventQuery(0)", d.cuEventQuery, 0)
    c("cuEventRecord(0 event)", d.cuEventRecord, 0, s)


@probe("A_ctx_current")
def a_ctx(c: Case):
    r = c("cuCtxGetCurrent(primary)", d.cuCtxGetCurrent)
    c.val("current_is_primary", P(r.v) == P(Ctx.ctx))
    c("cuCtxSetCurrent(0)", d.cuCtxSetCurrent, 0)
    r = c("cuCtxGetCurrent", d.cuCtxGetCurrent)
    c.val(
        "current_after_set0",
        {"int": P(r.v) if r.v is not None else None, "repr": repr(r.v), "type": type(r.v).__name__},
    )
    c("cuMemAlloc(1024) no ctx", d.cuMemAlloc, 1024)
    c("cuCtxGetDevice no ctx", d.cuCtxGetDevice)
    c("cuCtxSynchronize no ctx", d.cuCtxSynchronize)
    c("cuCtxSetCurrent(CUcontext(0))", d.cuCtxSetCurrent, d.CUcontext(0))
    c("cuCtxSetCurrent(primary)", d.cuCtxSetCurrent, Ctx.ctx)
    r = c("cuCtxGetDevice", d.cuCtxGetDevice)
    c.val("ctx_device", tv(r.v))
    r = c("cuCtxGetApiVersion", d.cuCtxGetApiVersion, Ctx.ctx)
    c.val("api_version", jv(r.v))
    r = c("cuDevicePrimaryCtxRetain#again", d.cuDevicePrimaryCtxRetain, Ctx.dev)
    c.val("retain_again_same_ctx", P(r.v) == P(Ctx.ctx))
    c("cuDevicePrimaryCtxRelease", d.cuDevicePrimaryCtxRelease, Ctx.dev)
    r = c("cuCtxGetFlags", d.cuCtxGetFlags)
    c.val("ctx_flags", jv(r.v))


@probe("A_pointer_attributes")
def a_ptr_attrs(c: Case):
    p = dalloc(c, 1 * MiB)
    ptr_attrs(c, "device", p)
    ptr_attrs(c, "device_interior+256", P(p) + 256)
    ptr_attrs(c, "device_int_arg", P(p))
    h = pinned(c, 1 * MiB, 0)
    ptr_attrs(c, "hostalloc_flags0", h)
    h2 = pinned(c, 1 * MiB, 2)
    ptr_attrs(c, "hostalloc_devicemap", h2)
    m = managed(c, 1 * MiB)
    ptr_attrs(c, "managed", m)
    arr, addr = host_buf(PAGE)
    ptr_attrs(c, "numpy_unknown_host", addr)
    ptr_attrs(c, "null", 0)
    c.val("device_ptr_hex", hex(P(p)))
    c.val("hostalloc_ptr_hex", hex(P(h)))
    c.val("managed_ptr_hex", hex(P(m)))
    c.val("numpy_ptr_hex", hex(addr))
    c(
        "cuPointerGetAttribute(CUdeviceptr arg)",
        d.cuPointerGetAttribute,
        d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        dp(p),
    )
    c(
        "cuPointerGetAttributes",
        d.cuPointerGetAttributes,
        2,
        [
            d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        ],
        p,
    )
    del arr


@probe("A_address_range")
def a_addr_range(c: Case):
    p = dalloc(c, 1 * MiB)
    r = c("cuMemGetAddressRange(interior+4096)", d.cuMemGetAddressRange, P(p) + 4096)
    c.val(
        "interior",
        {
            "base_eq": P(r.outs[0]) == P(p) if r.ok else None,
            "size": jv(r.outs[1]),
            "base_type": type(r.outs[0]).__name__,
            "size_type": type(r.outs[1]).__name__,
        },
    )
    r = c("cuMemGetAddressRange(base)", d.cuMemGetAddressRange, p)
    r = c("cuMemGetAddressRange(end)", d.cuMemGetAddressRange, P(p) + MiB)
    c.val("at_end", {"base": jv(r.outs[0]), "size": jv(r.outs[1])})
    c("cuMemGetAddressRange(0x1234000)", d.cuMemGetAddressRange, 0x1234000)
    c("cuMemGetAddressRange(0)", d.cuMemGetAddressRange, 0)
    arr, addr = host_buf(PAGE)
    c("cuMemGetAddressRange(numpy)", d.cuMemGetAddressRange, addr)
    h = pinned(c, 64 * KiB, 0)
    r = c("cuMemGetAddressRange(hostalloc+100)", d.cuMemGetAddressRange, P(h) + 100)
    c.val("hostalloc", {"base_eq": P(r.outs[0]) == P(h) if r.ok else None, "size": jv(r.outs[1])})
    m = managed(c, 1 * MiB)
    r = c("cuMemGetAddressRange(managed+100)", d.cuMemGetAddressRange, P(m) + 100)
    c.val("managed", {"base_eq": P(r.outs[0]) == P(m) if r.ok else None, "size": jv(r.outs[1])})
    del arr


@probe("A_error_strings")
def a_errors(c: Case):
    table = {}
    for e in d.CUresult:
        rs = call(d.cuGetErrorString, e)
        rn = call(d.cuGetErrorName, e)
        table[e.name] = {
            "code": int(e.value),
            "string": jv(rs.v) if rs.ok else {"result": rs.name},
            "name": jv(rn.v) if rn.ok else {"result": rn.name},
        }
    c.val("error_table", table)
    first = next(iter(d.CUresult))
    r = call(d.cuGetErrorString, first)
    c.val("string_return_type", type(r.v).__name__)
    c.record("cuGetErrorString(CUDA_SUCCESS)", r.name)
    c("cuGetErrorString(int 9999)", d.cuGetErrorString, 9999)
    c("cuGetErrorString(int 1)", d.cuGetErrorString, 1)
    c("cuGetErrorName(int 9999)", d.cuGetErrorName, 9999)


@probe("A_device_attributes")
def a_dev_attrs(c: Case):
    out = {}
    for a in d.CUdevice_attribute:
        r = call(d.cuDeviceGetAttribute, a, Ctx.dev)
        out[a.name.replace("CU_DEVICE_ATTRIBUTE_", "")] = r.v if r.ok else r.name
    c.val("attributes", out)
    c(
        "cuDeviceGetAttribute(dev7)",
        d.cuDeviceGetAttribute,
        d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        7,
    )
    c("cuDeviceGetAttribute(int 9999)", d.cuDeviceGetAttribute, 9999, Ctx.dev)


@probe("A_memset_past_end", isolated=True)
def a_memset_past(c: Case):
    p = dalloc(c, 4096)
    c("cuMemsetD8(N=4096+256)", d.cuMemsetD8, p, 1, 4096 + 256)
    c("cuMemsetD8(p+4000, N=200)", d.cuMemsetD8, P(p) + 4000, 1, 200)
    c("cuMemsetD8(N=64MiB)", d.cuMemsetD8, p, 1, 64 * MiB)
    ctx_after(c)


@probe("A_memset_bad_ptrs", isolated=True)
def a_memset_bad(c: Case):
    c("cuMemsetD8(0)", d.cuMemsetD8, 0, 1, 16)
    arr, addr = host_buf(PAGE)
    c("cuMemsetD8(numpy pageable)", d.cuMemsetD8, addr, 7, 16)
    c.val("numpy_bytes_after", list(host_bytes(addr, 4)))
    ctx_after(c)
    del arr


@probe("A_unknown_ptr_memset", isolated=True)
def a_unknown_memset(c: Case):
    c("cuMemsetD8(0x1234000) unknown", d.cuMemsetD8, 0x1234000, 1, 16)
    ctx_after(c)


@probe("A_unknown_ptr_copies", isolated=True)
def a_unknown_copies(c: Case):
    p = dalloc(c, 4096)
    dst = np.zeros(16, np.uint8)
    c("cuMemcpyDtoH(src unknown 0x1234000)", d.cuMemcpyDtoH, dst, 0x1234000, 16)
    c("cuCtxSynchronize#mid", d.cuCtxSynchronize)
    c("cuMemcpyDtoD(dst unknown 0x1234000)", d.cuMemcpyDtoD, 0x1234000, p, 16)
    ctx_after(c)


@probe("A_memcpy_oversize", isolated=True)
def a_memcpy_over(c: Case):
    p = dalloc(c, 4096)
    src = np.zeros(8192, np.uint8)
    c("cuMemcpyHtoD(8192 into 4096 alloc)", d.cuMemcpyHtoD, p, src, 8192)
    c("cuMemcpyDtoH(8192 from 4096 alloc)", d.cuMemcpyDtoH, src, p, 8192)
    q = dalloc(c, 4096)
    c("cuMemcpyDtoD(8192)", d.cuMemcpyDtoD, q, p, 8192)
    ctx_after(c)


@probe("A_memcpy_host_as_device", isolated=True)
def a_memcpy_hostdst(c: Case):
    p = dalloc(c, 4096)
    call(d.cuMemsetD8, p, 0x5A, 4096)
    src = np.full(4096, 3, np.uint8)
    dst = np.zeros(4096, np.uint8)
    c("cuMemcpyHtoD(dst=numpy addr)", d.cuMemcpyHtoD, dst.ctypes.data, src, 4096)
    c.val("htod_hostdst_copied", bool(RUN.dry or (dst == 3).all()))
    dst2 = np.zeros(4096, np.uint8)
    c("cuMemcpyDtoH(src=numpy addr)", d.cuMemcpyDtoH, dst2, src.ctypes.data, 4096)
    c.val("dtoh_hostsrc_copied", bool(RUN.dry or (dst2 == 3).all()))
    c("cuMemcpyDtoD(numpy->numpy)", d.cuMemcpyDtoD, dst.ctypes.data, src.ctypes.data, 16)
    c("cuMemcpyHtoD(src=device ptr)", d.cuMemcpyHtoD, P(p), P(p) + 0, 0)
    ctx_after(c)


@probe("A_stream_double_destroy", isolated=True)
def a_stream_dd(c: Case):
    r = ok(d.cuStreamCreate, 0)
    s = r.v
    c("cuStreamDestroy#1", d.cuStreamDestroy, s)
    c("cuStreamDestroy#2", d.cuStreamDestroy, s)
    ctx_after(c)


@probe("A_event_double_destroy", isolated=True)
def a_event_dd(c: Case):
    r = ok(d.cuEventCreate, 0)
    e = r.v
    c("cuEventDestroy#1", d.cuEventDestroy, e)
    c("cuEventDestroy#2", d.cuEventDestroy, e)
    c("cuEventQuery(destroyed)", d.cuEventQuery, e)
    ctx_after(c)


@probe("A_destroyed_stream_ops", isolated=True)
def a_destroyed_stream(c: Case):
    p = dalloc(c, 4096)
    q = dalloc(c, 4096)
    r = ok(d.cuStreamCreate, 1)
    s = r.v
    c("cuStreamDestroy", d.cuStreamDestroy, s)
    c("cuStreamQuery(destroyed)", d.cuStreamQuery, s)
    c("cuStreamSynchronize(destroyed)", d.cuStreamSynchronize, s)
    c("cuMemcpyAsync(destroyed)", d.cuMemcpyAsync, P(q), P(p), 4096, s)
    c("cuMemsetD8Async(destroyed)", d.cuMemsetD8Async, p, 1, 16, s)
    ctx_after(c)
