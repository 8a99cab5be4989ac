"""C. Managed memory: cuMemAllocManaged, advice, prefetch (single and batch),
range attributes, stream attach, timings.
"""

from __future__ import annotations

import time

from ._framework import Case, Ctx, KiB, MiB, Res, call, d, jv, ok, probe, qcall, tv
from ._helpers import (
    LOCS,
    P,
    ctx_after,
    dalloc,
    dev_loc,
    dp,
    host_buf,
    host_bytes,
    host_loc,
    host_memset,
    inv_loc,
    managed,
    median_ms,
    new_stream,
    numa_loc,
    pinned,
)

ADV = d.CUmem_advise
RA = d.CUmem_range_attribute


@probe("C_alloc_managed")
def c_alloc(c: Case):
    per = {}
    for f in (1, 2, 0, 3, 4):
        r = c(f"cuMemAllocManaged(4096,{f})", d.cuMemAllocManaged, 4096, f)
        e = {"alloc": r.name}
        if r.ok:
            m = r.v
            e["mod4096"] = P(m) % 4096
            e["mod2MiB"] = P(m) % (2 * MiB)
            ra = call(d.cuMemGetAddressRange, m)
            e["range_size"] = jv(ra.outs[1]) if ra.ok else ra.name
            ri = call(
                d.cuPointerGetAttribute, d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_IS_MANAGED, m
            )
            e["is_managed"] = tv(ri.v) if ri.ok else ri.name
            e["free"] = call(d.cuMemFree, m).name
        per[f] = e
    c.val("per_flag", per)
    r = c("cuMemAllocManaged(0,1)", d.cuMemAllocManaged, 0, 1)
    if r.ok and P(r.v):
        call(d.cuMemFree, r.v)
    c.val("size0_value", jv(r.v))
    # host access + device access of managed memory
    m = managed(c, 1 * MiB)
    host_memset(P(m), 0x5A, 1 * MiB)
    c("cuMemsetD8(managed)", d.cuMemsetD8, m, 0x11, 4096)
    c("cuCtxSynchronize", d.cuCtxSynchronize)
    c.val(
        "host_reads_after_device_memset",
        list(host_bytes(P(m), 2)) + list(host_bytes(P(m) + 4096, 2)),
    )
    c("cuMemFree(managed+256 interior)", d.cuMemFree, P(m) + 256)
    mh = managed(c, 64 * KiB, 2)
    c("cuMemsetD8(managed HOST-attached)", d.cuMemsetD8, mh, 1, 16)
    c("cuCtxSynchronize#2", d.cuCtxSynchronize)


@probe("C_advise")
def c_advise(c: Case):
    p = dalloc(c, 2 * MiB)
    c(
        "advise(cuMemAlloc mem, SET_READ_MOSTLY, DEVICE0)",
        d.cuMemAdvise,
        p,
        2 * MiB,
        ADV.CU_MEM_ADVISE_SET_READ_MOSTLY,
        dev_loc(0),
    )
    c(
        "advise(cuMemAlloc mem, SET_PREFERRED_LOCATION, DEVICE0)",
        d.cuMemAdvise,
        p,
        2 * MiB,
        ADV.CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
        dev_loc(0),
    )
    h = pinned(c, 2 * MiB)
    c(
        "advise(pinned host mem, SET_READ_MOSTLY)",
        d.cuMemAdvise,
        h,
        2 * MiB,
        ADV.CU_MEM_ADVISE_SET_READ_MOSTLY,
        dev_loc(0),
    )
    arr, addr = host_buf(2 * MiB)
    c(
        "advise(pageable numpy, SET_ACCESSED_BY DEVICE0)",
        d.cuMemAdvise,
        addr,
        2 * MiB,
        ADV.CU_MEM_ADVISE_SET_ACCESSED_BY,
        dev_loc(0),
    )
    call(d.cuMemAdvise, addr, 2 * MiB, ADV.CU_MEM_ADVISE_UNSET_ACCESSED_BY, dev_loc(0))
    m = managed(c, 4 * MiB)
    grid = {}
    for a in ADV:
        row = {}
        for lname, mk in LOCS.items():
            r = call(d.cuMemAdvise, m, 4 * MiB, a, mk())
            row[lname] = r.name
        grid[a.name.replace("CU_MEM_ADVISE_", "")] = row
    c.val("advice_x_location", grid)
    c.record("grid:SET_PREFERRED_LOCATION/DEVICE7", grid["SET_PREFERRED_LOCATION"]["DEVICE7"])
    c.record("grid:SET_PREFERRED_LOCATION/INVALID", grid["SET_PREFERRED_LOCATION"]["INVALID"])
    c.record("grid:SET_ACCESSED_BY/HOST", grid["SET_ACCESSED_BY"]["HOST"])
    for a in ADV:  # leave clean
        if "UNSET" in a.name:
            call(d.cuMemAdvise, m, 4 * MiB, a, dev_loc(0))
    rm = ADV.CU_MEM_ADVISE_SET_READ_MOSTLY
    c("advise(m+100, 1000) unaligned sub-range", d.cuMemAdvise, P(m) + 100, 1000, rm, dev_loc(0))
    r = call(d.cuMemRangeGetAttribute, 4, RA.CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, m, 4096)
    c.val("read_mostly_first_page_after_unaligned_advise", jv(r.v) if r.ok else r.name)
    r = call(d.cuMemRangeGetAttribute, 4, RA.CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, P(m) + 4096, 4096)
    c.val("read_mostly_second_page_after_unaligned_advise", jv(r.v) if r.ok else r.name)
    call(d.cuMemAdvise, m, 4 * MiB, ADV.CU_MEM_ADVISE_UNSET_READ_MOSTLY, dev_loc(0))
    c("advise(size 0)", d.cuMemAdvise, m, 0, rm, dev_loc(0))
    c("advise(past end: 8MiB on 4MiB)", d.cuMemAdvise, m, 8 * MiB, rm, dev_loc(0))
    c("advise(interior m+2MiB, 2MiB)", d.cuMemAdvise, P(m) + 2 * MiB, 2 * MiB, rm, dev_loc(0))
    c("advise(0x1234000 unknown)", d.cuMemAdvise, 0x1234000, 4096, rm, dev_loc(0))
    c("advise(CUdeviceptr arg)", d.cuMemAdvise, dp(m), 4096, rm, dev_loc(0))
    c("advise(int advice 1)", d.cuMemAdvise, m, 4096, 1, dev_loc(0))
    c("advise(advice 99)", d.cuMemAdvise, m, 4096, 99, dev_loc(0))
    c("cuCtxSynchronize#after", d.cuCtxSynchronize)
    del arr


