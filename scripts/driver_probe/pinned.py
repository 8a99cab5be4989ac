"""B. Pinned host memory: cuMemHostAlloc flags, cuMemFreeHost misuse,
cuMemHostRegister, read-only registrations, timings.
"""

from __future__ import annotations

import time

import numpy as np

from ._framework import PAGE, Case, KiB, MiB, call, d, jv, ok, probe, qcall
from ._helpers import (
    P,
    ctx_after,
    dalloc,
    host_buf,
    host_bytes,
    host_memset,
    median_ms,
    pinned,
    ptr_attrs,
)


@probe("B_hostalloc_flags")
def b_hostalloc(c: Case):
    per = {}
    for f in (0, 1, 2, 3, 4, 5, 6, 7, 8, 0x100):
        r = c(f"cuMemHostAlloc(4096,{f:#x})", d.cuMemHostAlloc, 4096, f)
        if not r.ok:
            per[f] = {"alloc": r.name}
            continue
        h = r.v
        e = {"alloc": r.name, "ptr_type": type(h).__name__, "mod4096": P(h) % 4096}
        rf = call(d.cuMemHostGetFlags, h)
        e["get_flags"] = rf.name
        e["flags_value"] = jv(rf.v)
        rd = call(d.cuMemHostGetDevicePointer, h, 0)
        e["get_devptr"] = rd.name
        if rd.ok:
            e["devptr_equals_host"] = P(rd.v) == P(h)
            e["devptr_type"] = type(rd.v).__name__
        rd1 = call(d.cuMemHostGetDevicePointer, h, 1)
        e["get_devptr_flags1"] = rd1.name
        rm = call(
            d.cuPointerGetAttribute, d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, h
        )
        e["memory_type"] = jv(rm.v) if rm.ok else rm.name
        rfree = call(d.cuMemFreeHost, h)
        e["free"] = rfree.name
        per[f] = e
    c.val("per_flag", per)
    r = c("cuMemHostAlloc(0,0)", d.cuMemHostAlloc, 0, 0)
    c.val("size0_value", jv(r.v))
    if r.ok and P(r.v):
        c("cuMemFreeHost(size0 ptr)", d.cuMemFreeHost, r.v)
    r = c("cuMemHostAlloc(1<<50,0)", d.cuMemHostAlloc, 1 << 50, 0)
    if r.ok:
        call(d.cuMemFreeHost, r.v)
    r = c("cuMemAllocHost(4096)", d.cuMemAllocHost, 4096)
    if r.ok:
        rf = call(d.cuMemHostGetFlags, r.v)
        c.val("cuMemAllocHost_flags", jv(rf.v))
        c("cuMemFreeHost(cuMemAllocHost ptr)", d.cuMemFreeHost, r.v)
    c("cuMemAllocHost(0)", d.cuMemAllocHost, 0)
    # use of pinned memory through UVA
    h = pinned(c, 1 * MiB, 0)
    c("cuMemsetD8(pinned host ptr)", d.cuMemsetD8, P(h), 0x42, 4096)
    c.val("memset_on_pinned_bytes", list(host_bytes(P(h), 4)))
    p = dalloc(c, 1 * MiB)
    c("cuMemcpyHtoD(from pinned int)", d.cuMemcpyHtoD, p, P(h), 1 * MiB)
    c("cuMemcpyDtoD(pinned->dev)", d.cuMemcpyDtoD, p, P(h), 4096)
    c("cuMemcpy(pinned interior+100 -> dev)", d.cuMemcpy, P(p), P(h) + 100, 1000)
    arr, addr = host_buf(PAGE)
    c("cuMemHostGetDevicePointer(pageable)", d.cuMemHostGetDevicePointer, addr, 0)
    c("cuMemHostGetFlags(pageable)", d.cuMemHostGetFlags, addr)
    c("cuMemHostGetDevicePointer(pinned+100)", d.cuMemHostGetDevicePointer, P(h) + 100, 0)
    r = call(d.cuMemHostGetDevicePointer, P(h) + 100, 0)
    c.val("devptr_interior_offset", P(r.v) - P(h) if r.ok else None)
    c("cuMemHostGetFlags(pinned+100)", d.cuMemHostGetFlags, P(h) + 100)
    c("cuCtxSynchronize#after", d.cuCtxSynchronize)
    del arr


