"""E. Stream-ordered memory pools: creation, attributes, statistics, misuse,
access, IPC, timings.
"""

from __future__ import annotations

import ctypes
import os
import time

import numpy as np

from ._framework import RUN, UINT64_MAX, Case, Ctx, KiB, MiB, Res, call, d, jv, ok, probe, tv
from ._helpers import (
    AT,
    HT,
    LT,
    POSIX_FD,
    P,
    access_desc,
    ctx_after,
    dalloc,
    dev_loc,
    host_loc,
    inv_loc,
    loc,
    new_stream,
    numa_cur_loc,
    numa_loc,
    ptr_attrs,
)

PA = d.CUmemPool_attribute
U64_ATTRS = {
    "RELEASE_THRESHOLD",
    "RESERVED_MEM_CURRENT",
    "RESERVED_MEM_HIGH",
    "USED_MEM_CURRENT",
    "USED_MEM_HIGH",
    "MAX_POOL_SIZE",
}
STAT_ATTRS = ("RESERVED_MEM_CURRENT", "USED_MEM_CURRENT", "RESERVED_MEM_HIGH", "USED_MEM_HIGH")


def pa(name):
    return getattr(PA, "CU_MEMPOOL_ATTR_" + name)


def pool_props(loc_=None, alloc_type=None, handle_types=0, max_size=0):
    p = d.CUmemPoolProps()
    p.allocType = alloc_type if alloc_type is not None else AT.CU_MEM_ALLOCATION_TYPE_PINNED
    p.handleTypes = handle_types
    p.location = loc_ if loc_ is not None else dev_loc(0)
    if max_size:
        p.maxSize = max_size
    return p


def new_pool(c: Case, **kw):
    r = ok(d.cuMemPoolCreate, pool_props(**kw))
    c.defer(d.cuMemPoolDestroy, r.v)
    return r.v


def pool_get_all(pool) -> dict:
    out = {}
    for a in PA:
        short = a.name.replace("CU_MEMPOOL_ATTR_", "")
        r = call(d.cuMemPoolGetAttribute, pool, a)
        out[short] = tv(r.v) if r.ok else r.name
    return out


def stats(pool) -> dict:
    out = {}
    for n in STAT_ATTRS:
        r = call(d.cuMemPoolGetAttribute, pool, pa(n))
        out[n.replace("_MEM", "")] = int(r.v) if r.ok else r.name
    return out


def set_u64(pool, name, v) -> Res:
    return call(d.cuMemPoolSetAttribute, pool, pa(name), d.cuuint64_t(v))


