"""F. Two devices: peer access, cross-device copies of every memory kind, kernels
reading peer memory, the VMM memory NCCL can register, peer bandwidth.

Every case needs two devices (with one it records the device count and a note, and
stops).  The cases that change peer access (process state) or may fault a kernel run
isolated, so that each starts with no peer access enabled.
"""

from __future__ import annotations

import ctypes
import os
import time

import numpy as np

from ._framework import RUN, Case, Ctx, GiB, KiB, MiB, call, d, jv, ok, probe
from ._helpers import POSIX_FD, P, access_desc, dev_loc, pinned, vmm_prop
from .pool import new_pool, pool_props
from .vmm import reserve, vcreate, vmap

F = d.CUmemAccess_flags
GF = d.CUmemAllocationGranularity_flags
NONE, READ = F.CU_MEM_ACCESS_FLAGS_PROT_NONE, F.CU_MEM_ACCESS_FLAGS_PROT_READ
STREAM_ORDER = d.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM

# A word copy, dst[i] = src[i] for i < n (32-bit words), one thread per word: enough to
# see whether a kernel of device 0 may read or write an address of device 1.
PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry probe_copy(.param .u64 dst, .param .u64 src, .param .u64 n)
{
    .reg .pred %p;
    .reg .b32 %r<5>;
    .reg .b64 %rd<9>;
    ld.param.u64 %rd1, [dst];
    ld.param.u64 %rd2, [src];
    ld.param.u64 %rd3, [n];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.u64 %rd4, %rd4, %rd5;
    setp.ge.u64 %p, %rd4, %rd3;
    @%p bra DONE;
    shl.b64 %rd6, %rd4, 2;
    add.u64 %rd7, %rd2, %rd6;
    add.u64 %rd8, %rd1, %rd6;
    ld.global.u32 %r4, [%rd7];
    st.global.u32 [%rd8], %r4;
DONE:
    ret;
}
\0"""


# ---------------------------------------------------------------------------
# two contexts
# ---------------------------------------------------------------------------


def two(c: Case) -> bool:
    """True when there are two devices; otherwise notes why the case stops."""
    c.val("device_count", Ctx.count)
    if Ctx.count >= 2:
        return True
    c.note("needs two devices")
    return False


def on(ctx) -> None:
    """Make ``ctx`` current (``None``: no context)."""
    call(d.cuCtxSetCurrent, ctx if ctx is not None else d.CUcontext(0))


def in_ctx(ctx, fn, *args):
    """``fn(*args)`` with ``ctx`` current, then device 0's context again; the Res."""
    on(ctx)
    try:
        return call(fn, *args)
    finally:
        on(Ctx.ctx)


def peer_ctx(c: Case):
    """Device 1's primary context, retained until the case ends."""
    dev1 = ok(d.cuDeviceGet, 1).v
    ctx1 = ok(d.cuDevicePrimaryCtxRetain, dev1).v
    c.defer(d.cuDevicePrimaryCtxRelease, dev1)
    return ctx1


def alloc_in(c: Case, ctx, n: int) -> int:
    """``cuMemAlloc`` of ``n`` bytes in ``ctx``, freed there when the case ends."""
    on(ctx)
    try:
        ptr = int(ok(d.cuMemAlloc, n).v)
    finally:
        on(Ctx.ctx)
    c.defer(in_ctx, ctx, d.cuMemFree, ptr)
    return ptr


def stream_in(c: Case, ctx):
    on(ctx)
    try:
        s = ok(d.cuStreamCreate, 1).v
    finally:
        on(Ctx.ctx)
    c.defer(in_ctx, ctx, d.cuStreamDestroy, s)
    return s


def pattern(n: int, seed: int = 0) -> np.ndarray:
    return ((np.arange(n, dtype=np.uint32) * 7 + seed) % 251).astype(np.uint8)


def write(ctx, ptr: int, data: np.ndarray) -> None:
    """Host bytes into ``ptr`` with ``ctx`` (the memory's own device) current."""
    in_ctx(ctx, d.cuMemcpy, ptr, data.ctypes.data, data.nbytes)


def matches(ctx, ptr: int, want: np.ndarray) -> bool:
    """Whether ``ptr`` holds ``want``, read back with ``ctx`` current."""
    got = np.zeros_like(want)
    r = in_ctx(ctx, d.cuMemcpy, got.ctypes.data, ptr, want.nbytes)
    return bool(r.ok and np.array_equal(got, want))