@probe("B_freehost_misuse", isolated=True)
def b_freehost_misuse(c: Case):
    r = ok(d.cuMemHostAlloc, 4096, 0)
    h = r.v
    c("cuMemFreeHost#1", d.cuMemFreeHost, h)
    c("cuMemFreeHost#2 (double)", d.cuMemFreeHost, h)
    arr, addr = host_buf(PAGE)
    c("cuMemFreeHost(numpy ptr)", d.cuMemFreeHost, addr)
    c("cuMemFreeHost(0)", d.cuMemFreeHost, 0)
    r = ok(d.cuMemHostAlloc, 4096, 0)
    h2 = r.v
    c("cuMemFree(pinned ptr)", d.cuMemFree, P(h2))
    c("cuMemFreeHost(pinned+256 interior)", d.cuMemFreeHost, P(h2) + 256)
    c("cuMemFreeHost(after misuse)", d.cuMemFreeHost, h2)
    p = ok(d.cuMemAlloc, 4096).v
    c("cuMemFreeHost(device ptr)", d.cuMemFreeHost, P(p))
    c("cuMemHostRegister(device ptr)", d.cuMemHostRegister, P(p), 4096, 0)
    c("cuMemFree(device ptr)#cleanup", d.cuMemFree, p)
    ctx_after(c)
    del arr


REG_N = 64 * KiB


@probe("B_host_register")
def b_register(c: Case):
    per = {}
    for f in (0, 1, 2, 3, 4, 8, 0x10):
        arr, addr = host_buf(REG_N)
        r = c(f"cuMemHostRegister(aligned,{f:#x})", d.cuMemHostRegister, addr, REG_N, f)
        e = {"register": r.name}
        if r.ok:
            rf = call(d.cuMemHostGetFlags, addr)
            e["get_flags"] = rf.name
            e["flags_value"] = jv(rf.v)
            rd = call(d.cuMemHostGetDevicePointer, addr, 0)
            e["get_devptr"] = rd.name
            if rd.ok:
                e["devptr_equals_host"] = P(rd.v) == P(addr)
            rm = call(
                d.cuPointerGetAttribute,
                d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                addr,
            )
            e["memory_type"] = jv(rm.v) if rm.ok else rm.name
            e["unregister"] = call(d.cuMemHostUnregister, addr).name
        per[f] = e
        del arr
    c.val("per_flag_aligned", per)
    per = {}
    for f in (0, 1, 2, 8):
        arr, addr = host_buf(REG_N, offset=100)
        r = c(f"cuMemHostRegister(unaligned+100,{f:#x})", d.cuMemHostRegister, addr, REG_N - 200, f)
        e = {"register": r.name}
        if r.ok:
            rd = call(d.cuMemHostGetDevicePointer, addr, 0)
            e["get_devptr"] = rd.name
            e["devptr_equals_host"] = P(rd.v) == P(addr) if rd.ok else None
            ra = call(d.cuMemGetAddressRange, addr)
            e["address_range"] = ra.name
            e["unregister"] = call(d.cuMemHostUnregister, addr).name
        per[f] = e
        del arr
    c.val("per_flag_unaligned", per)

    arr, addr = host_buf(4 * REG_N)
    c("register(A)", d.cuMemHostRegister, addr, REG_N, 0)
    c("register(A) again same range", d.cuMemHostRegister, addr, REG_N, 0)
    for lab, start in (
        ("register overlapping (A+4096)", addr + PAGE),
        ("register overlapping tail (A+REG_N-4096)", addr + REG_N - PAGE),
    ):
        r = c(lab, d.cuMemHostRegister, start, REG_N, 0)
        if r.ok:
            c.note(f"{lab} succeeded")
            call(d.cuMemHostUnregister, start)
    c("register adjacent (A+REG_N)", d.cuMemHostRegister, addr + REG_N, REG_N, 0)
    c("unregister adjacent", d.cuMemHostUnregister, addr + REG_N)
    c("register size 0", d.cuMemHostRegister, addr + 2 * REG_N, 0, 0)
    c("register ptr 0", d.cuMemHostRegister, 0, REG_N, 0)
    r = c("cuMemHostGetDevicePointer(registered)", d.cuMemHostGetDevicePointer, addr, 0)
    c.val("registered_devptr_equals_host", P(r.v) == addr if r.ok else None)
    ptr_attrs(c, "registered_attrs", addr)
    r = c("cuMemGetAddressRange(registered+100)", d.cuMemGetAddressRange, addr + 100)
    c.val(
        "registered_range",
        {"base_eq": P(r.outs[0]) == addr if r.ok else None, "size": jv(r.outs[1])},
    )
    # data path through the device pointer of registered memory
    host_memset(addr, 0, REG_N)
    p = dalloc(c, REG_N)
    ok(d.cuMemsetD8, p, 0x33, REG_N)
    rdp = call(d.cuMemHostGetDevicePointer, addr, 0)
    rdst = rdp.v if rdp.ok else addr
    c("cuMemcpyDtoD(registered devptr <- dev)", d.cuMemcpyDtoD, rdst, p, 128)
    c.val("registered_bytes_after_copy", list(host_bytes(addr, 4)))
    c("unregister interior (A+4096)", d.cuMemHostUnregister, addr + PAGE)
    c("unregister(A)", d.cuMemHostUnregister, addr)
    c("unregister(A) twice", d.cuMemHostUnregister, addr)
    a2, addr2 = host_buf(PAGE)
    c("unregister unknown numpy", d.cuMemHostUnregister, addr2)
    c("unregister 0", d.cuMemHostUnregister, 0)
    h = pinned(c, REG_N, 0)
    c("register cuMemHostAlloc memory", d.cuMemHostRegister, h, REG_N, 0)
    c("unregister cuMemHostAlloc memory", d.cuMemHostUnregister, h)
    c("cuCtxSynchronize#after", d.cuCtxSynchronize)
    del arr, a2


