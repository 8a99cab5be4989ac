"""D. Virtual memory management (cuMemCreate / cuMemMap): granularity,
reservations, physical handles, mappings and access, export/import, timings.
"""

from __future__ import annotations

import ctypes
import os
import time

import numpy as np

from ._framework import Case, GiB, MiB, call, d, jv, ok, probe, qcall, tv
from ._helpers import (
    AT,
    HT,
    POSIX_FD,
    P,
    access_desc,
    ctx_after,
    dalloc,
    dev_loc,
    host_loc,
    inv_loc,
    median_ms,
    numa_cur_loc,
    numa_loc,
    ptr_attrs,
    vmm_prop,
)

GF = d.CUmemAllocationGranularity_flags


def reserve(c: Case, size, align=0, addr=0):
    r = ok(d.cuMemAddressReserve, size, align, addr, 0)
    c.defer(d.cuMemAddressFree, r.v, size)
    return r.v


def vcreate(c: Case, size, prop=None):
    r = ok(d.cuMemCreate, size, prop or vmm_prop(), 0)
    c.defer(d.cuMemRelease, r.v)
    return r.v


def vmap(c: Case, va, size, h):
    ok(d.cuMemMap, va, size, 0, h, 0)
    c.defer(d.cuMemUnmap, va, size)