def clear(ctx, ptr: int, n: int) -> None:
    on(ctx)
    call(d.cuMemsetD8, ptr, 0, n)
    call(d.cuCtxSynchronize)
    on(Ctx.ctx)


def batch_args(dst: int, src: int, n: int, stream):
    a = d.CUmemcpyAttributes()
    a.srcAccessOrder = STREAM_ORDER
    return ([d.CUdeviceptr(dst)], [d.CUdeviceptr(src)], [n], 1, [a], [0], 1, stream)


def copies(c: Case, tag: str, cur, stream, dst, src, n, want) -> None:
    """Every copy call from context ``cur`` of ``src`` into ``dst``: its steps and whether
    the data arrived (``dst`` = (its context, address), ``src`` = (context, address))."""
    (dctx, dptr), (sctx, sptr) = dst, src
    calls = (
        ("cuMemcpy", d.cuMemcpy, (dptr, sptr, n), False),
        ("cuMemcpyDtoD", d.cuMemcpyDtoD, (dptr, sptr, n), False),
        ("cuMemcpyAsync", d.cuMemcpyAsync, (dptr, sptr, n, stream), True),
        ("cuMemcpyPeer", d.cuMemcpyPeer, (dptr, dctx, sptr, sctx, n), False),
        ("cuMemcpyPeerAsync", d.cuMemcpyPeerAsync, (dptr, dctx, sptr, sctx, n, stream), True),
        ("cuMemcpyBatchAsync", d.cuMemcpyBatchAsync, batch_args(dptr, sptr, n, stream), True),
    )
    for label, fn, args, is_async in calls:
        clear(dctx, dptr, n)
        on(cur)
        r = c(f"{tag}: {label}", fn, *args)
        if is_async and r.ok:
            c(f"{tag}: {label} sync", d.cuStreamSynchronize, stream)
        on(Ctx.ctx)
        c.val(f"{tag}: {label} data", matches(dctx, dptr, want) if r.ok else None)


def enable(c: Case, label: str, frm, to) -> None:
    on(frm)
    c(label, d.cuCtxEnablePeerAccess, to, 0)
    on(Ctx.ctx)


def disable(c: Case, label: str, frm, to) -> None:
    on(frm)
    c(label, d.cuCtxDisablePeerAccess, to)
    on(Ctx.ctx)


# ---------------------------------------------------------------------------
# peer access as the driver answers it
# ---------------------------------------------------------------------------


@probe("F_peer_query")
def f_query(c: Case):
    if not two(c):
        return
    for a, b in ((0, 1), (1, 0), (1, 1)):
        r = c(f"cuDeviceCanAccessPeer({a},{b})", d.cuDeviceCanAccessPeer, a, b)
        c.val(f"can_access_peer_{a}_{b}", r.v)
    c("cuDeviceCanAccessPeer(0,count)", d.cuDeviceCanAccessPeer, 0, Ctx.count)
    c("cuDeviceCanAccessPeer(count,0)", d.cuDeviceCanAccessPeer, Ctx.count, 0)
    for attr in d.CUdevice_P2PAttribute:
        short = attr.name.replace("CU_DEVICE_P2P_ATTRIBUTE_", "")
        for a, b in ((0, 1), (1, 0), (0, 0)):
            r = c(f"cuDeviceGetP2PAttribute({short},{a},{b})", d.cuDeviceGetP2PAttribute,
                  attr, a, b)
            c.val(f"p2p_{short}_{a}_{b}", r.v)
    c("cuDeviceGetP2PAttribute(PERF,0,count)", d.cuDeviceGetP2PAttribute,
      d.CUdevice_P2PAttribute.CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK, 0, Ctx.count)