@probe("C_prefetch")
def c_prefetch(c: Case):
    m = managed(c, 4 * MiB)
    s = new_stream(c)
    n = 4 * MiB
    for lname, mk in LOCS.items():
        c(f"prefetch(whole, {lname}, s)", d.cuMemPrefetchAsync, m, n, mk(), 0, s)
    c("sync", d.cuStreamSynchronize, s)
    c("prefetch(size 0)", d.cuMemPrefetchAsync, m, 0, dev_loc(0), 0, s)
    c("prefetch(m+100, 1000) unaligned", d.cuMemPrefetchAsync, P(m) + 100, 1000, dev_loc(0), 0, s)
    c("prefetch(past end 8MiB)", d.cuMemPrefetchAsync, m, 8 * MiB, dev_loc(0), 0, s)
    c("prefetch(interior m+1MiB,1MiB)", d.cuMemPrefetchAsync, P(m) + MiB, MiB, dev_loc(0), 0, s)
    p = dalloc(c, 2 * MiB)
    c("prefetch(cuMemAlloc mem)", d.cuMemPrefetchAsync, p, 2 * MiB, dev_loc(0), 0, s)
    h = pinned(c, 2 * MiB)
    c("prefetch(pinned host mem)", d.cuMemPrefetchAsync, h, 2 * MiB, dev_loc(0), 0, s)
    c("sync#2", d.cuStreamSynchronize, s)
    c("prefetch(legacy stream 0)", d.cuMemPrefetchAsync, m, n, dev_loc(0), 0, 0)
    c(
        "prefetch(CU_STREAM_PER_THREAD)",
        d.cuMemPrefetchAsync,
        m,
        n,
        host_loc(),
        0,
        d.CU_STREAM_PER_THREAD,
    )
    c("prefetch(flags=1)", d.cuMemPrefetchAsync, m, n, dev_loc(0), 1, s)
    c("prefetch(CUdeviceptr arg)", d.cuMemPrefetchAsync, dp(m), n, dev_loc(0), 0, s)
    c("cuCtxSynchronize#after", d.cuCtxSynchronize)


@probe("C_prefetch_unusual_targets", isolated=True)
def c_prefetch_unusual(c: Case):
    s = new_stream(c)
    arr, addr = host_buf(2 * MiB)
    host_memset(addr, 1, 2 * MiB)
    c("prefetch(pageable numpy -> DEVICE0)", d.cuMemPrefetchAsync, addr, 2 * MiB, dev_loc(0), 0, s)
    c("sync#1", d.cuStreamSynchronize, s)
    c("prefetch(pageable numpy -> HOST)", d.cuMemPrefetchAsync, addr, 2 * MiB, host_loc(), 0, s)
    c("sync#2", d.cuStreamSynchronize, s)
    c.val("numpy_bytes_after", list(host_bytes(addr, 2)))
    c("prefetch(0x1234000 unknown)", d.cuMemPrefetchAsync, 0x1234000, 4096, dev_loc(0), 0, s)
    c("sync#3", d.cuStreamSynchronize, s)
    ctx_after(c)
    del arr


def rga(attr, ptr, n, size=4) -> Res:
    return call(d.cuMemRangeGetAttribute, size, attr, ptr, n)


def rga_all(ptr, n) -> dict:
    out = {}
    for a in RA:
        size = 4 * max(1, Ctx.count) if a == RA.CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY else 4
        r = rga(a, ptr, n, size)
        out[a.name.replace("CU_MEM_RANGE_ATTRIBUTE_", "")] = tv(r.v) if r.ok else r.name
    return out