@probe("E_pool_create")
def e_create(c: Case):
    r = c("cuDeviceGetDefaultMemPool", d.cuDeviceGetDefaultMemPool, Ctx.dev)
    dflt = r.v
    c.val("default_pool", {"type": type(dflt).__name__, "int_nonzero": bool(P(dflt))})
    r = c("cuDeviceGetMemPool", d.cuDeviceGetMemPool, Ctx.dev)
    c.val("current_pool_is_default", P(r.v) == P(dflt) if r.ok else None)
    c("cuDeviceGetDefaultMemPool(dev7)", d.cuDeviceGetDefaultMemPool, 7)
    for lname, where, t in (
        ("DEVICE0/PINNED", dev_loc(0), AT.CU_MEM_ALLOCATION_TYPE_PINNED),
        ("HOST/PINNED", host_loc(), AT.CU_MEM_ALLOCATION_TYPE_PINNED),
        ("HOST_NUMA0/PINNED", numa_loc(0), AT.CU_MEM_ALLOCATION_TYPE_PINNED),
        ("DEVICE0/MANAGED", dev_loc(0), AT.CU_MEM_ALLOCATION_TYPE_MANAGED),
        ("NONE/MANAGED", loc(LT.CU_MEM_LOCATION_TYPE_NONE, 0), AT.CU_MEM_ALLOCATION_TYPE_MANAGED),
        ("DEVICE7/PINNED", dev_loc(7), AT.CU_MEM_ALLOCATION_TYPE_PINNED),
    ):
        r = c(f"cuMemGetDefaultMemPool({lname})", "cuMemGetDefaultMemPool", where, t)
        if r.ok:
            c.val(f"cuMemGetDefaultMemPool({lname})_equals_device_default", P(r.v) == P(dflt))
        r = c(f"cuMemGetMemPool({lname})", "cuMemGetMemPool", where, t)
    variants = {
        "device0": dict(),
        "device0_maxSize64MiB": dict(max_size=64 * MiB),
        "device0_POSIX_FD": dict(handle_types=POSIX_FD),
        "device0_FABRIC": dict(handle_types=HT.CU_MEM_HANDLE_TYPE_FABRIC),
        "device7": dict(loc_=dev_loc(7)),
        "HOST_id0_PINNED": dict(loc_=host_loc()),
        "HOST_NUMA0_PINNED": dict(loc_=numa_loc(0)),
        "HOST_NUMA_CURRENT_PINNED": dict(loc_=numa_cur_loc()),
        "device0_MANAGED": dict(alloc_type=AT.CU_MEM_ALLOCATION_TYPE_MANAGED),
        "HOST_MANAGED": dict(loc_=host_loc(), alloc_type=AT.CU_MEM_ALLOCATION_TYPE_MANAGED),
        "NONE_MANAGED": dict(
            loc_=loc(LT.CU_MEM_LOCATION_TYPE_NONE, 0), alloc_type=AT.CU_MEM_ALLOCATION_TYPE_MANAGED
        ),
        "type_INVALID": dict(alloc_type=AT.CU_MEM_ALLOCATION_TYPE_INVALID),
        "location_INVALID": dict(loc_=inv_loc()),
        "maxSize_1MiB": dict(max_size=MiB),
        "maxSize_3MiB+1": dict(max_size=3 * MiB + 1),
    }
    c.val("has_MANAGED_enum", hasattr(AT, "CU_MEM_ALLOCATION_TYPE_MANAGED"))
    for vname, kw in variants.items():
        r = c(f"cuMemPoolCreate({vname})", d.cuMemPoolCreate, pool_props(**kw))
        if r.ok:
            pool = r.v
            s = ok(d.cuStreamCreate, 1).v
            ra = call(d.cuMemAllocFromPoolAsync, MiB, pool, s)
            e = {"alloc_1MiB": ra.name}
            if ra.ok:
                e["ptr_mod2MiB"] = P(ra.v) % (2 * MiB)
                rm = call(
                    d.cuPointerGetAttribute,
                    d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                    ra.v,
                )
                e["memory_type"] = jv(rm.v) if rm.ok else rm.name
                rmg = call(
                    d.cuPointerGetAttribute,
                    d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_IS_MANAGED,
                    ra.v,
                )
                e["is_managed"] = jv(rmg.v) if rmg.ok else rmg.name
                rpool = call(
                    d.cuPointerGetAttribute,
                    d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
                    ra.v,
                )
                e["mempool_handle_equals"] = P(rpool.v) == P(pool) if rpool.ok else rpool.name
                e["memset"] = call(d.cuMemsetD8Async, ra.v, 1, MiB, s).name
                e["free"] = call(d.cuMemFreeAsync, ra.v, s).name
            e["sync"] = call(d.cuStreamSynchronize, s).name
            e["attrs"] = pool_get_all(pool)
            call(d.cuStreamDestroy, s)
            e["destroy"] = call(d.cuMemPoolDestroy, pool).name
            c.val(vname, e)
    c("cuMemPoolDestroy(default pool)", d.cuMemPoolDestroy, dflt)
    c("cuMemPoolDestroy(0)", d.cuMemPoolDestroy, 0)