@probe("F_peer_enable", isolated=True)
def f_enable(c: Case):
    if not two(c):
        return
    ctx0, ctx1 = Ctx.ctx, peer_ctx(c)
    c("enable 0->1", d.cuCtxEnablePeerAccess, ctx1, 0)
    c("enable 0->1 again", d.cuCtxEnablePeerAccess, ctx1, 0)
    c("enable 0->1 flags=1", d.cuCtxEnablePeerAccess, ctx1, 1)
    c("enable self", d.cuCtxEnablePeerAccess, ctx0, 0)
    c("disable self", d.cuCtxDisablePeerAccess, ctx0)
    c("enable NULL context", d.cuCtxEnablePeerAccess, d.CUcontext(0), 0)
    c("disable NULL context", d.cuCtxDisablePeerAccess, d.CUcontext(0))
    c("disable 0->1", d.cuCtxDisablePeerAccess, ctx1)
    c("disable 0->1 again", d.cuCtxDisablePeerAccess, ctx1)
    on(None)
    c("enable 1 with no current context", d.cuCtxEnablePeerAccess, ctx1, 0)
    c("disable 1 with no current context", d.cuCtxDisablePeerAccess, ctx1)
    on(ctx0)
    # one direction at a time: enabling 1->0 enables nothing from 0
    enable(c, "enable 1->0", ctx1, ctx0)
    c("disable 0->1 while only 1->0 is enabled", d.cuCtxDisablePeerAccess, ctx1)
    enable(c, "enable 1->0 again", ctx1, ctx0)
    disable(c, "disable 1->0", ctx1, ctx0)
    # pushed rather than set
    c("cuCtxPushCurrent(ctx1)", d.cuCtxPushCurrent, ctx1)
    c("enable 1->0 while pushed", d.cuCtxEnablePeerAccess, ctx0, 0)
    c("disable 1->0 while pushed", d.cuCtxDisablePeerAccess, ctx0)
    c("cuCtxPopCurrent", d.cuCtxPopCurrent)


@probe("F_peer_primary_reset", isolated=True)
def f_primary_reset(c: Case):
    """Peer access to a primary context that is released to zero, or reset, and retained again."""
    if not two(c):
        return
    dev1 = ok(d.cuDeviceGet, 1).v
    ctx1 = ok(d.cuDevicePrimaryCtxRetain, dev1).v
    c("enable 0->1", d.cuCtxEnablePeerAccess, ctx1, 0)
    c("cuDevicePrimaryCtxRelease(1) to zero", d.cuDevicePrimaryCtxRelease, dev1)
    r = c("cuDevicePrimaryCtxGetState(1) after release", d.cuDevicePrimaryCtxGetState, dev1)
    c.val("active_after_release", r.outs[1])
    r = c("cuDevicePrimaryCtxRetain(1) again", d.cuDevicePrimaryCtxRetain, dev1)
    ctx1b = r.v
    c.val("same_handle_after_release", int(ctx1b or 0) == int(ctx1 or 0))
    c("enable 0->1 after re-creation", d.cuCtxEnablePeerAccess, ctx1b, 0)
    c("enable 0->1 after re-creation again", d.cuCtxEnablePeerAccess, ctx1b, 0)
    c("cuDevicePrimaryCtxReset(1)", d.cuDevicePrimaryCtxReset, dev1)
    r = c("cuDevicePrimaryCtxRetain(1) after reset", d.cuDevicePrimaryCtxRetain, dev1)
    ctx1c = r.v
    c.val("same_handle_after_reset", int(ctx1c or 0) == int(ctx1 or 0))
    c("enable 0->1 after reset", d.cuCtxEnablePeerAccess, ctx1c, 0)
    c("disable 0->1", d.cuCtxDisablePeerAccess, ctx1c)
    c("cuDevicePrimaryCtxRelease(1)", d.cuDevicePrimaryCtxRelease, dev1)
    c("cuDevicePrimaryCtxRelease(1) again", d.cuDevicePrimaryCtxRelease, dev1)


# ---------------------------------------------------------------------------
# copies across devices, by memory kind
# ---------------------------------------------------------------------------


@probe("F_copy_device_memory", isolated=True)
def f_copy_device(c: Case):
    """cuMemAlloc memory of device 0 into device 1's: without peer access, one way, both."""
    if not two(c):
        return
    n = MiB
    ctx0, ctx1 = Ctx.ctx, peer_ctx(c)
    a0, a1 = alloc_in(c, ctx0, n), alloc_in(c, ctx1, n)
    s0, s1 = stream_in(c, ctx0), stream_in(c, ctx1)
    want = pattern(n)
    write(ctx0, a0, want)
    for phase in ("no peer", "0->1", "both"):
        if phase == "0->1":
            enable(c, "enable 0->1", ctx0, ctx1)
        if phase == "both":
            enable(c, "enable 1->0", ctx1, ctx0)
        copies(c, f"{phase}, from 0", ctx0, s0, (ctx1, a1), (ctx0, a0), n, want)
        copies(c, f"{phase}, from 1", ctx1, s1, (ctx1, a1), (ctx0, a0), n, want)
        c(f"{phase}: cuMemsetD8 of device 1 from 0", d.cuMemsetD8, a1, 7, n)
        c(f"{phase}: cuMemsetD8Async of device 1 from 0", d.cuMemsetD8Async, a1, 7, n, s0)
        c(f"{phase}: cuStreamSynchronize", d.cuStreamSynchronize, s0)
    clear(ctx1, a1, n)
    c("ctx 0 current, stream of ctx 1: cuMemcpyAsync", d.cuMemcpyAsync, a1, a0, n, s1)
    c("ctx 0 current, stream of ctx 1: sync", d.cuStreamSynchronize, s1)
    c.val("ctx 0 current, stream of ctx 1: data", matches(ctx1, a1, want))
    disable(c, "disable 0->1", ctx0, ctx1)
    disable(c, "disable 1->0", ctx1, ctx0)