@probe("C_range_attributes")
def c_range_attrs(c: Case):
    n = 4 * MiB
    half = 2 * MiB
    m = managed(c, n)
    s = new_stream(c)
    # dataSize requirements
    sizes = {}
    for a in RA:
        row = {}
        for size in (0, 1, 3, 4, 8, 12, 16):
            r = rga(a, m, n, size)
            row[size] = r.name if not r.ok else {"ok": tv(r.v)}
        sizes[a.name.replace("CU_MEM_RANGE_ATTRIBUTE_", "")] = row
    c.val("dataSize_probe", sizes)
    c.val("fresh_whole", rga_all(m, n))
    c(
        "advise SET_READ_MOSTLY first half",
        d.cuMemAdvise,
        m,
        half,
        ADV.CU_MEM_ADVISE_SET_READ_MOSTLY,
        dev_loc(0),
    )
    rm = RA.CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY
    c.val(
        "read_mostly",
        {
            k: jv(rga(rm, P(m) + o, ln).v)
            for k, o, ln in (("whole", 0, n), ("first", 0, half), ("second", half, half))
        },
    )
    c(
        "advise SET_PREFERRED_LOCATION DEVICE0 second half",
        d.cuMemAdvise,
        P(m) + half,
        half,
        ADV.CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
        dev_loc(0),
    )
    c.val(
        "after_preferred_dev0_second_half",
        {"whole": rga_all(m, n), "first": rga_all(m, half), "second": rga_all(P(m) + half, half)},
    )
    c(
        "advise SET_PREFERRED_LOCATION HOST first half",
        d.cuMemAdvise,
        m,
        half,
        ADV.CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
        host_loc(),
    )
    c.val("after_preferred_host_first_half", {"first": rga_all(m, half), "whole": rga_all(m, n)})
    c(
        "advise SET_PREFERRED_LOCATION HOST_NUMA0 first half",
        d.cuMemAdvise,
        m,
        half,
        ADV.CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
        numa_loc(0),
    )
    c.val("after_preferred_numa0_first_half", {"first": rga_all(m, half)})
    c(
        "advise SET_ACCESSED_BY DEVICE0 whole",
        d.cuMemAdvise,
        m,
        n,
        ADV.CU_MEM_ADVISE_SET_ACCESSED_BY,
        dev_loc(0),
    )
    ab = RA.CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY
    c.val("accessed_by", {f"size{sz}": tv(rga(ab, m, n, sz).v) for sz in (4, 8, 12)})
    c(
        "advise SET_ACCESSED_BY HOST whole",
        d.cuMemAdvise,
        m,
        n,
        ADV.CU_MEM_ADVISE_SET_ACCESSED_BY,
        host_loc(),
    )
    c.val("accessed_by_after_host", {f"size{sz}": tv(rga(ab, m, n, sz).v) for sz in (4, 12)})
    c("prefetch whole -> DEVICE0", d.cuMemPrefetchAsync, m, n, dev_loc(0), 0, s)
    c("sync", d.cuStreamSynchronize, s)
    c.val("after_prefetch_dev0", rga_all(m, n))
    c("prefetch first half -> HOST", d.cuMemPrefetchAsync, m, half, host_loc(), 0, s)
    c("sync#2", d.cuStreamSynchronize, s)
    c.val("after_prefetch_host_first_half", {"whole": rga_all(m, n), "first": rga_all(m, half)})
    c("prefetch first half -> HOST_NUMA0", d.cuMemPrefetchAsync, m, half, numa_loc(0), 0, s)
    c("sync#3", d.cuStreamSynchronize, s)
    c.val("after_prefetch_numa0_first_half", {"first": rga_all(m, half)})
    # cuMemRangeGetAttributes (plural)
    attrs = list(RA)
    dsz = [4 * max(1, Ctx.count) if a == ab else 4 for a in attrs]
    r = c("cuMemRangeGetAttributes(all)", d.cuMemRangeGetAttributes, dsz, attrs, len(attrs), m, n)
    c.val("range_get_attributes_all", {"type": type(r.v).__name__, "value": jv(r.v)})
    r = c(
        "cuMemRangeGetAttributes(2 attrs)",
        d.cuMemRangeGetAttributes,
        [4, 4],
        [rm, RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION],
        2,
        m,
        n,
    )
    c.val("range_get_attributes_2", jv(r.v))
    c("cuMemRangeGetAttributes(bad size)", d.cuMemRangeGetAttributes, [8], [rm], 1, m, n)
    # misuse
    p = dalloc(c, 2 * MiB)
    c("rga(cuMemAlloc mem)", d.cuMemRangeGetAttribute, 4, rm, p, 2 * MiB)
    c("rga(m+100, 1000) unaligned", d.cuMemRangeGetAttribute, 4, rm, P(m) + 100, 1000)
    c("rga(size 0)", d.cuMemRangeGetAttribute, 4, rm, m, 0)
    c("rga(past end)", d.cuMemRangeGetAttribute, 4, rm, m, 8 * MiB)
    arr, addr = host_buf(2 * MiB)
    r = c("rga(pageable numpy)", d.cuMemRangeGetAttribute, 4, rm, addr, 2 * MiB)
    c("cuCtxSynchronize#after", d.cuCtxSynchronize)
    del arr


def dptrs_of(base, n, chunk):
    return [d.CUdeviceptr(P(base) + i * chunk) for i in range(n)]