@probe("E_pool_attributes")
def e_attrs(c: Case):
    pool = new_pool(c)
    dflt = ok(d.cuDeviceGetDefaultMemPool, Ctx.dev).v
    c.val("fresh_pool_get", pool_get_all(pool))
    c.val("default_pool_get", pool_get_all(dflt))
    sets = {}
    for a in PA:
        short = a.name.replace("CU_MEMPOOL_ATTR_", "")
        r = call(d.cuMemPoolGetAttribute, pool, a)
        if not r.ok:
            sets[short] = {"get": r.name}
            continue
        cur = r.v
        e = {}
        # set to the value just read (same type)
        e["set_same_value_same_type"] = call(d.cuMemPoolSetAttribute, pool, a, cur).name
        if short in U64_ATTRS:
            e["set_plain_int"] = call(d.cuMemPoolSetAttribute, pool, a, int(cur)).name
            e["set_cuuint64(0)"] = call(d.cuMemPoolSetAttribute, pool, a, d.cuuint64_t(0)).name
        else:
            e["set_cuuint64"] = call(
                d.cuMemPoolSetAttribute,
                pool,
                a,
                d.cuuint64_t(int(jv(cur)) if isinstance(jv(cur), int) else 0),
            ).name
            e["set_int_0"] = call(d.cuMemPoolSetAttribute, pool, a, 0).name
            e["set_int_1"] = call(d.cuMemPoolSetAttribute, pool, a, 1).name
        r2 = call(d.cuMemPoolGetAttribute, pool, a)
        e["value_after"] = jv(r2.v) if r2.ok else r2.name
        sets[short] = e
    c.val("fresh_pool_set", sets)
    c.record(
        "set RESERVED_MEM_CURRENT", sets.get("RESERVED_MEM_CURRENT", {}).get("set_cuuint64(0)")
    )
    c.record(
        "set RELEASE_THRESHOLD plain int", sets.get("RELEASE_THRESHOLD", {}).get("set_plain_int")
    )
    c(
        "set RELEASE_THRESHOLD cuuint64 UINT64_MAX",
        d.cuMemPoolSetAttribute,
        pool,
        pa("RELEASE_THRESHOLD"),
        d.cuuint64_t(UINT64_MAX),
    )
    c(
        "set REUSE_ALLOW_OPPORTUNISTIC 2",
        d.cuMemPoolSetAttribute,
        pool,
        pa("REUSE_ALLOW_OPPORTUNISTIC"),
        2,
    )
    r = call(d.cuMemPoolGetAttribute, pool, pa("REUSE_ALLOW_OPPORTUNISTIC"))
    c.val("reuse_opportunistic_after_set_2", jv(r.v))
    c(
        "set REUSE_ALLOW_OPPORTUNISTIC True",
        d.cuMemPoolSetAttribute,
        pool,
        pa("REUSE_ALLOW_OPPORTUNISTIC"),
        True,
    )
    c(
        "set USED_MEM_HIGH cuuint64(5)",
        d.cuMemPoolSetAttribute,
        pool,
        pa("USED_MEM_HIGH"),
        d.cuuint64_t(5),
    )
    c("set RELEASE_THRESHOLD None", d.cuMemPoolSetAttribute, pool, pa("RELEASE_THRESHOLD"), None)
    c("get(pool 0)", d.cuMemPoolGetAttribute, 0, pa("RELEASE_THRESHOLD"))
    c("get(attr int 99)", d.cuMemPoolGetAttribute, pool, 99)
    # default pool: threshold round trip (restored to 0)
    c(
        "default: set RELEASE_THRESHOLD 1MiB",
        d.cuMemPoolSetAttribute,
        dflt,
        pa("RELEASE_THRESHOLD"),
        d.cuuint64_t(MiB),
    )
    r = call(d.cuMemPoolGetAttribute, dflt, pa("RELEASE_THRESHOLD"))
    c.val("default_threshold_after_set", jv(r.v))
    call(d.cuMemPoolSetAttribute, dflt, pa("RELEASE_THRESHOLD"), d.cuuint64_t(0))