def pool_on_1(c: Case, ctx1, s1, n: int) -> tuple[object, int]:
    """A pool of device 1 and ``n`` bytes of it (allocated on ``s1``, freed at case end)."""
    pool = new_pool(c, loc_=dev_loc(1))
    on(ctx1)
    ptr = int(ok(d.cuMemAllocFromPoolAsync, n, pool, s1).v)
    ok(d.cuStreamSynchronize, s1)
    on(Ctx.ctx)
    c.defer(in_ctx, ctx1, _free_sync, ptr, s1)
    return pool, ptr


def pool_setup(c: Case, n: int):
    """(ctx0, ctx1, stream of each, ``n`` bytes of device 0, a pool of device 1, ``n`` of it)."""
    ctx0, ctx1 = Ctx.ctx, peer_ctx(c)
    s0, s1 = stream_in(c, ctx0), stream_in(c, ctx1)
    local = alloc_in(c, ctx0, n)
    pool, remote = pool_on_1(c, ctx1, s1, n)
    return ctx0, ctx1, s0, s1, local, pool, remote


def _free_sync(ptr, stream):
    r = d.cuMemFreeAsync(ptr, stream)
    d.cuStreamSynchronize(stream)
    return r


def cross(c: Case, phase: str, ctx0, ctx1, s0, local: int, remote: int, n: int) -> None:
    """Copies from device 0's context both ways between ``local`` (cuMemAlloc of device 0)
    and ``remote`` (device 1's pool or mapped memory), and from device 1's context."""
    w1, w2 = pattern(n, 1), pattern(n, 2)
    write(ctx1, remote, w1)
    copies(c, f"{phase}: 1->0 from 0", ctx0, s0, (ctx0, local), (ctx1, remote), n, w1)
    write(ctx0, local, w2)
    copies(c, f"{phase}: 0->1 from 0", ctx0, s0, (ctx1, remote), (ctx0, local), n, w2)


@probe("F_copy_pool_memory", isolated=True)
def f_copy_pool(c: Case):
    """Device 1's pool memory from device 0: no grant, context peer access only, a grant."""
    if not two(c):
        return
    n = MiB
    ctx0, ctx1, s0, s1, local, pool, remote = pool_setup(c, n)
    GA, SA = d.cuMemPoolGetAccess, d.cuMemPoolSetAccess
    r = c("getAccess(pool1, dev0) fresh", GA, pool, dev_loc(0))
    c.val("access_dev0_fresh", jv(r.v))
    r = c("getAccess(pool1, dev1) fresh", GA, pool, dev_loc(1))
    c.val("access_dev1_fresh", jv(r.v))
    cross(c, "no grant", ctx0, ctx1, s0, local, remote, n)
    w = pattern(n, 3)
    write(ctx1, remote, w)
    copies(c, "no grant: 1->0 from 1", ctx1, s1, (ctx0, local), (ctx1, remote), n, w)
    enable(c, "enable 0->1", ctx0, ctx1)
    enable(c, "enable 1->0", ctx1, ctx0)
    cross(c, "context peer only", ctx0, ctx1, s0, local, remote, n)
    disable(c, "disable 0->1", ctx0, ctx1)
    disable(c, "disable 1->0", ctx1, ctx0)
    c("setAccess(pool1, dev0 RW)", SA, pool, [access_desc(dev_loc(0))], 1)
    r = c("getAccess(pool1, dev0) granted", GA, pool, dev_loc(0))
    c.val("access_dev0_granted", jv(r.v))
    cross(c, "pool grant", ctx0, ctx1, s0, local, remote, n)
    c("setAccess(pool1, dev1 NONE) (its own device)", SA, pool, [access_desc(dev_loc(1), NONE)], 1)
    dflt = ok(d.cuDeviceGetDefaultMemPool, 1).v
    r = c("getAccess(default pool 1, dev0)", GA, dflt, dev_loc(0))
    c.val("default_pool1_access_dev0", jv(r.v))
    c("setAccess(default pool 1, dev0 RW)", SA, dflt, [access_desc(dev_loc(0))], 1)
    c("setAccess(default pool 1, dev0 NONE)", SA, dflt, [access_desc(dev_loc(0), NONE)], 1)