@probe("C_prefetch_batch")
def c_batch(c: Case):
    has = {
        k: hasattr(d, k)
        for k in (
            "cuMemPrefetchBatchAsync",
            "cuMemDiscardBatchAsync",
            "cuMemDiscardAndPrefetchBatchAsync",
        )
    }
    c.val("has", has)
    m = managed(c, 4 * MiB)
    s = new_stream(c)
    B = "cuMemPrefetchBatchAsync"
    ptrs = dptrs_of(m, 4, MiB)
    sizes = [MiB] * 4
    D0 = dev_loc(0)
    c("batch ok (4 ranges, [DEVICE0], [0], 1, 0, s)", B, ptrs, sizes, 4, [D0], [0], 1, 0, s)
    c("sync", d.cuStreamSynchronize, s)
    r = rga(RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m, 4 * MiB)
    c.val("last_prefetch_after_batch", jv(r.v) if r.ok else r.name)
    c("batch ints instead of CUdeviceptr", B, [P(x) for x in ptrs], sizes, 4, [D0], [0], 1, 0, s)
    c("batch locIdxs [1]", B, ptrs, sizes, 4, [D0], [1], 1, 0, s)
    c("batch legacy stream 0", B, ptrs, sizes, 4, [D0], [0], 1, 0, 0)
    c("batch CU_STREAM_PER_THREAD", B, ptrs, sizes, 4, [D0], [0], 1, 0, d.CU_STREAM_PER_THREAD)
    c("batch count 0 (empty lists)", B, [], [], 0, [D0], [0], 1, 0, s)
    c("batch count 0 (lists len 4)", B, ptrs, sizes, 0, [D0], [0], 1, 0, s)
    c("batch count 2 (lists len 4)", B, ptrs, sizes, 2, [D0], [0], 1, 0, s)
    c("batch count 5 (lists len 4)", B, ptrs, sizes, 5, [D0], [0], 1, 0, s)
    locs5 = [dev_loc(0), host_loc(), dev_loc(0), host_loc(), dev_loc(0)]
    c("batch numLocs 5 > count 4", B, ptrs, sizes, 4, locs5, [0, 1, 2, 3, 4], 5, 0, s)
    c("batch numLocs 4 == count", B, ptrs, sizes, 4, locs5[:4], [0, 1, 2, 3], 4, 0, s)
    c(
        "batch 2 locs [DEV0, HOST] idxs [0,2]",
        B,
        ptrs,
        sizes,
        4,
        [dev_loc(0), host_loc()],
        [0, 2],
        2,
        0,
        s,
    )
    c(
        "batch 2 locs idxs [0,0] (not increasing)",
        B,
        ptrs,
        sizes,
        4,
        [dev_loc(0), host_loc()],
        [0, 0],
        2,
        0,
        s,
    )
    c(
        "batch 2 locs idxs [0,4] (== count)",
        B,
        ptrs,
        sizes,
        4,
        [dev_loc(0), host_loc()],
        [0, 4],
        2,
        0,
        s,
    )
    c("batch numLocs 0", B, ptrs, sizes, 4, [], [], 0, 0, s)
    c("batch sizes containing 0", B, ptrs, [MiB, 0, MiB, MiB], 4, [D0], [0], 1, 0, s)
    c(
        "batch unaligned pointer (+100)",
        B,
        [d.CUdeviceptr(P(m) + 100), *ptrs[1:]],
        sizes,
        4,
        [D0],
        [0],
        1,
        0,
        s,
    )
    c("batch unaligned size (1000)", B, ptrs, [1000, MiB, MiB, MiB], 4, [D0], [0], 1, 0, s)
    c("batch overlapping ranges", B, [ptrs[0], ptrs[0]], [MiB, MiB], 2, [D0], [0], 1, 0, s)
    c("batch flags=1", B, ptrs, sizes, 4, [D0], [0], 1, 1, s)
    c("batch loc DEVICE7", B, ptrs, sizes, 4, [dev_loc(7)], [0], 1, 0, s)
    c("batch loc HOST", B, ptrs, sizes, 4, [host_loc()], [0], 1, 0, s)
    c("batch loc HOST_NUMA0", B, ptrs, sizes, 4, [numa_loc(0)], [0], 1, 0, s)
    c("batch loc INVALID", B, ptrs, sizes, 4, [inv_loc()], [0], 1, 0, s)
    p = dalloc(c, 2 * MiB)
    c("batch non-managed (cuMemAlloc)", B, [dp(p)], [2 * MiB], 1, [D0], [0], 1, 0, s)
    c("batch past end (8MiB)", B, [dp(m)], [8 * MiB], 1, [D0], [0], 1, 0, s)
    c("batch sizes len 3 with count 4", B, ptrs, sizes[:3], 4, [D0], [0], 1, 0, s)
    c("sync#2", d.cuStreamSynchronize, s)
    DB = "cuMemDiscardBatchAsync"
    c("discard ok", DB, ptrs, sizes, 4, 0, s)
    c("discard non-managed", DB, [dp(p)], [2 * MiB], 1, 0, s)
    c("discard unaligned (+100)", DB, [d.CUdeviceptr(P(m) + 100)], [1000], 1, 0, s)
    c("discard size 0 entry", DB, ptrs[:2], [MiB, 0], 2, 0, s)
    c("discard legacy stream 0", DB, ptrs, sizes, 4, 0, 0)
    c("discard flags=1", DB, ptrs, sizes, 4, 1, s)
    c("discard count 0", DB, [], [], 0, 0, s)
    DP = "cuMemDiscardAndPrefetchBatchAsync"
    c("discard+prefetch ok", DP, ptrs, sizes, 4, [D0], [0], 1, 0, s)
    c("discard+prefetch non-managed", DP, [dp(p)], [2 * MiB], 1, [D0], [0], 1, 0, s)
    c("discard+prefetch unaligned", DP, [d.CUdeviceptr(P(m) + 100)], [1000], 1, [D0], [0], 1, 0, s)
    c("discard+prefetch locIdxs [1]", DP, ptrs, sizes, 4, [D0], [1], 1, 0, s)
    c("discard+prefetch legacy stream 0", DP, ptrs, sizes, 4, [D0], [0], 1, 0, 0)
    c("sync#3", d.cuStreamSynchronize, s)
    # data after discard: contents are undefined; record for the simulator
    host_memset(P(m), 0x77, 4096)
    ok(d.cuMemPrefetchAsync, m, 4 * MiB, dev_loc(0), 0, s)
    call(d.cuStreamSynchronize, s)
    c("discard first 2MiB", DB, [dp(m)], [2 * MiB], 1, 0, s)
    c("sync#4", d.cuStreamSynchronize, s)
    c.val("bytes_after_discard", list(host_bytes(P(m), 4)))
    c("cuCtxSynchronize#after", d.cuCtxSynchronize)