def stats_run(c: Case, label, props_kw, threshold, finish):
    """Allocation sequence on a fresh pool; records stats after each step."""
    pool = ok(d.cuMemPoolCreate, pool_props(**props_kw)).v
    s = ok(d.cuStreamCreate, 1).v
    seq = []
    try:
        r = set_u64(pool, "RELEASE_THRESHOLD", threshold)
        seq.append({"step": f"set threshold {threshold}", "result": r.name})
        seq.append({"step": "fresh", **stats(pool)})
        ptrs = {}
        first = None
        for n, nm in (
            (KiB, "1KiB"),
            (MiB, "1MiB"),
            (3 * MiB, "3MiB"),
            (33 * MiB, "33MiB"),
            (100 * MiB, "100MiB"),
        ):
            r = call(d.cuMemAllocFromPoolAsync, n, pool, s)
            rs = call(d.cuStreamSynchronize, s)
            e = {"step": f"alloc {nm}", "result": r.name, "sync": rs.name}
            if r.ok:
                ptrs[nm] = r.v
                a = P(r.v)
                first = a if first is None else first
                e.update(
                    {"mod512": a % 512, "mod2MiB": a % (2 * MiB), "offset_from_first": a - first}
                )
            e.update(stats(pool))
            seq.append(e)
        for nm in ("33MiB", "1KiB"):
            if nm in ptrs:
                r = call(d.cuMemFreeAsync, ptrs.pop(nm), s)
                seq.append({"step": f"free {nm} (no sync yet)", "result": r.name, **stats(pool)})
        rs = call(d.cuStreamSynchronize, s)
        seq.append({"step": "sync after frees", "result": rs.name, **stats(pool)})
        if finish == "trim0":
            r = call(d.cuMemPoolTrimTo, pool, 0)
            seq.append({"step": "trimTo 0", "result": r.name, **stats(pool)})
        elif finish == "trim64":
            r = call(d.cuMemPoolTrimTo, pool, 64 * MiB)
            seq.append({"step": "trimTo 64MiB", "result": r.name, **stats(pool)})
        r1 = set_u64(pool, "RESERVED_MEM_HIGH", 0)
        r2 = set_u64(pool, "USED_MEM_HIGH", 0)
        seq.append({"step": "reset peaks (HIGH := 0)", "result": [r1.name, r2.name], **stats(pool)})
        # reuse: allocate 1 KiB again, see whether it lands on the freed space
        r = call(d.cuMemAllocFromPoolAsync, KiB, pool, s)
        call(d.cuStreamSynchronize, s)
        if r.ok:
            ptrs["1KiB_again"] = r.v
            seq.append(
                {
                    "step": "alloc 1KiB again",
                    "result": r.name,
                    "offset_from_first": P(r.v) - (first or 0),
                    **stats(pool),
                }
            )
        for q in list(ptrs.values()):
            call(d.cuMemFreeAsync, q, s)
        seq.append({"step": "free all (no sync)", **stats(pool)})
        rs = call(d.cuStreamSynchronize, s)
        seq.append({"step": "sync after free all", "result": rs.name, **stats(pool)})
        r = call(d.cuMemPoolTrimTo, pool, 0)
        seq.append({"step": "final trimTo 0", "result": r.name, **stats(pool)})
    finally:
        call(d.cuStreamDestroy, s)
        call(d.cuMemPoolDestroy, pool)
    c.val(label, seq)
    c.record(
        label,
        "CUDA_SUCCESS"
        if all(
            (
                x.get("result", "CUDA_SUCCESS") in ("CUDA_SUCCESS",)
                or isinstance(x.get("result"), list)
            )
            for x in seq
        )
        else "see values",
    )


@probe("E_pool_stats")
def e_stats(c: Case):
    stats_run(c, "device_thrMAX_trim0", {}, UINT64_MAX, "trim0")
    stats_run(c, "device_thrMAX_trim64MiB", {}, UINT64_MAX, "trim64")
    stats_run(c, "device_thr0", {}, 0, "none")
    r = call(d.cuMemPoolCreate, pool_props(loc_=host_loc()))
    host_loc_ = host_loc()
    if not r.ok:
        r = call(d.cuMemPoolCreate, pool_props(loc_=numa_loc(0)))
        host_loc_ = numa_loc(0)
    if r.ok:
        call(d.cuMemPoolDestroy, r.v)
        stats_run(c, "pinned_host_thrMAX_trim0", {"loc_": host_loc_}, UINT64_MAX, "trim0")
        stats_run(c, "pinned_host_thr0", {"loc_": host_loc_}, 0, "none")
    else:
        c.note("no pinned host pool: " + str(r.name))
    stats_run(c, "device_maxSize64MiB_thrMAX", {"max_size": 64 * MiB}, UINT64_MAX, "trim0")
    # default pool (threshold 0): does memory go back at a sync?
    dflt = ok(d.cuDeviceGetDefaultMemPool, Ctx.dev).v
    s = new_stream(c)
    seq = [{"step": "before", **stats(dflt)}]
    r = call(d.cuMemAllocAsync, 8 * MiB, s)
    seq.append({"step": "cuMemAllocAsync 8MiB (no sync)", "result": r.name, **stats(dflt)})
    call(d.cuStreamSynchronize, s)
    seq.append({"step": "sync", **stats(dflt)})
    call(d.cuMemFreeAsync, r.v, s)
    seq.append({"step": "free (no sync)", **stats(dflt)})
    call(d.cuStreamSynchronize, s)
    seq.append({"step": "sync after free", **stats(dflt)})
    c.val("default_pool_seq", seq)