def _pool_grant_case(flags, label: str):
    """A pool of device 1 granting device 0 RW, then ``flags`` with its memory live."""

    def run(c: Case):
        if not two(c):
            return
        n = MiB
        ctx0, ctx1, s0, _s1, local, pool, remote = pool_setup(c, n)
        c("setAccess(pool1, dev0 RW)", d.cuMemPoolSetAccess, pool, [access_desc(dev_loc(0))], 1)
        cross(c, "granted", ctx0, ctx1, s0, local, remote, n)
        c(f"setAccess(pool1, dev0 {label})", d.cuMemPoolSetAccess, pool,
          [access_desc(dev_loc(0), flags)], 1)
        r = c("getAccess(pool1, dev0) after", d.cuMemPoolGetAccess, pool, dev_loc(0))
        c.val("access_dev0_after", jv(r.v))
        cross(c, label, ctx0, ctx1, s0, local, remote, n)
        c("cuCtxSynchronize#after", d.cuCtxSynchronize)

    return run


# changing a pool's grant while its memory is live: reads only, or none (a copy may fault)
probe("F_pool_grant_read", isolated=True)(_pool_grant_case(READ, "READ"))
probe("F_pool_grant_revoked", isolated=True)(_pool_grant_case(NONE, "NONE"))


@probe("F_copy_vmm_memory", isolated=True)
def f_copy_vmm(c: Case):
    """A mapping of device 1's physical memory from device 0: no grant, context peer access
    only, cuMemSetAccess for device 0."""
    if not two(c):
        return
    ctx0, ctx1 = Ctx.ctx, peer_ctx(c)
    n = int(ok(d.cuMemGetAllocationGranularity, vmm_prop(1),
               GF.CU_MEM_ALLOC_GRANULARITY_MINIMUM).v)
    c.val("granularity_dev1", n)
    s0 = stream_in(c, ctx0)
    local = alloc_in(c, ctx0, n)
    h = vcreate(c, n, vmm_prop(1))
    va = int(reserve(c, n))
    vmap(c, va, n, h)
    c("setAccess(va, dev1)", d.cuMemSetAccess, va, n, [access_desc(dev_loc(1))], 1)
    r = c("getAccess(dev0, va) before", d.cuMemGetAccess, dev_loc(0), va)
    c.val("access_dev0_before", jv(r.v))
    cross(c, "no grant", ctx0, ctx1, s0, local, va, n)
    enable(c, "enable 0->1", ctx0, ctx1)
    enable(c, "enable 1->0", ctx1, ctx0)
    cross(c, "context peer only", ctx0, ctx1, s0, local, va, n)
    disable(c, "disable 0->1", ctx0, ctx1)
    disable(c, "disable 1->0", ctx1, ctx0)
    c("setAccess(va, dev0 + dev1)", d.cuMemSetAccess, va, n,
      [access_desc(dev_loc(0)), access_desc(dev_loc(1))], 2)
    r = c("getAccess(dev0, va) granted", d.cuMemGetAccess, dev_loc(0), va)
    c.val("access_dev0_granted", jv(r.v))
    cross(c, "vmm grant", ctx0, ctx1, s0, local, va, n)