@probe("C_stream_attach")
def c_attach(c: Case):
    n = 4 * MiB
    m = managed(c, n)
    s = new_stream(c)
    A = d.cuStreamAttachMemAsync
    for f in (1, 2, 4, 0, 3, 8):
        for label, ln in (("len0", 0), ("full", n), ("partial1MiB", MiB)):
            c(f"attach(flags {f}, {label})", A, s, m, ln, f)
    c("sync", d.cuStreamSynchronize, s)
    c("attach(interior ptr m+1MiB, 0, GLOBAL)", A, s, P(m) + MiB, 0, 1)
    c("attach(SINGLE on legacy stream 0)", A, 0, m, 0, 4)
    c("attach(GLOBAL on legacy stream 0)", A, 0, m, 0, 1)
    c("attach(HOST on legacy stream 0)", A, 0, m, 0, 2)
    p = dalloc(c, 2 * MiB)
    c("attach(cuMemAlloc mem, 0, GLOBAL)", A, s, p, 0, 1)
    c("attach(cuMemAlloc mem, full, SINGLE)", A, s, p, 2 * MiB, 4)
    h = pinned(c, 2 * MiB)
    c("attach(pinned host, full, GLOBAL)", A, s, h, 2 * MiB, 1)
    arr, addr = host_buf(2 * MiB)
    c("attach(pageable numpy, full, GLOBAL)", A, s, addr, 2 * MiB, 1)
    c("attach(pageable numpy, len0, GLOBAL)", A, s, addr, 0, 1)
    c("attach(0x1234000)", A, s, 0x1234000, 0, 1)
    c("sync#2", d.cuStreamSynchronize, s)
    c("cuCtxSynchronize#after", d.cuCtxSynchronize)
    del arr


@probe("C_timing_prefetch")
def c_timing(c: Case):
    n = 256 * MiB
    chunk = 128 * KiB
    k = n // chunk  # 2048
    m = managed(c, n)
    s = new_stream(c)
    D0 = dev_loc(0)
    ptrs = dptrs_of(m, k, chunk)
    sizes = [chunk] * k
    res = {"whole": [], "loop_2048x128KiB": [], "batch_2048x128KiB": [], "host_touch": []}
    have_batch = hasattr(d, "cuMemPrefetchBatchAsync")
    for rep in range(3):
        for method in ("whole", "loop_2048x128KiB", "batch_2048x128KiB"):
            if method.startswith("batch") and not have_batch:
                continue
            t0 = time.perf_counter()
            host_memset(P(m), rep + 1, n)  # pages back to the host
            t1 = time.perf_counter()
            res["host_touch"].append(t1 - t0)
            if method == "whole":
                r = qcall(d.cuMemPrefetchAsync, m, n, D0, 0, s)
            elif method.startswith("loop"):
                for q in ptrs:
                    r = qcall(d.cuMemPrefetchAsync, q, chunk, D0, 0, s)
                    if not r.ok:
                        break
            else:
                r = qcall(d.cuMemPrefetchBatchAsync, ptrs, sizes, k, [D0], [0], 1, 0, s)
            rs = qcall(d.cuStreamSynchronize, s)
            t2 = time.perf_counter()
            c.record(f"{method} rep{rep}", r.name if not r.ok else rs.name)
            res[method].append(t2 - t1)
    for key, v in res.items():
        if v:
            c.val(f"{key}_median_ms", median_ms(v))
    r = rga(RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m, n)
    c.val("last_prefetch_location", jv(r.v) if r.ok else r.name)
    # call overhead of the loop alone (pages already resident on the device)
    t0 = time.perf_counter()
    for q in ptrs:
        qcall(d.cuMemPrefetchAsync, q, chunk, D0, 0, s)
    qcall(d.cuStreamSynchronize, s)
    c.val("loop_resident_ms", round((time.perf_counter() - t0) * 1e3, 3))
    if have_batch:
        t0 = time.perf_counter()
        qcall(d.cuMemPrefetchBatchAsync, ptrs, sizes, k, [D0], [0], 1, 0, s)
        qcall(d.cuStreamSynchronize, s)
        c.val("batch_resident_ms", round((time.perf_counter() - t0) * 1e3, 3))
    c.note(
        "256 MiB managed; host memset between reps; times include stream sync; "
        "host_touch = time of the host memset that migrates pages back"
    )


# ---------------------------------------------------------------------------
# residency: sub-range attributes, free memory, eviction (the simulator's
# model of a GPU that fills up is checked against these)
# ---------------------------------------------------------------------------

LP = RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION
PL = RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION
RMA = RA.CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY
AB = RA.CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY


def free_now() -> int:
    r = call(d.cuMemGetInfo)
    return int(r.outs[0]) if r.ok else -1