@probe("E_pool_alloc_misuse")
def e_alloc(c: Case):
    pool = new_pool(c, max_size=64 * MiB)
    s = new_stream(c)
    A = d.cuMemAllocFromPoolAsync
    c("allocFromPool(0 bytes)", A, 0, pool, s)
    c("allocFromPool(100MiB > maxSize 64MiB)", A, 100 * MiB, pool, s)
    r = c("allocFromPool(64MiB == maxSize)", A, 64 * MiB, pool, s)
    if r.ok:
        c("allocFromPool(1 more byte while full)", A, 1, pool, s)
        call(d.cuMemFreeAsync, r.v, s)
    c("allocFromPool(1<<60)", A, 1 << 60, pool, s)
    r = c("allocFromPool(1MiB, legacy stream 0)", A, MiB, pool, 0)
    if r.ok:
        c("freeAsync(legacy stream 0)", d.cuMemFreeAsync, r.v, 0)
    r = c("allocFromPool(1MiB, PER_THREAD)", A, MiB, pool, d.CU_STREAM_PER_THREAD)
    if r.ok:
        c("freeAsync(PER_THREAD)", d.cuMemFreeAsync, r.v, d.CU_STREAM_PER_THREAD)
    c("allocFromPool(pool 0)", A, MiB, 0, s)
    r = c("cuMemAllocAsync(1MiB, s)", d.cuMemAllocAsync, MiB, s)
    if r.ok:
        c("cuMemFreeAsync(default-pool ptr)", d.cuMemFreeAsync, r.v, s)
    c("cuMemAllocAsync(0, s)", d.cuMemAllocAsync, 0, s)
    r = c("allocFromPool(1MiB) for sync free", A, MiB, pool, s)
    if r.ok:
        c("cuMemFree(pool ptr) synchronous", d.cuMemFree, r.v)
    c("sync", d.cuStreamSynchronize, s)
    c("cuMemFreeAsync(0x1234000)", d.cuMemFreeAsync, 0x1234000, s)
    c("cuMemFreeAsync(0)", d.cuMemFreeAsync, 0, s)
    r = ok(A, MiB, pool, s)
    q = r.v
    ptr_attrs(c, "pool_ptr_attrs", q)
    rr = call(d.cuMemGetAddressRange, P(q) + 100)
    c.val(
        "pool_ptr_address_range",
        {"base_eq": P(rr.outs[0]) == P(q) if rr.ok else rr.name, "size": jv(rr.outs[1])},
    )
    call(d.cuMemFreeAsync, q, s)
    c("trimTo(0)", d.cuMemPoolTrimTo, pool, 0)
    c("trimTo(pool 0)", d.cuMemPoolTrimTo, 0, 0)
    c("trimTo(1<<62)", d.cuMemPoolTrimTo, pool, 1 << 62)
    c("sync#2", d.cuStreamSynchronize, s)
    c("cuCtxSynchronize#after", d.cuCtxSynchronize)