@probe("D_granularity")
def d_gran(c: Case):
    out = {}
    combos = {
        "DEVICE0": lambda ht: vmm_prop(0, ht),
        "DEVICE7": lambda ht: vmm_prop(7, ht),
        "HOST_NUMA0": lambda ht: vmm_prop(loc_=numa_loc(0), handle_types=ht),
        "HOST": lambda ht: vmm_prop(loc_=host_loc(), handle_types=ht),
        "HOST_NUMA_CURRENT": lambda ht: vmm_prop(loc_=numa_cur_loc(), handle_types=ht),
        "DEVICE0_type_MANAGED": lambda ht: vmm_prop(0, ht, type_=AT.CU_MEM_ALLOCATION_TYPE_MANAGED),
        "DEVICE0_type_INVALID": lambda ht: vmm_prop(0, ht, type_=AT.CU_MEM_ALLOCATION_TYPE_INVALID),
        "INVALID_location": lambda ht: vmm_prop(loc_=inv_loc(), handle_types=ht),
    }
    for lname, mk in combos.items():
        for htn, ht in (("NONE", 0), ("POSIX_FD", POSIX_FD)):
            for gname, g in (
                ("min", GF.CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                ("rec", GF.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
            ):
                r = call(d.cuMemGetAllocationGranularity, mk(ht), g)
                out[f"{lname}/{htn}/{gname}"] = r.v if r.ok else r.name
    c.val("granularity", out)
    c(
        "DEVICE0 option MINIMUM (enum)",
        d.cuMemGetAllocationGranularity,
        vmm_prop(),
        GF.CU_MEM_ALLOC_GRANULARITY_MINIMUM,
    )
    c("option int 0", d.cuMemGetAllocationGranularity, vmm_prop(), 0)
    c("option 2 (bad)", d.cuMemGetAllocationGranularity, vmm_prop(), 2)
    c(
        "handle type FABRIC",
        d.cuMemGetAllocationGranularity,
        vmm_prop(handle_types=HT.CU_MEM_HANDLE_TYPE_FABRIC),
        0,
    )


@probe("D_reserve")
def d_reserve(c: Case):
    R = d.cuMemAddressReserve
    c("reserve(size 0)", R, 0, 0, 0, 0)
    c("reserve(2MiB+4096) not multiple of granularity", R, 2 * MiB + 4096, 0, 0, 0)
    c("reserve(4096) below granularity", R, 4096, 0, 0, 0)
    c("reserve(2MiB, alignment 3)", R, 2 * MiB, 3, 0, 0)
    r = c("reserve(2MiB, alignment 4096)", R, 2 * MiB, 4096, 0, 0)
    if r.ok:
        call(d.cuMemAddressFree, r.v, 2 * MiB)
    r = c("reserve(2MiB, alignment 4096)#keep", R, 2 * MiB, 4096, 0, 0)
    if r.ok:
        c.val("align4096_ptr_mod2MiB", P(r.v) % (2 * MiB))
        call(d.cuMemAddressFree, r.v, 2 * MiB)
    r = c("reserve(2MiB, alignment 1GiB)", R, 2 * MiB, GiB, 0, 0)
    if r.ok:
        c.val("align1GiB_ptr_mod1GiB", P(r.v) % GiB)
        call(d.cuMemAddressFree, r.v, 2 * MiB)
    r = c("reserve(4MiB)", R, 4 * MiB, 0, 0, 0)
    va = r.v
    c.defer(d.cuMemAddressFree, va, 4 * MiB)
    c.val(
        "reserve_ptr", {"hex": hex(P(va)), "type": type(va).__name__, "mod2MiB": P(va) % (2 * MiB)}
    )
    r = c("reserve(2MiB, addr=existing va) collision", R, 2 * MiB, 0, va, 0)
    if r.ok:
        c.val("collision_returned_differs", P(r.v) != P(va))
        c.val("collision_returned_hex", hex(P(r.v)))
        call(d.cuMemAddressFree, r.v, 2 * MiB)
    r = c("reserve(2MiB, addr=va+1MiB) collision unaligned", R, 2 * MiB, 0, P(va) + MiB, 0)
    if r.ok:
        c.val("collision_unaligned_returned_differs", P(r.v) != P(va) + MiB)
        call(d.cuMemAddressFree, r.v, 2 * MiB)
    hint = P(va) + 64 * GiB
    r = c("reserve(2MiB, addr=va+64GiB) free hint", R, 2 * MiB, 0, hint, 0)
    if r.ok:
        c.val("hint_honoured", P(r.v) == hint)
        call(d.cuMemAddressFree, r.v, 2 * MiB)
    r = c("reserve(2MiB, flags=1)", R, 2 * MiB, 0, 0, 1)
    if r.ok:
        call(d.cuMemAddressFree, r.v, 2 * MiB)
    r = c("reserve(1<<60)", R, 1 << 60, 0, 0, 0)
    if r.ok:
        call(d.cuMemAddressFree, r.v, 1 << 60)
    r = ok(R, 4 * MiB, 0, 0, 0)
    vb = r.v
    c("free(vb, wrong size 2MiB)", d.cuMemAddressFree, vb, 2 * MiB)
    c("free(vb+2MiB, 2MiB) tail part", d.cuMemAddressFree, P(vb) + 2 * MiB, 2 * MiB)
    c("free(vb, 4MiB)", d.cuMemAddressFree, vb, 4 * MiB)
    c("free(vb, 4MiB) twice", d.cuMemAddressFree, vb, 4 * MiB)
    c("free(0x1234000)", d.cuMemAddressFree, 0x1234000, 2 * MiB)
    c("free(0, 0)", d.cuMemAddressFree, 0, 0)
    p = dalloc(c, 2 * MiB)
    c("cuMemAddressFree(cuMemAlloc ptr)", d.cuMemAddressFree, p, 2 * MiB)
    c("cuMemFree(reserved va)", d.cuMemFree, va)


@probe("D_create")
def d_create(c: Case):
    C = d.cuMemCreate
    G = 2 * MiB
    c("create(size 0)", C, 0, vmm_prop(), 0)
    c("create(2MiB+4096) unaligned", C, G + 4096, vmm_prop(), 0)
    c("create(4096)", C, 4096, vmm_prop(), 0)
    c("create(DEVICE7)", C, G, vmm_prop(7), 0)
    for lname, where in (
        ("HOST_NUMA0", numa_loc(0)),
        ("HOST", host_loc()),
        ("HOST_NUMA_CURRENT", numa_cur_loc()),
        ("INVALID", inv_loc()),
    ):
        r = c(f"create({lname}, PINNED)", C, G, vmm_prop(loc_=where), 0)
        if r.ok:
            rp = call(d.cuMemGetAllocationPropertiesFromHandle, r.v)
            c.val(f"props_{lname}", jv(rp.v))
            call(d.cuMemRelease, r.v)
    r = c(
        "create(DEVICE0, type MANAGED)", C, G, vmm_prop(type_=AT.CU_MEM_ALLOCATION_TYPE_MANAGED), 0
    )
    if r.ok:
        call(d.cuMemRelease, r.v)
    r = c("create(type INVALID)", C, G, vmm_prop(type_=AT.CU_MEM_ALLOCATION_TYPE_INVALID), 0)
    r = c("create(flags=1)", C, G, vmm_prop(), 1)
    if r.ok:
        call(d.cuMemRelease, r.v)
    r = c("create(POSIX_FD)", C, G, vmm_prop(handle_types=POSIX_FD), 0)
    if r.ok:
        call(d.cuMemRelease, r.v)
    r = c("create(FABRIC)", C, G, vmm_prop(handle_types=HT.CU_MEM_HANDLE_TYPE_FABRIC), 0)
    if r.ok:
        call(d.cuMemRelease, r.v)
    r = c("create(1<<50)", C, 1 << 50, vmm_prop(), 0)
    if r.ok:
        call(d.cuMemRelease, r.v)
    r = c("create(2MiB)", C, G, vmm_prop(), 0)
    h = r.v
    c.val("handle", {"type": type(h).__name__, "int": jv(h)})
    r = c("cuMemGetAllocationPropertiesFromHandle", d.cuMemGetAllocationPropertiesFromHandle, h)
    c.val("props_device0", jv(r.v))
    c("cuMemGetAllocationPropertiesFromHandle(0)", d.cuMemGetAllocationPropertiesFromHandle, 0)
    c("cuMemRelease", d.cuMemRelease, h)
    c("cuMemRelease(0)", d.cuMemRelease, 0)
    r = c("cuMemGetInfo#before", d.cuMemGetInfo)
    f0 = r.outs[0]
    r = c("create(64MiB)", C, 64 * MiB, vmm_prop(), 0)
    r2 = call(d.cuMemGetInfo)
    if r.ok and f0 is not None:
        c.val("free_delta_after_create_64MiB", f0 - r2.outs[0])
        call(d.cuMemRelease, r.v)


@probe("D_map_access")
def d_map(c: Case):
    G = 2 * MiB
    va = reserve(c, 8 * G)
    h = vcreate(c, G)
    h2 = vcreate(c, 2 * G)

    def M(ptr, size, off, hh, flags):
        res = d.cuMemMap(ptr, size, off, hh, flags)
        if res[0] == d.CUresult.CUDA_SUCCESS:
            c.defer(d.cuMemUnmap, ptr, size)
        return res

    M.__name__ = "cuMemMap"
    c("map(offset 4096)", M, va, G, 4096, h, 0)
    c("map(offset 2MiB, h2 4MiB)", M, va, G, G, h2, 0)
    c("map(size 4MiB > physical 2MiB)", M, va, 2 * G, 0, h, 0)
    c("map(size 4096)", M, va, 4096, 0, h, 0)
    c("map(va+4096 unaligned)", M, P(va) + 4096, G, 0, h, 0)
    c("map(flags=1)", M, va, G, 0, h, 1)
    c("map(handle 0)", M, va, G, 0, 0, 0)
    c("map(unreserved va 0x1234000000)", M, 0x1234000000, G, 0, h, 0)
    c("map(va+7*2MiB, 4MiB) crossing reservation end", M, P(va) + 7 * G, 2 * G, 0, h2, 0)
    c("map(va, 2MiB) partial map of 16MiB reservation", M, va, G, 0, h, 0)
    c("map(va) double map same VA", M, va, G, 0, h, 0)
    c("map(va, 4MiB) overlapping mapped", M, va, 2 * G, 0, h2, 0)
    c("map(va+2MiB) same handle twice", M, P(va) + G, G, 0, h, 0)
    c("unmap(va+4*2MiB) unmapped range", d.cuMemUnmap, P(va) + 4 * G, G)
    c("unmap(va+4096) unaligned", d.cuMemUnmap, P(va) + 4096, G)
    c("unmap(va, 4096)", d.cuMemUnmap, va, 4096)
    c("unmap(0x1234000000)", d.cuMemUnmap, 0x1234000000, G)
    ptr_attrs(c, "mapped_no_access", va)
    GA = d.cuMemGetAccess
    r = c("getAccess(DEVICE0, va) before set", GA, dev_loc(0), va)
    c.val("access_before_set", tv(r.v))
    S = d.cuMemSetAccess
    c("setAccess(unmapped va+4*2MiB)", S, P(va) + 4 * G, G, [access_desc(dev_loc(0))], 1)
    c(
        "setAccess(partially mapped 4*2MiB starting at va+2MiB)",
        S,
        P(va) + G,
        4 * G,
        [access_desc(dev_loc(0))],
        1,
    )
    c(
        "setAccess(2 descs device0 twice)",
        S,
        va,
        G,
        [access_desc(dev_loc(0)), access_desc(dev_loc(0))],
        2,
    )
    c("setAccess(DEVICE7)", S, va, G, [access_desc(dev_loc(7))], 1)
    c("setAccess(HOST loc)", S, va, G, [access_desc(host_loc())], 1)
    c("setAccess(count 0)", S, va, G, [], 0)
    c(
        "setAccess(READ)",
        S,
        va,
        G,
        [access_desc(dev_loc(0), d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ)],
        1,
    )
    r = call(GA, dev_loc(0), va)
    c.val("access_after_read", jv(r.v) if r.ok else r.name)
    c(
        "setAccess(NONE)",
        S,
        va,
        G,
        [access_desc(dev_loc(0), d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_NONE)],
        1,
    )
    r = call(GA, dev_loc(0), va)
    c.val("access_after_none", jv(r.v) if r.ok else r.name)
    c("setAccess(RW)", S, va, G, [access_desc(dev_loc(0))], 1)
    r = c("getAccess(DEVICE0, va) after RW", GA, dev_loc(0), va)
    c.val("access_after_rw", tv(r.v))
    r = c("getAccess(DEVICE0, va+4096) interior", GA, dev_loc(0), P(va) + 4096)
    c.val("access_interior", jv(r.v))
    r = c("getAccess(DEVICE0, va+2MiB) second mapping without set", GA, dev_loc(0), P(va) + G)
    c.val("access_second_mapping", jv(r.v))
    c("getAccess(DEVICE7)", GA, dev_loc(7), va)
    c("getAccess(HOST)", GA, host_loc(), va)
    c("getAccess(unmapped)", GA, dev_loc(0), P(va) + 4 * G)
    p = dalloc(c, G)
    c("getAccess(cuMemAlloc ptr)", GA, dev_loc(0), p)
    c("memset through mapping (RW)", d.cuMemsetD8, va, 0x3C, G)
    hb = np.zeros(16, np.uint8)
    c("DtoH through mapping", d.cuMemcpyDtoH, hb, va, 16)
    c.val("bytes_read_back", [int(x) for x in hb[:4]])
    c("DtoD mapping->cuMemAlloc", d.cuMemcpyDtoD, p, va, G)
    ptr_attrs(c, "mapped_rw", va)
    r = c("cuMemGetAddressRange(va+100)", d.cuMemGetAddressRange, P(va) + 100)
    c.val(
        "address_range_mapped",
        {"base_eq": P(r.outs[0]) == P(va) if r.ok else None, "size": jv(r.outs[1])},
    )
    r = c("cuMemRetainAllocationHandle(va)", d.cuMemRetainAllocationHandle, va)
    if r.ok:
        c.val("retained_equals_handle", P(r.v) == P(h))
        c.val("retained_type", type(r.v).__name__)
        c("cuMemRelease(retained)", d.cuMemRelease, r.v)
    r = c("cuMemRetainAllocationHandle(va+4096)", d.cuMemRetainAllocationHandle, P(va) + 4096)
    if r.ok:
        call(d.cuMemRelease, r.v)
    c("cuMemRetainAllocationHandle(unmapped)", d.cuMemRetainAllocationHandle, P(va) + 4 * G)
    c("cuMemRetainAllocationHandle(cuMemAlloc ptr)", d.cuMemRetainAllocationHandle, p)
    c("cuMemFree(mapped va)", d.cuMemFree, va)
    c("cuCtxSynchronize#after", d.cuCtxSynchronize)


@probe("D_no_access_use", isolated=True)
def d_no_access(c: Case):
    G = 2 * MiB
    va = reserve(c, G)
    h = vcreate(c, G)
    vmap(c, va, G, h)
    c("memset through mapping without access", d.cuMemsetD8, va, 1, 4096)
    c("cuCtxSynchronize#mid", d.cuCtxSynchronize)
    hb = np.zeros(16, np.uint8)
    c("DtoH through mapping without access", d.cuMemcpyDtoH, hb, va, 16)
    ctx_after(c)


@probe("D_release_free_while_mapped", isolated=True)
def d_release(c: Case):
    G = 2 * MiB
    r = ok(d.cuMemAddressReserve, 2 * G, 0, 0, 0)
    va = r.v
    h = ok(d.cuMemCreate, G, vmm_prop(), 0).v
    ok(d.cuMemMap, va, G, 0, h, 0)
    ok(d.cuMemSetAccess, va, G, [access_desc(dev_loc(0))], 1)
    c("cuMemRelease while mapped", d.cuMemRelease, h)
    c("memset after release", d.cuMemsetD8, va, 0x4D, G)
    hb = np.zeros(16, np.uint8)
    c("DtoH after release", d.cuMemcpyDtoH, hb, va, 16)
    c.val("bytes_after_release", [int(x) for x in hb[:4]])
    c("cuCtxSynchronize#mid", d.cuCtxSynchronize)
    r = c("cuMemRetainAllocationHandle after release", d.cuMemRetainAllocationHandle, va)
    if r.ok:
        c.val("retained_after_release_equals", P(r.v) == P(h))
        c("cuMemRelease(retained)", d.cuMemRelease, r.v)
    c("cuMemRelease twice", d.cuMemRelease, h)
    c("cuMemAddressFree while mapped", d.cuMemAddressFree, va, 2 * G)
    c("cuMemUnmap", d.cuMemUnmap, va, G)
    c("cuMemUnmap twice", d.cuMemUnmap, va, G)
    c("cuMemAddressFree after unmap", d.cuMemAddressFree, va, 2 * G)
    ctx_after(c)


@probe("D_export_import")
def d_export(c: Case):
    G = 2 * MiB
    h_fd = vcreate(c, G, vmm_prop(handle_types=POSIX_FD))
    h_no = vcreate(c, G, vmm_prop())
    E = d.cuMemExportToShareableHandle
    r = c("export(POSIX_FD requested)", E, h_fd, POSIX_FD, 0)
    fd = r.v
    c.val("fd", {"type": type(fd).__name__, "repr": repr(fd)[:80]})
    r2 = c("export(without requestedHandleTypes)", E, h_no, POSIX_FD, 0)
    if r2.ok:
        c.val("fd_no", repr(r2.v))
        try:
            os.close(int(r2.v))
        except Exception:
            pass
    c("export(handle type NONE)", E, h_fd, HT.CU_MEM_HANDLE_TYPE_NONE, 0)
    c("export(FABRIC)", E, h_fd, HT.CU_MEM_HANDLE_TYPE_FABRIC, 0)
    c("export(flags=1)", E, h_fd, POSIX_FD, 1)
    c("export(handle 0)", E, 0, POSIX_FD, 0)
    imp = d.cuMemImportFromShareableHandle
    forms = {}
    imported = None
    if r.ok:
        fdint = int(fd)
        for fname, arg in (
            ("int", fdint),
            ("returned_object", fd),
            ("ctypes.c_void_p", ctypes.c_void_p(fdint)),
        ):
            ri = call(imp, arg, POSIX_FD)
            forms[fname] = ri.name
            if ri.ok and imported is None:
                imported = ri.v
                c.record(f"import(fd as {fname})", ri.name)
            elif ri.ok:
                call(d.cuMemRelease, ri.v)
        c.val("import_arg_forms", forms)
        if imported is not None:
            c.val("imported_equals_original", P(imported) == P(h_fd))
            rp = call(d.cuMemGetAllocationPropertiesFromHandle, imported)
            c.val("imported_props", jv(rp.v) if rp.ok else rp.name)
            # data sharing between the two handles
            va = reserve(c, 2 * G)
            vmap(c, va, G, h_fd)
            vmap(c, P(va) + G, G, imported)
            ok(d.cuMemSetAccess, va, 2 * G, [access_desc(dev_loc(0))], 1)
            c("memset via original", d.cuMemsetD8, va, 0x6B, 4096)
            hb = np.zeros(4, np.uint8)
            c("read via imported", d.cuMemcpyDtoH, hb, P(va) + G, 4)
            c.val("imported_sees_data", [int(x) for x in hb])
            c("unmap imported", d.cuMemUnmap, P(va) + G, G)
            c("release imported", d.cuMemRelease, imported)
        try:
            os.close(fdint)
        except Exception:
            pass
        c("import(closed fd)", imp, fdint, POSIX_FD)
    c("import(garbage fd 9999)", imp, 9999, POSIX_FD)
    devnull = os.open(os.devnull, os.O_RDONLY)
    c("import(fd of /dev/null)", imp, devnull, POSIX_FD)
    os.close(devnull)
    c("import(handle type NONE)", imp, 9999, HT.CU_MEM_HANDLE_TYPE_NONE)


@probe("D_timing")
def d_timing(c: Case):
    S = 32 * MiB
    va = reserve(c, S)
    prop = vmm_prop()
    desc = [access_desc(dev_loc(0))]
    t_up, t_down = [], []
    for _ in range(50):
        t0 = time.perf_counter()
        r = qcall(d.cuMemCreate, S, prop, 0)
        if not r.ok:
            c.record("create", r.name)
            break
        h = r.v
        r1 = qcall(d.cuMemMap, va, S, 0, h, 0)
        r2 = qcall(d.cuMemSetAccess, va, S, desc, 1)
        t1 = time.perf_counter()
        r3 = qcall(d.cuMemUnmap, va, S)
        r4 = qcall(d.cuMemRelease, h)
        t2 = time.perf_counter()
        if not (r1.ok and r2.ok and r3.ok and r4.ok):
            c.record("cycle", [r1.name, r2.name, r3.name, r4.name])
            break
        t_up.append(t1 - t0)
        t_down.append(t2 - t1)
    c.record("50 cycles", "CUDA_SUCCESS" if len(t_up) == 50 else "incomplete")
    if t_up:
        c.val("create_map_setaccess_32MiB_median_ms", median_ms(t_up))
        c.val("unmap_release_32MiB_median_ms", median_ms(t_down))