def attr_grid(m, parts) -> dict:
    """Last prefetch / preferred location / read-mostly / accessed-by of each (name, off, n)."""
    out = {}
    for name, off, n in parts:
        row = {}
        for key, a in (("last", LP), ("pref", PL), ("read_mostly", RMA)):
            r = rga(a, P(m) + off, n)
            row[key] = jv(r.v) if r.ok else r.name
        r = rga(AB, P(m) + off, n, 8)
        row["accessed_by"] = jv(r.v) if r.ok else r.name
        out[name] = row
    return out


def sync_free(s) -> int:
    call(d.cuStreamSynchronize, s)
    return free_now()


@probe("C_residency_subrange_attributes")
def c_residency_subrange(c: Case):
    """Range attributes over sub-ranges after partial prefetches, advice and discard."""
    n = 8 * MiB
    m = managed(c, n)
    s = new_stream(c)
    host_memset(P(m), 1, n)
    parts = [
        ("whole", 0, n),
        ("0-2M", 0, 2 * MiB),
        ("2M-4M", 2 * MiB, 2 * MiB),
        ("2M+4K", 2 * MiB, 4 * KiB),
        ("1M-3M", MiB, 2 * MiB),
        ("3M-4M", 3 * MiB, MiB),
        ("4M-8M", 4 * MiB, 4 * MiB),
        ("5M+4K", 5 * MiB, 4 * KiB),
        ("5M+4K..+8K", 5 * MiB + 4 * KiB, 4 * KiB),
        ("5M+64K..+68K", 5 * MiB + 64 * KiB, 4 * KiB),
    ]
    c("prefetch 2M-4M -> DEVICE0", d.cuMemPrefetchAsync, P(m) + 2 * MiB, 2 * MiB, dev_loc(0), 0, s)
    call(d.cuStreamSynchronize, s)
    c.val("after_prefetch_2M_4M_dev0", attr_grid(m, parts))
    c("prefetch 3M-5M -> HOST", d.cuMemPrefetchAsync, P(m) + 3 * MiB, 2 * MiB, host_loc(), 0, s)
    call(d.cuStreamSynchronize, s)
    c.val("after_prefetch_3M_5M_host", attr_grid(m, parts))
    c("prefetch 5M+4K -> DEVICE0", d.cuMemPrefetchAsync, P(m) + 5 * MiB, 4 * KiB, dev_loc(0), 0, s)
    call(d.cuStreamSynchronize, s)
    c.val("after_prefetch_5M_4K_dev0", attr_grid(m, parts))
    c("advise READ_MOSTLY 1M-3M", d.cuMemAdvise, P(m) + MiB, 2 * MiB,
      ADV.CU_MEM_ADVISE_SET_READ_MOSTLY, dev_loc(0))
    c("advise PREFERRED HOST 0-2M", d.cuMemAdvise, m, 2 * MiB,
      ADV.CU_MEM_ADVISE_SET_PREFERRED_LOCATION, host_loc())
    c("advise ACCESSED_BY DEVICE0 0-4M", d.cuMemAdvise, m, 4 * MiB,
      ADV.CU_MEM_ADVISE_SET_ACCESSED_BY, dev_loc(0))
    c.val("after_advice", attr_grid(m, parts))
    c("prefetch whole -> DEVICE0", d.cuMemPrefetchAsync, m, n, dev_loc(0), 0, s)
    call(d.cuStreamSynchronize, s)
    c.val("after_prefetch_whole_dev0", attr_grid(m, parts))
    if hasattr(d, "cuMemDiscardBatchAsync"):
        c("discard 2M-3M", d.cuMemDiscardBatchAsync, [d.CUdeviceptr(P(m) + 2 * MiB)], [MiB], 1, 0,
          s)
        call(d.cuStreamSynchronize, s)
        c.val("after_discard_2M_3M", attr_grid(m, parts))
        c("discard+prefetch 6M-8M -> HOST", d.cuMemDiscardAndPrefetchBatchAsync,
          [d.CUdeviceptr(P(m) + 6 * MiB)], [2 * MiB], 1, [host_loc()], [0], 1, 0, s)
        call(d.cuStreamSynchronize, s)
        c.val("after_discard_prefetch_6M_8M_host",
              attr_grid(m, [*parts, ("6M-8M", 6 * MiB, 2 * MiB)]))
    # a host write after prefetching: does the last prefetch location change?
    host_memset(P(m) + 4 * MiB, 2, 4 * KiB)
    c.val("after_host_write_4M_4K", attr_grid(m, [("4M-8M", 4 * MiB, 4 * MiB),
                                                   ("4M+4K", 4 * MiB, 4 * KiB)]))
    # a device write (memset) after prefetching to the host
    c("prefetch whole -> HOST", d.cuMemPrefetchAsync, m, n, host_loc(), 0, s)
    call(d.cuStreamSynchronize, s)
    c("cuMemsetD8(0-1M) on device", d.cuMemsetD8, m, 3, MiB)
    call(d.cuCtxSynchronize)
    c.val("after_device_memset_0_1M", attr_grid(m, [("0-1M", 0, MiB), ("whole", 0, n)]))
    c("cuCtxSynchronize#after", d.cuCtxSynchronize)