@probe("E_free_async_twice", isolated=True)
def e_free_twice(c: Case):
    pool = new_pool(c)
    s = new_stream(c)
    r = ok(d.cuMemAllocFromPoolAsync, MiB, pool, s)
    c("cuMemFreeAsync#1", d.cuMemFreeAsync, r.v, s)
    c("cuMemFreeAsync#2 (same ptr, no sync)", d.cuMemFreeAsync, r.v, s)
    c("sync", d.cuStreamSynchronize, s)
    c("cuMemFreeAsync#3 (after sync)", d.cuMemFreeAsync, r.v, s)
    c("sync#2", d.cuStreamSynchronize, s)
    c.val("stats", stats(pool))
    r = c("allocFromPool(1MiB) for interior free", d.cuMemAllocFromPoolAsync, MiB, pool, s)
    if r.ok:
        c("cuMemFreeAsync(interior +256)", d.cuMemFreeAsync, P(r.v) + 256, s)
        c("cuMemFreeAsync(base)", d.cuMemFreeAsync, r.v, s)
    p = ok(d.cuMemAlloc, MiB).v
    c("cuMemFreeAsync(cuMemAlloc ptr)", d.cuMemFreeAsync, p, s)
    c("sync#3", d.cuStreamSynchronize, s)
    r = call(d.cuMemGetAddressRange, p)
    c.val("cuMemAlloc_ptr_range_after_freeAsync", r.name)
    c("cuMemFree(cuMemAlloc ptr after freeAsync)", d.cuMemFree, p)
    ctx_after(c)


@probe("E_pool_destroy_live", isolated=True)
def e_destroy_live(c: Case):
    pool = ok(d.cuMemPoolCreate, pool_props()).v
    s = new_stream(c)
    r = ok(d.cuMemAllocFromPoolAsync, MiB, pool, s)
    q = r.v
    call(d.cuStreamSynchronize, s)
    c("cuMemPoolDestroy with live allocation", d.cuMemPoolDestroy, pool)
    c("memset after destroy", d.cuMemsetD8Async, q, 9, MiB, s)
    hb = np.zeros(4, np.uint8)
    c("DtoH after destroy", d.cuMemcpyDtoH, hb, q, 4)
    c.val("bytes", [int(x) for x in hb])
    c(
        "cuMemPoolGetAttribute(destroyed pool)",
        d.cuMemPoolGetAttribute,
        pool,
        pa("USED_MEM_CURRENT"),
    )
    c("cuMemAllocFromPoolAsync(destroyed pool)", d.cuMemAllocFromPoolAsync, MiB, pool, s)
    c("cuMemFreeAsync(ptr of destroyed pool)", d.cuMemFreeAsync, q, s)
    c("sync", d.cuStreamSynchronize, s)
    c("cuMemPoolDestroy again", d.cuMemPoolDestroy, pool)
    ctx_after(c)


@probe("E_pool_access")
def e_access(c: Case):
    pool = new_pool(c)
    SA = d.cuMemPoolSetAccess
    GA = d.cuMemPoolGetAccess
    F = d.CUmemAccess_flags
    r = c("getAccess(DEVICE0) fresh", GA, pool, dev_loc(0))
    c.val("access_dev0_fresh", tv(r.v))
    c("getAccess(DEVICE7)", GA, pool, dev_loc(7))
    r = c("getAccess(HOST)", GA, pool, host_loc())
    c.val("access_host_fresh", jv(r.v))
    c("setAccess(DEVICE0 RW)", SA, pool, [access_desc(dev_loc(0))], 1)
    c(
        "setAccess(DEVICE0 READ)",
        SA,
        pool,
        [access_desc(dev_loc(0), F.CU_MEM_ACCESS_FLAGS_PROT_READ)],
        1,
    )
    c(
        "setAccess(DEVICE0 NONE)",
        SA,
        pool,
        [access_desc(dev_loc(0), F.CU_MEM_ACCESS_FLAGS_PROT_NONE)],
        1,
    )
    r = c("getAccess(DEVICE0) after", GA, pool, dev_loc(0))
    c.val("access_dev0_after", jv(r.v))
    c("setAccess(DEVICE7 RW)", SA, pool, [access_desc(dev_loc(7))], 1)
    c("setAccess(HOST RW)", SA, pool, [access_desc(host_loc())], 1)
    c("setAccess(count 0)", SA, pool, [], 0)
    c("setAccess(2 descs dev0)", SA, pool, [access_desc(dev_loc(0)), access_desc(dev_loc(0))], 2)
    dflt = ok(d.cuDeviceGetDefaultMemPool, Ctx.dev).v
    r = c("getAccess(default pool, DEVICE0)", GA, dflt, dev_loc(0))
    c.val("default_access_dev0", jv(r.v))
    r = call(d.cuMemPoolCreate, pool_props(loc_=host_loc()))
    if r.ok:
        hp = r.v
        c.defer(d.cuMemPoolDestroy, hp)
        r2 = c("host pool getAccess(DEVICE0)", GA, hp, dev_loc(0))
        c.val("host_pool_access_dev0", jv(r2.v))
        r2 = c("host pool getAccess(HOST)", GA, hp, host_loc())
        c.val("host_pool_access_host", jv(r2.v))
        c("host pool setAccess(DEVICE0 RW)", SA, hp, [access_desc(dev_loc(0))], 1)
        r2 = call(GA, hp, dev_loc(0))
        c.val("host_pool_access_dev0_after_set", jv(r2.v))