@probe("B_register_readonly_write", isolated=True)
def b_readonly(c: Case):
    arr, addr = host_buf(REG_N)
    host_memset(addr, 0x11, REG_N)
    r = c("cuMemHostRegister(READ_ONLY)", d.cuMemHostRegister, addr, REG_N, 8)
    r = c("cuMemHostGetDevicePointer", d.cuMemHostGetDevicePointer, addr, 0)
    dptr = r.v if r.ok else addr
    p = dalloc(c, REG_N)
    c("cuMemcpyDtoD(dev <- readonly) read", d.cuMemcpyDtoD, p, dptr, 4096)
    c("cuMemsetD8(readonly devptr)", d.cuMemsetD8, dptr, 0x22, 4096)
    c("cuCtxSynchronize#mid", d.cuCtxSynchronize)
    c.val("bytes_after_memset", list(host_bytes(addr, 4)))
    c("cuMemcpyHtoD(readonly devptr as dst)", d.cuMemcpyHtoD, dptr, np.zeros(16, np.uint8), 16)
    ctx_after(c)
    c("cuMemHostUnregister", d.cuMemHostUnregister, addr)
    del arr


@probe("B_timing_hostalloc")
def b_timing(c: Case):
    for n, reps, label in ((4 * KiB, 20, "4KiB"), (256 * MiB, 5, "256MiB")):
        ta, tf, tt = [], [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            r = qcall(d.cuMemHostAlloc, n, 0)
            t1 = time.perf_counter()
            if not r.ok:
                c.record(f"alloc {label}", r.name)
                break
            qcall(d.cuMemFreeHost, r.v)
            t2 = time.perf_counter()
            ta.append(t1 - t0)
            tf.append(t2 - t1)
            tt.append(t2 - t0)
        if tt:
            c.val(f"hostalloc_{label}_median_ms", median_ms(ta))
            c.val(f"freehost_{label}_median_ms", median_ms(tf))
            c.val(f"pair_{label}_median_ms", median_ms(tt))
            c.val(f"pair_{label}_min_ms", round(min(tt) * 1e3, 4))
    # register/unregister of 64 MiB pageable
    arr, addr = host_buf(64 * MiB)
    host_memset(addr, 0, 64 * MiB)
    tr, tu = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        r = qcall(d.cuMemHostRegister, addr, 64 * MiB, 0)
        t1 = time.perf_counter()
        if not r.ok:
            c.record("register 64MiB", r.name)
            break
        qcall(d.cuMemHostUnregister, addr)
        t2 = time.perf_counter()
        tr.append(t1 - t0)
        tu.append(t2 - t1)
    if tr:
        c.val("register_64MiB_median_ms", median_ms(tr))
        c.val("unregister_64MiB_median_ms", median_ms(tu))
    c.record("timing", "CUDA_SUCCESS")
    del arr