@probe("C_residency_meminfo")
def c_residency_meminfo(c: Case):
    """What cuMemGetInfo's free memory says as managed pages move (bytes, deltas vs before)."""
    n = 256 * MiB
    s = new_stream(c)
    dbuf = dalloc(c, 64 * MiB)
    out = {}
    f0 = free_now()
    m = managed(c, n)
    out["after_alloc_untouched"] = f0 - free_now()
    host_memset(P(m), 1, n)
    out["after_host_touch"] = f0 - free_now()
    c("prefetch whole -> DEVICE0", d.cuMemPrefetchAsync, m, n, dev_loc(0), 0, s)
    out["after_prefetch_dev0"] = f0 - sync_free(s)
    c("prefetch whole -> HOST", d.cuMemPrefetchAsync, m, n, host_loc(), 0, s)
    out["after_prefetch_back_host"] = f0 - sync_free(s)
    c("prefetch whole -> DEVICE0 #2", d.cuMemPrefetchAsync, m, n, dev_loc(0), 0, s)
    out["after_prefetch_dev0_again"] = f0 - sync_free(s)
    host_memset(P(m), 2, 4 * KiB)
    out["after_host_write_4K"] = f0 - free_now()
    host_bytes(P(m) + 64 * MiB, 16)
    out["after_host_read_16B"] = f0 - free_now()
    host_memset(P(m), 2, n)
    out["after_host_write_whole"] = f0 - free_now()
    # granularity of device residency
    for label, sz in (("4K", 4 * KiB), ("64K", 64 * KiB), ("2M+4K", 2 * MiB + 4 * KiB)):
        before = free_now()
        off = 128 * MiB
        c(f"prefetch {label} -> DEVICE0", d.cuMemPrefetchAsync, P(m) + off, sz, dev_loc(0), 0, s)
        out[f"prefetch_{label}_delta"] = before - sync_free(s)
        host_memset(P(m) + off, 3, sz)
        out[f"prefetch_{label}_host_write_back_delta"] = before - free_now()
    host_memset(P(m), 2, n)
    # read-mostly duplicates
    c("advise READ_MOSTLY whole", d.cuMemAdvise, m, n, ADV.CU_MEM_ADVISE_SET_READ_MOSTLY,
      dev_loc(0))
    c("prefetch read-mostly -> DEVICE0", d.cuMemPrefetchAsync, m, n, dev_loc(0), 0, s)
    out["read_mostly_after_prefetch_dev0"] = f0 - sync_free(s)
    host_bytes(P(m) + 64 * MiB, 16)
    out["read_mostly_after_host_read"] = f0 - free_now()
    host_memset(P(m), 4, 4 * KiB)
    out["read_mostly_after_host_write_4K"] = f0 - free_now()
    c.val("read_mostly_attrs_after_host_write", attr_grid(m, [("0+4K", 0, 4 * KiB),
                                                               ("whole", 0, n)]))
    c("prefetch read-mostly -> HOST", d.cuMemPrefetchAsync, m, n, host_loc(), 0, s)
    out["read_mostly_after_prefetch_host"] = f0 - sync_free(s)
    c("advise UNSET_READ_MOSTLY whole", d.cuMemAdvise, m, n, ADV.CU_MEM_ADVISE_UNSET_READ_MOSTLY,
      dev_loc(0))
    host_memset(P(m), 2, n)
    out["after_unset_read_mostly_host_write"] = f0 - free_now()
    # discard of device-resident pages
    if hasattr(d, "cuMemDiscardBatchAsync"):
        c("prefetch -> DEVICE0 before discard", d.cuMemPrefetchAsync, m, n, dev_loc(0), 0, s)
        out["before_discard"] = f0 - sync_free(s)
        c("discard whole", d.cuMemDiscardBatchAsync, [dp(m)], [n], 1, 0, s)
        out["after_discard"] = f0 - sync_free(s)
        c.val("attrs_after_discard", attr_grid(m, [("whole", 0, n)]))
        host_memset(P(m), 2, n)
        out["after_discard_host_write"] = f0 - free_now()
    # device accesses: a device memset and a copy engine read of host-resident pages
    c("cuMemsetD8(64 MiB) on device", d.cuMemsetD8, m, 5, 64 * MiB)
    call(d.cuCtxSynchronize)
    out["after_device_memset_64M"] = f0 - free_now()
    c.val("attrs_after_device_memset", attr_grid(m, [("0-64M", 0, 64 * MiB)]))
    host_memset(P(m), 2, n)
    out["after_device_memset_host_write"] = f0 - free_now()
    c("cuMemcpy managed(64M) -> device", d.cuMemcpy, dbuf, m, 64 * MiB)
    call(d.cuCtxSynchronize)
    out["after_copy_managed_to_device_64M"] = f0 - free_now()
    host_memset(P(m), 2, n)
    c("cuMemcpy device -> managed(64M)", d.cuMemcpy, m, dbuf, 64 * MiB)
    call(d.cuCtxSynchronize)
    out["after_copy_device_to_managed_64M"] = f0 - free_now()
    host_memset(P(m), 2, n)
    # preferred location host alone, then with accessed-by the device: a device memset
    c("advise PREFERRED HOST whole", d.cuMemAdvise, m, n,
      ADV.CU_MEM_ADVISE_SET_PREFERRED_LOCATION, host_loc())
    c("cuMemsetD8(64 MiB) preferred host", d.cuMemsetD8, m, 6, 64 * MiB)
    call(d.cuCtxSynchronize)
    out["preferred_host_after_device_memset_64M"] = f0 - free_now()
    host_memset(P(m), 2, n)
    out["preferred_host_after_host_write"] = f0 - free_now()
    c("advise ACCESSED_BY DEVICE0 whole", d.cuMemAdvise, m, n, ADV.CU_MEM_ADVISE_SET_ACCESSED_BY,
      dev_loc(0))
    c("cuMemsetD8(64 MiB) zero-copy", d.cuMemsetD8, m, 6, 64 * MiB)
    call(d.cuCtxSynchronize)
    out["zero_copy_after_device_memset_64M"] = f0 - free_now()
    c.val("zero_copy_attrs_after_device_memset", attr_grid(m, [("0-64M", 0, 64 * MiB)]))
    c("prefetch zero-copy -> DEVICE0", d.cuMemPrefetchAsync, m, 64 * MiB, dev_loc(0), 0, s)
    out["zero_copy_after_prefetch_dev0_64M"] = f0 - sync_free(s)
    c.val("zero_copy_attrs_after_prefetch", attr_grid(m, [("0-64M", 0, 64 * MiB)]))
    c("prefetch zero-copy -> HOST", d.cuMemPrefetchAsync, m, n, host_loc(), 0, s)
    out["zero_copy_after_prefetch_host"] = f0 - sync_free(s)
    c.val("used_delta_bytes", out)
    c.val("free_before", f0)
    c.note("values are f0 - free: bytes of device memory taken since just before the managed "
           "allocation (a 64 MiB cuMemAlloc made before f0 is the copy partner)")
    c("cuCtxSynchronize#after", d.cuCtxSynchronize)