@probe("E_pool_ipc")
def e_ipc(c: Case):
    ipc = new_pool(c, handle_types=POSIX_FD)
    plain = new_pool(c)
    s = new_stream(c)
    X = d.cuMemPoolExportToShareableHandle
    r = c("exportPool(ipc pool, POSIX_FD)", X, ipc, POSIX_FD, 0)
    fd = r.v
    c.val("pool_fd", {"type": type(fd).__name__, "repr": repr(fd)[:60]})
    c("exportPool(non-ipc pool)", X, plain, POSIX_FD, 0)
    c("exportPool(ipc pool, flags 1)", X, ipc, POSIX_FD, 1)
    c("exportPool(ipc pool, NONE)", X, ipc, HT.CU_MEM_HANDLE_TYPE_NONE, 0)
    dflt = ok(d.cuDeviceGetDefaultMemPool, Ctx.dev).v
    c("exportPool(default pool)", X, dflt, POSIX_FD, 0)
    if r.ok:
        ri = c(
            "importPool(own fd, same process)",
            d.cuMemPoolImportFromShareableHandle,
            int(fd),
            POSIX_FD,
            0,
        )
        if ri.ok:
            c.val("imported_pool_equals", P(ri.v) == P(ipc))
            c.val("imported_pool_attrs", pool_get_all(ri.v))
            c("alloc from imported pool", d.cuMemAllocFromPoolAsync, MiB, ri.v, s)
            if P(ri.v) != P(ipc):
                c("destroy imported pool", d.cuMemPoolDestroy, ri.v)
        try:
            os.close(int(fd))
        except Exception:
            pass
    c("importPool(garbage fd 9999)", d.cuMemPoolImportFromShareableHandle, 9999, POSIX_FD, 0)
    q = ok(d.cuMemAllocFromPoolAsync, MiB, ipc, s).v
    call(d.cuStreamSynchronize, s)
    r = c("exportPointer(ipc pool ptr)", d.cuMemPoolExportPointer, q)
    if r.ok:
        ed = r.v
        info = {"type": type(ed).__name__, "repr": repr(ed)[:200]}
        try:
            info["reserved"] = jv(ed.reserved)
        except Exception as e:
            info["reserved"] = f"<{type(e).__name__}>"
        if not RUN.dry:
            try:
                raw = ctypes.string_at(ed.getPtr(), 64)
                info["raw64_hex"] = raw.hex()
            except Exception as e:
                info["raw64"] = f"<{type(e).__name__}: {e}>"
        c.val("export_data", info)
        ri = c("importPointer(ipc pool, own export data)", d.cuMemPoolImportPointer, ipc, ed)
        if ri.ok:
            c.val("import_pointer_equals", P(ri.v) == P(q))
    r2 = ok(d.cuMemAllocFromPoolAsync, MiB, plain, s)
    c("exportPointer(non-ipc pool ptr)", d.cuMemPoolExportPointer, r2.v)
    call(d.cuMemFreeAsync, r2.v, s)
    p = dalloc(c, MiB)
    c("exportPointer(cuMemAlloc ptr)", d.cuMemPoolExportPointer, p)
    call(d.cuMemFreeAsync, q, s)
    c("sync", d.cuStreamSynchronize, s)