@probe("F_vmm_nccl_registrable")
def f_vmm_nccl(c: Case):
    """VMM memory made the way NCCL's user-buffer registration wants it: POSIX file
    descriptor handles, size a multiple of the recommended granularity, aligned address."""
    if not two(c):
        return
    for dev in (0, 1):
        prop = vmm_prop(dev, POSIX_FD)
        r = c(f"granularity(dev{dev}, POSIX_FD, MINIMUM)", d.cuMemGetAllocationGranularity,
              prop, GF.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        c.val(f"min_dev{dev}", r.v)
        r = c(f"granularity(dev{dev}, POSIX_FD, RECOMMENDED)", d.cuMemGetAllocationGranularity,
              prop, GF.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        c.val(f"recommended_dev{dev}", r.v)
        rec = int(r.v or 2 * MiB)
        size = 2 * rec
        h = vcreate(c, size, prop)
        va = int(reserve(c, size, align=rec))
        c.val(f"aligned_dev{dev}", va % rec == 0)
        vmap(c, va, size, h)
        c(f"setAccess(dev{dev} mapping, dev0 + dev1)", d.cuMemSetAccess, va, size,
          [access_desc(dev_loc(0)), access_desc(dev_loc(1))], 2)
        r = c(f"export(dev{dev}, POSIX_FD)", d.cuMemExportToShareableHandle, h, POSIX_FD, 0)
        if r.ok and not RUN.dry:
            os.close(int(r.v))


@probe("F_stream_of_other_context", isolated=True)
def f_stream_of_other_context(c: Case):
    """Device 0's context current, work on a stream of device 1, on host memory and device
    1's pool memory that granted device 0 nothing (and a cuMemAlloc of device 1, no peer
    access): which context's access the driver checks, whether device 1's pool allocates on
    that stream, and whether an event of device 0 may be recorded on it."""
    if not two(c):
        return
    n = MiB
    ctx0, ctx1 = Ctx.ctx, peer_ctx(c)
    s1 = stream_in(c, ctx1)
    pool, remote = pool_on_1(c, ctx1, s1, n)
    dev1 = alloc_in(c, ctx1, n)
    host = P(pinned(c, n))
    want = pattern(n, 9)
    call(d.cuMemcpy, host, want.ctypes.data, n)
    for tag, ptr in (("pool of 1", remote), ("cuMemAlloc of 1", dev1)):
        clear(ctx1, ptr, n)
        on(ctx0)
        r = c(f"{tag}: host -> it, cuMemcpyAsync on s1", d.cuMemcpyAsync, ptr, host, n, s1)
        c(f"{tag}: cuStreamSynchronize(s1)", d.cuStreamSynchronize, s1)
        on(Ctx.ctx)
        c.val(f"{tag}: cuMemcpyAsync data", matches(ctx1, ptr, want) if r.ok else None)
        on(ctx0)
        c(f"{tag}: cuMemsetD8Async on s1", d.cuMemsetD8Async, ptr, 3, n, s1)
        c(f"{tag}: cuMemcpyBatchAsync on s1", d.cuMemcpyBatchAsync,
          *batch_args(ptr, host, n, s1))
        c(f"{tag}: cuStreamSynchronize(s1) again", d.cuStreamSynchronize, s1)
        on(Ctx.ctx)
    on(ctx0)
    r = c("cuMemAllocFromPoolAsync(pool of 1, s1)", d.cuMemAllocFromPoolAsync, n, pool, s1)
    if r.ok:
        c("cuMemFreeAsync(it, s1)", d.cuMemFreeAsync, r.v, s1)
        c("cuStreamSynchronize(s1) after the pool", d.cuStreamSynchronize, s1)
    ev = c("cuEventCreate in ctx 0", d.cuEventCreate, 2)
    if ev.ok:
        c("cuEventRecord(event of ctx 0, s1)", d.cuEventRecord, ev.v, s1)
        c("cuEventDestroy", d.cuEventDestroy, ev.v)
    on(Ctx.ctx)
    c("cuCtxSynchronize#after", d.cuCtxSynchronize)


# ---------------------------------------------------------------------------
# what a pool's handle carries: access after the handle is reused, an imported pool
# ---------------------------------------------------------------------------


def _access_of(pool, device: int):
    r = call(d.cuMemPoolGetAccess, pool, dev_loc(device))
    return int(r.v) if r.ok and r.v is not None else r.name


@probe("F_pool_handle_reuse", isolated=True)
def f_pool_handle_reuse(c: Case):
    """A pool of device 0 granting device 1 access is destroyed (granted, and again with
    the grant revoked first); do the next pools that get the same handle start with
    device 1's access?  Up to eight pools are made until one reuses the handle."""
    if not two(c):
        return
    for revoke in (False, True):
        tag = "revoked first" if revoke else "granted"
        first = ok(d.cuMemPoolCreate, pool_props(loc_=dev_loc(0))).v
        c(f"{tag}: setAccess(pool, dev1 RW)", d.cuMemPoolSetAccess, first,
          [access_desc(dev_loc(1))], 1)
        c.val(f"{tag}: access_dev1 before destroy", _access_of(first, 1))
        if revoke:
            c(f"{tag}: setAccess(pool, dev1 NONE)", d.cuMemPoolSetAccess, first,
              [access_desc(dev_loc(1), NONE)], 1)
        c(f"{tag}: cuMemPoolDestroy", d.cuMemPoolDestroy, first)
        made = []
        reused = None
        for _ in range(8):
            nxt = ok(d.cuMemPoolCreate, pool_props(loc_=dev_loc(0))).v
            made.append(nxt)
            if P(nxt) == P(first):
                reused = nxt
                break
        c.val(f"{tag}: handle reused", reused is not None)
        c.val(f"{tag}: pools made until reuse", len(made))
        if reused is not None:
            c(f"{tag}: getAccess(new pool, dev1)", d.cuMemPoolGetAccess, reused, dev_loc(1))
            c.val(f"{tag}: new pool access_dev1", _access_of(reused, 1))
        fresh = made[0] if reused is None or len(made) > 1 else None
        if fresh is not None:
            c.val(f"{tag}: fresh-handle pool access_dev1", _access_of(fresh, 1))
        for pool in made:
            call(d.cuMemPoolDestroy, pool)


@probe("F_imported_pool_access")
def f_imported_pool_access(c: Case):
    """Each device's access to an ipc pool of device j imported in the same process
    (``cuMemPoolGetAccess`` on the imported handle): whether it tells where the memory is.
    Runs with one device too."""
    c.val("device_count", Ctx.count)
    for j in range(min(Ctx.count, 2)):
        pool = new_pool(c, loc_=dev_loc(j), handle_types=POSIX_FD)
        r = c(f"pool{j}: export", d.cuMemPoolExportToShareableHandle, pool, POSIX_FD, 0)
        if not r.ok:
            continue
        fd = int(r.v or 0)
        try:
            ri = c(f"pool{j}: import", d.cuMemPoolImportFromShareableHandle, fd, POSIX_FD, 0)
            if not ri.ok:
                continue
            for k in range(min(Ctx.count, 2)):
                c(f"pool{j}: getAccess(imported, dev{k})", d.cuMemPoolGetAccess, ri.v,
                  dev_loc(k))
                c.val(f"pool{j}: imported access_dev{k}", _access_of(ri.v, k))
            if P(ri.v) != P(pool):
                c(f"pool{j}: destroy imported", d.cuMemPoolDestroy, ri.v)
        finally:
            if not RUN.dry:
                os.close(fd)


# ---------------------------------------------------------------------------
# kernels of device 0 reading and writing device 1's memory
# ---------------------------------------------------------------------------


def kernel(c: Case):
    r = c("cuModuleLoadData", d.cuModuleLoadData, PTX)
    c.defer(d.cuModuleUnload, r.v)
    return c("cuModuleGetFunction", d.cuModuleGetFunction, r.v, b"probe_copy").v


def launch(c: Case, label: str, fn, stream, dst: int, src: int, n: int) -> bool:
    words = n // 4
    params = ((dst, src, words), (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64))
    r = c(f"{label}: cuLaunchKernel", d.cuLaunchKernel, fn, (words + 255) // 256, 1, 1,
          256, 1, 1, 0, stream, params, 0)
    r2 = c(f"{label}: cuStreamSynchronize", d.cuStreamSynchronize, stream)
    return r.ok and r2.ok


def remote_memory(c: Case, kind: str, ctx1, n: int) -> tuple[int, object]:
    """``n`` bytes of device 1 (cuMemAlloc, pool or mapped memory; device 1 has access)
    and their pool (``None`` for the other kinds)."""
    if kind == "device":
        return alloc_in(c, ctx1, n), None
    if kind == "pool":
        pool, ptr = pool_on_1(c, ctx1, stream_in(c, ctx1), n)
        return ptr, pool
    h = vcreate(c, n, vmm_prop(1))
    va = int(reserve(c, n))
    vmap(c, va, n, h)
    ok(d.cuMemSetAccess, va, n, [access_desc(dev_loc(1))], 1)
    return va, None


def grant(c: Case, kind: str, remote: int, pool, n: int) -> None:
    """Device 0's access to ``remote`` by its kind's own grant."""
    if kind == "pool":
        c("cuMemPoolSetAccess(dev0 RW)", d.cuMemPoolSetAccess, pool, [access_desc(dev_loc(0))], 1)
    elif kind == "vmm":
        c("cuMemSetAccess(dev0 RW)", d.cuMemSetAccess, remote, n,
          [access_desc(dev_loc(0)), access_desc(dev_loc(1))], 2)


def _kernel_case(kind: str, access: str):
    def run(c: Case):
        if not two(c):
            return
        n = 2 * MiB
        ctx0, ctx1 = Ctx.ctx, peer_ctx(c)
        s0 = stream_in(c, ctx0)
        local = alloc_in(c, ctx0, n)
        remote, pool = remote_memory(c, kind, ctx1, n)
        want = pattern(n, 5)
        write(ctx1, remote, want)
        fn = kernel(c)
        if access in ("peer", "peer_only"):
            enable(c, "enable 0->1", ctx0, ctx1)
        if access == "granted":
            grant(c, kind, remote, pool, n)
        if launch(c, "read device 1", fn, s0, local, remote, n):
            c.val("read data", matches(ctx0, local, want))
            want2 = pattern(n, 6)
            write(ctx0, local, want2)
            if launch(c, "write device 1", fn, s0, remote, local, n):
                c.val("write data", matches(ctx1, remote, want2))
        c("cuCtxSynchronize#after", d.cuCtxSynchronize)

    return run


# (memory kind, what device 0 was given): "peer" = cuCtxEnablePeerAccess 0->1;
# "granted" = the kind's own grant without it; "peer_only" = the former without the latter
KERNEL_CASES = (("device", "peer"), ("device", "none"), ("pool", "granted"),
                ("pool", "peer_only"), ("pool", "none"), ("vmm", "granted"),
                ("vmm", "peer_only"), ("vmm", "none"))
for _kind, _access in KERNEL_CASES:
    probe(f"F_kernel_{_kind}_{_access}", isolated=True)(_kernel_case(_kind, _access))


# ---------------------------------------------------------------------------
# bandwidth
# ---------------------------------------------------------------------------


def gbps(issue, sync, nbytes: int) -> float:
    """GB/s of ``issue()`` (one copy of ``nbytes``), median of five timed rounds."""
    reps = max(1, min(200, (256 * MiB) // nbytes))
    issue()
    sync()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            issue()
        sync()
        times.append((time.perf_counter() - t0) / reps)
    t = sorted(times)[2]
    return round(nbytes / t / 1e9, 2) if t > 0 else 0.0


@probe("F_peer_bandwidth", isolated=True)
def f_bandwidth(c: Case):
    """cuMemcpyAsync device 0 -> 1 from 4 KiB to 1 GiB without and with peer access, both
    directions at once on two streams, cuMemcpyPeerAsync, and a copy within device 0."""
    if not two(c):
        return
    ctx0, ctx1 = Ctx.ctx, peer_ctx(c)
    big = GiB
    b0, b1 = alloc_in(c, ctx0, 2 * big), alloc_in(c, ctx1, 2 * big)
    s0, s1 = stream_in(c, ctx0), stream_in(c, ctx1)
    sizes = [4 * KiB, 64 * KiB, MiB, 16 * MiB, 256 * MiB, GiB]

    def one_way(n):
        return gbps(lambda: call(d.cuMemcpyAsync, b1, b0, n, s0),
                    lambda: call(d.cuStreamSynchronize, s0), n)

    def both_ways(n):
        def issue():
            call(d.cuMemcpyAsync, b1, b0, n, s0)
            in_ctx(ctx1, d.cuMemcpyAsync, b0 + big, b1 + big, n, s1)

        def sync():
            call(d.cuStreamSynchronize, s0)
            in_ctx(ctx1, d.cuStreamSynchronize, s1)

        return gbps(issue, sync, 2 * n)

    c.val("no peer: 0->1 GB/s", {str(n): one_way(n) for n in sizes})
    c.val("no peer: both ways 256 MiB GB/s (bytes of both)", both_ways(256 * MiB))
    enable(c, "enable 0->1", ctx0, ctx1)
    enable(c, "enable 1->0", ctx1, ctx0)
    c.val("peer: 0->1 GB/s", {str(n): one_way(n) for n in sizes})
    c.val("peer: both ways 256 MiB GB/s (bytes of both)", both_ways(256 * MiB))
    n = 256 * MiB
    c.val("peer: cuMemcpyPeerAsync 256 MiB GB/s", gbps(
        lambda: call(d.cuMemcpyPeerAsync, b1, ctx1, b0, ctx0, n, s0),
        lambda: call(d.cuStreamSynchronize, s0), n))
    c.val("within device 0: 256 MiB GB/s", gbps(
        lambda: call(d.cuMemcpyAsync, b0 + big, b0, n, s0),
        lambda: call(d.cuStreamSynchronize, s0), n))
    disable(c, "disable 0->1", ctx0, ctx1)
    disable(c, "disable 1->0", ctx1, ctx0)