def within_free(want: int, free_before: int) -> int:
    """``want`` rounded to 2 MiB, kept 64 MiB under what was free before the managed prefetch."""
    cap = free_before - 64 * MiB
    return max(2 * MiB, (min(want, cap) // (2 * MiB)) * 2 * MiB)


@probe("C_residency_evict", isolated=True)
def c_residency_evict(c: Case):
    """Device allocations larger than what is free, while prefetched managed pages hold memory."""
    n = 256 * MiB
    s = new_stream(c)
    out = {}
    m = managed(c, n)
    host_memset(P(m), 0x5A, n)
    f_base = free_now()
    half = n // 2
    # first half A, then half B: which one does a device allocation evict first?
    c("prefetch A (first half) -> DEVICE0", d.cuMemPrefetchAsync, m, half, dev_loc(0), 0, s)
    call(d.cuStreamSynchronize, s)
    c("prefetch B (second half) -> DEVICE0", d.cuMemPrefetchAsync, P(m) + half, half, dev_loc(0),
      0, s)
    f1 = sync_free(s)
    out["free_base"] = f_base
    out["managed_taken"] = f_base - f1
    # Within what was free before the prefetch, larger than what is free now.
    big = within_free(f1 + 128 * MiB, f_base)
    out["big_alloc_bytes_minus_free"] = big - f1
    r = c("cuMemAlloc(free + 128 MiB)", d.cuMemAlloc, big)
    if r.ok:
        out["free_after_big_alloc"] = free_now()
        c.val("attrs_while_evicted", attr_grid(m, [("whole", 0, n)]))
        # pages still on the device come back to the host and free their memory
        c("prefetch A -> HOST while full", d.cuMemPrefetchAsync, m, half, host_loc(), 0, s)
        out["freed_by_A_to_host"] = sync_free(s) - out["free_after_big_alloc"]
        fa = free_now()
        c("prefetch B -> HOST while full", d.cuMemPrefetchAsync, P(m) + half, half, host_loc(),
          0, s)
        out["freed_by_B_to_host"] = sync_free(s) - fa
        c("prefetch -> DEVICE0 while full", d.cuMemPrefetchAsync, m, n, dev_loc(0), 0, s)
        out["free_after_prefetch_while_full"] = sync_free(s)
        c.val("attrs_after_prefetch_while_full", attr_grid(m, [("whole", 0, n)]))
        c("cuMemFree(big)", d.cuMemFree, r.v)
    out["free_after_big_free"] = free_now()
    c.val("host_bytes_after_eviction",
          list(host_bytes(P(m), 2)) + list(host_bytes(P(m) + n - 2, 2)))
    # the same through the default pool (stream-ordered)
    c("prefetch -> DEVICE0 #2", d.cuMemPrefetchAsync, m, n, dev_loc(0), 0, s)
    f2 = sync_free(s)
    big2 = within_free(f2 + 128 * MiB, f_base)
    r2 = c("cuMemAllocAsync(free + 128 MiB)", d.cuMemAllocAsync, big2, s)
    c("sync after pool alloc", d.cuStreamSynchronize, s)
    if r2.ok:
        out["free_after_pool_alloc"] = free_now()
        c("cuMemFreeAsync(big2)", d.cuMemFreeAsync, r2.v, s)
        call(d.cuStreamSynchronize, s)
        pr = call(d.cuDeviceGetDefaultMemPool, 0)
        if pr.ok:
            call(d.cuMemPoolTrimTo, pr.v, 0)
    out["free_after_pool_free"] = free_now()
    # More than free + every resident managed byte: refused, nothing evicted for it.
    c("prefetch -> DEVICE0 #3", d.cuMemPrefetchAsync, m, n, dev_loc(0), 0, s)
    f3 = sync_free(s)
    r3 = c("cuMemAlloc(free + managed + 1 GiB)", d.cuMemAlloc, f3 + n + 1024 * MiB)
    if r3.ok:
        call(d.cuMemFree, r3.v)
    out["free_after_refused_alloc"] = free_now()
    c.val("attrs_after_refused_alloc", attr_grid(m, [("whole", 0, n)]))
    c.val("bytes", out)
    ctx_after(c)