@probe("E_pool_import_pointer_garbage", isolated=True)
def e_import_garbage(c: Case):
    ipc = new_pool(c, handle_types=POSIX_FD)
    plain = new_pool(c)
    garbage = d.CUmemPoolPtrExportData()
    if not RUN.dry:
        ctypes.memmove(garbage.getPtr(), b"\xab" * 64, 64)
    c("importPointer(ipc pool, garbage 0xab*64)", d.cuMemPoolImportPointer, ipc, garbage)
    c("importPointer(ipc pool, zeroed)", d.cuMemPoolImportPointer, ipc, d.CUmemPoolPtrExportData())
    c("importPointer(non-ipc pool, garbage)", d.cuMemPoolImportPointer, plain, garbage)
    ctx_after(c)


@probe("E_timing")
def e_timing(c: Case):
    pool = new_pool(c)
    set_u64(pool, "RELEASE_THRESHOLD", UINT64_MAX)
    s = new_stream(c)
    A, F = d.cuMemAllocFromPoolAsync, d.cuMemFreeAsync
    if RUN.dry:  # raw calls would raise without libcuda

        def A(n, p_, s_):
            call(d.cuMemAllocFromPoolAsync, n, p_, s_)
            return (d.CUresult.CUDA_SUCCESS, d.CUdeviceptr(0))

        def F(q, s_):
            return call(d.cuMemFreeAsync, q, s_)

    # warm up
    r = ok(A, MiB, pool, s)
    call(F, r.v, s)
    call(d.cuStreamSynchronize, s)
    N = 10000
    t0 = time.perf_counter()
    bad = None
    for _ in range(N):
        r = A(MiB, pool, s)
        if r[0] != d.CUresult.CUDA_SUCCESS and not RUN.dry:
            bad = r[0].name
            break
        F(r[1], s)
    t1 = time.perf_counter()
    call(d.cuStreamSynchronize, s)
    t2 = time.perf_counter()
    c.record("device 1MiB pairs", bad or "CUDA_SUCCESS")
    c.val("device_pool_1MiB_pair_us", round((t1 - t0) / N * 1e6, 3))
    c.val("device_pool_1MiB_total_with_sync_ms", round((t2 - t0) * 1e3, 3))
    r = call(d.cuMemPoolCreate, pool_props(loc_=host_loc()))
    if not r.ok:
        r = call(d.cuMemPoolCreate, pool_props(loc_=numa_loc(0)))
    c.record("pinned host pool create", r.name)
    if r.ok:
        hp = r.v
        c.defer(d.cuMemPoolDestroy, hp)
        set_u64(hp, "RELEASE_THRESHOLD", UINT64_MAX)
        r = ok(A, 4 * KiB, hp, s)
        call(F, r.v, s)
        call(d.cuStreamSynchronize, s)
        t0 = time.perf_counter()
        for _ in range(N):
            r = A(4 * KiB, hp, s)
            if r[0] != d.CUresult.CUDA_SUCCESS and not RUN.dry:
                c.record("host 4KiB pairs", r[0].name)
                break
            F(r[1], s)
        t1 = time.perf_counter()
        call(d.cuStreamSynchronize, s)
        c.val("pinned_host_pool_4KiB_pair_us", round((t1 - t0) / N * 1e6, 3))
    c.note("raw binding calls, created stream, release threshold UINT64_MAX, sync after the loop")


@probe("E_free_async_destroyed_stream", isolated=True)
def e_destroyed(c: Case):
    pool = new_pool(c)
    s2 = new_stream(c)
    r = ok(d.cuMemAllocFromPoolAsync, MiB, pool, s2)
    call(d.cuStreamSynchronize, s2)
    s = ok(d.cuStreamCreate, 1).v
    c("cuStreamDestroy", d.cuStreamDestroy, s)
    c("cuMemFreeAsync(destroyed stream)", d.cuMemFreeAsync, r.v, s)
    c("cuMemAllocFromPoolAsync(destroyed stream)", d.cuMemAllocFromPoolAsync, MiB, pool, s)
    c("cuMemFreeAsync(valid stream)", d.cuMemFreeAsync, r.v, s2)
    c("sync", d.cuStreamSynchronize, s2)
    ctx_after(c)
