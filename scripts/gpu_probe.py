#!/usr/bin/env python3
"""Probe the real CUDA driver through raw ``cuda.bindings.driver`` calls.

Records, for each case, the exact ``CUresult`` name the driver returns at
each step, plus measured values, so that the CPU simulator
(``cuda_memkit.sim``) can reproduce them verbatim.

Usage::

    python3 scripts/gpu_probe.py OUT.json            # on a GPU machine
    python3 scripts/gpu_probe.py --dry OUT.json      # no GPU: argument-form check

Output JSON maps case name -> {"result": ..., "values": ..., "note": ...}.
"result" is one CUresult name for a one-step case, otherwise an ordered dict
step-label -> CUresult name (a Python exception is recorded as
{"exception": type name, "message": str}).

Every case runs in a child process (consecutive ordinary cases share one;
cases that might crash or poison the context get their own, "isolated":
true, and end with cuCtxSynchronize#after / cuMemAlloc#after steps).  When a
child dies (e.g. SIGSEGV inside the driver), the parent re-runs the case
with the fatal call skipped; that step is recorded as {"crash": ...} and the
case gets a "crashes" list (call index, function, rc).  _meta.crashed_cases
lists them.  GPU_PROBE_TEST_CRASH="CASE:INDEX" simulates such a crash.

--dry: without libcuda every binding raises DynamicLibNotFoundError *after*
converting its arguments, so a dry run checks every call's argument forms;
outputs are faked from the docstrings.  Values in a dry run mean nothing.

Safety: managed allocations <= 256 MiB; huge sizes only in calls that fail;
no multicast objects; no clock or reset changes.
"""

from __future__ import annotations

import ctypes
import enum
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import traceback

import numpy as np

try:
    from cuda.bindings import driver as d
except ImportError as exc:  # pragma: no cover
    print(f"gpu_probe: cannot import cuda.bindings.driver: {exc}", file=sys.stderr)
    sys.exit(2)

DRY = False
ISOLATED_CHILD = False  # True in a child process (every case runs in one)
CALL_IDX = 0  # number of driver calls made so far in the current case (child)
SKIP_CALLS: set = set()  # call indices of the current case that crashed before
POISON: set = set()  # "function:enum,args" signatures that crashed before (all cases)
CUR_CASE = ""
# testing the crash recovery: GPU_PROBE_TEST_CRASH="CASE:INDEX" kills the child at that call
_TEST_CRASH = os.environ.get("GPU_PROBE_TEST_CRASH", "")
KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
UINT64_MAX = (1 << 64) - 1
PAGE = 4096

# ---------------------------------------------------------------------------
# call helpers
# ---------------------------------------------------------------------------


def _is_nolib(exc: BaseException) -> bool:
    return type(exc).__name__ in ("DynamicLibNotFoundError", "DynamicLibNotAvailableError")


_RET_RE = re.compile(r"^(\w+) : (.+)$")


_FAKE_CACHE: dict = {}


def _fake_outputs(fn) -> list:
    """Outputs of ``fn`` faked from its docstring (dry mode only)."""
    key = getattr(fn, "__name__", repr(fn))
    if key not in _FAKE_CACHE:
        _FAKE_CACHE[key] = _fake_outputs_uncached(fn)
    return list(_FAKE_CACHE[key])


def _fake_outputs_uncached(fn) -> list:
    doc = fn.__doc__ or ""
    i = doc.find("Returns\n-------\n")
    j = doc.find("See Also", i)
    outs = []
    if i >= 0:
        block = doc[i : j if j > 0 else None].splitlines()
        for line in block[3:]:
            m = _RET_RE.match(line)
            if not m:
                continue
            t = m.group(2)
            mm = re.search(r"~\.(\w+)", t)
            if mm and hasattr(d, mm.group(1)):
                cls = getattr(d, mm.group(1))
                val = None
                try:
                    val = cls()  # structs: a no-argument instance (an int would be a pointer)
                    int(val)  # handles are int-like: give them a plausible value
                    val = cls(0x7F0000200000)
                except Exception:
                    pass
                outs.append(val)
            elif t.startswith("int"):
                outs.append(2 * MiB)
            elif t.startswith("float"):
                outs.append(1.0)
            elif t.startswith("bytes"):
                outs.append(b"dry")
            elif t.startswith("list"):
                outs.append([0])
            else:
                outs.append(0x7F0000200000)
    return outs


class Res:
    """One call's outcome: .name (CUresult name or exception dict), .outs."""

    __slots__ = ("name", "outs")

    def __init__(self, name, outs):
        self.name = name
        self.outs = list(outs) + [None] * 8

    @property
    def ok(self) -> bool:
        return self.name == "CUDA_SUCCESS"

    @property
    def v(self):
        return self.outs[0]


def exc_rec(e: BaseException) -> dict:
    return {"exception": type(e).__name__, "message": str(e)[:300]}


def call(fn, *args) -> Res:
    global CALL_IDX
    if isinstance(fn, str):
        f = getattr(d, fn, None)
        if f is None:
            return Res({"exception": "AttributeError", "message": f"driver has no {fn}"}, [])
        fn = f
    CALL_IDX += 1
    if ISOLATED_CHILD:
        fname = getattr(fn, "__name__", "?")
        enums = [a.name for a in args if isinstance(a, (enum.Enum, int)) and hasattr(a, "name")]
        sig = f"{fname}:{','.join(enums)}" if enums else ""
        if CALL_IDX in SKIP_CALLS or (sig and sig in POISON):
            return Res({"crash": "process died in this call in an earlier attempt; skipped"}, [])
        print(f"CALL {CALL_IDX} {fname} {sig}".rstrip(), flush=True)
        if _TEST_CRASH and _TEST_CRASH == f"{CUR_CASE}:{CALL_IDX}":
            os.kill(os.getpid(), 11)
    try:
        res = fn(*args)
    except BaseException as e:
        if DRY and _is_nolib(e):
            return Res("CUDA_SUCCESS", _fake_outputs(fn))
        if isinstance(e, KeyboardInterrupt):
            raise
        return Res(exc_rec(e), [])
    if isinstance(res, tuple) and res:
        err = res[0]
        name = getattr(err, "name", None) or repr(err)
        return Res(name, res[1:])
    return Res(repr(res), [])


def qcall(fn, *args) -> Res:
    """call() without the child's call logging (for timing loops)."""
    if DRY:
        return call(fn, *args)
    try:
        res = fn(*args)
    except Exception as e:
        return Res(exc_rec(e), [])
    return Res(getattr(res[0], "name", repr(res[0])), res[1:])


def ok(fn, *args) -> Res:
    """A call that must succeed (setup); raises otherwise."""
    r = call(fn, *args)
    if not r.ok:
        fname = fn if isinstance(fn, str) else fn.__name__
        raise RuntimeError(f"setup call {fname} failed: {r.name}")
    return r


def jv(x, depth=0):
    """JSON-friendly form of a binding value."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, bytes):
        return x.decode("latin-1")
    if isinstance(x, (list, tuple)):
        return [jv(y, depth + 1) for y in x][:64]
    if isinstance(x, dict):
        return {str(k): jv(v, depth + 1) for k, v in x.items()}
    if hasattr(x, "name") and hasattr(x, "value") and not hasattr(x, "getPtr"):
        return x.name  # enum
    try:
        return int(x)
    except Exception:
        pass
    if depth < 2 and hasattr(x, "getPtr"):
        out = {}
        for a in dir(x):
            if a.startswith("_") or a in ("getPtr",):
                continue
            try:
                out[a] = jv(getattr(x, a), depth + 1)
            except Exception as e:
                out[a] = f"<{type(e).__name__}>"
        return out
    return repr(x)[:200]


def tv(x) -> dict:
    return {"value": jv(x), "type": type(x).__name__}


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
# cases
# ---------------------------------------------------------------------------


class Case:
    """Collects steps of one case."""

    def __init__(self, name):
        self.name = name
        self.steps: dict = {}
        self.values: dict = {}
        self.notes: list = []
        self.cleanup: list = []

    def __call__(self, label, fn, *args) -> Res:
        r = call(fn, *args)
        self.record(label, r.name)
        return r

    def record(self, label, name):
        base, k = label, 2
        while label in self.steps:
            label = f"{base}#{k}"
            k += 1
        self.steps[label] = name
        if ISOLATED_CHILD:
            print("STEP " + json.dumps({label: name}), flush=True)

    def val(self, key, value):
        self.values[key] = value
        if ISOLATED_CHILD:
            print("VAL " + json.dumps({key: jv(value)}, default=repr), flush=True)

    def note(self, text):
        self.notes.append(text)

    def defer(self, fn, *args):
        """Run fn(*args) when the case ends (LIFO)."""
        self.cleanup.append((fn, args))

    def finish(self):
        for fn, args in reversed(self.cleanup):
            try:
                call(fn, *args)
            except Exception:
                pass
        self.cleanup.clear()

    def as_json(self):
        if len(self.steps) == 1:
            result = next(iter(self.steps.values()))
        else:
            result = self.steps
        return {"result": result, "values": jv(self.values), "note": "; ".join(self.notes)}


CASES: list = []  # (name, fn, isolated)


def case(name, isolated=False):
    def deco(fn):
        CASES.append((name, fn, isolated))
        return fn

    return deco


class Ctx:
    dev = None
    ctx = None
    count = 0


def set_primary():
    if Ctx.ctx is not None and not DRY:
        d.cuCtxSetCurrent(Ctx.ctx)  # raw: not counted as a step call


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
    if not DRY:
        ctypes.memset(addr, value, n)


def host_bytes(addr: int, n: int) -> bytes:
    if DRY:
        return bytes(n)
    return ctypes.string_at(addr, n)


# ===========================================================================
# A. Core
# ===========================================================================


@case("A_init_version_devices")
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


@case("A_no_context_thread")
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


@case("A_mem_alloc_free")
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


@case("A_memset")
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


@case("A_memcpy")
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
    c.val("dtoh_interior_ok", bool(DRY or (dst[:256] == src[256:512]).all()))
    c("cuMemcpyHtoD(size 0)", d.cuMemcpyHtoD, p, src, 0)
    c("cuMemcpyDtoH(size 0)", d.cuMemcpyDtoH, dst, p, 0)
    c("cuMemcpyDtoD(size 0)", d.cuMemcpyDtoD, q, p, 0)
    c("cuMemcpyDtoD(0,0,size 0)", d.cuMemcpyDtoD, 0, 0, 0)
    c("cuMemcpyHtoD(0x1234000,size 0)", d.cuMemcpyHtoD, 0x1234000, src, 0)
    c("cuMemcpyDtoD", d.cuMemcpyDtoD, q, p, n)
    dst[:] = 0
    c("cuMemcpy(host<-dev)", d.cuMemcpy, dst.ctypes.data, P(q), n)
    c.val("unified_dtoh_ok", bool(DRY or (dst == src).all()))
    src2 = src[::-1].copy()
    c("cuMemcpy(dev<-host)", d.cuMemcpy, P(p), src2.ctypes.data, n)
    dst[:] = 0
    c("cuMemcpyDtoH#check", d.cuMemcpyDtoH, dst, p, n)
    c.val("unified_htod_ok", bool(DRY or (dst == src2).all()))
    dst[:] = 0
    c("cuMemcpy(host<-host)", d.cuMemcpy, dst.ctypes.data, src.ctypes.data, n)
    c.val("unified_htoh_ok", bool(DRY or (dst == src).all()))
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


@case("A_streams")
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


@case("A_events")
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


@case("A_ctx_current")
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


PTR_ATTRS = [a for a in d.CUpointer_attribute]


def ptr_attrs(c: Case, label: str, ptr):
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


@case("A_pointer_attributes")
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


@case("A_address_range")
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


@case("A_error_strings")
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


@case("A_device_attributes")
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


# ---------------------------------------------------------------------------
# A: risky cases (subprocess each)
# ---------------------------------------------------------------------------


def ctx_after(c: Case):
    c("cuCtxSynchronize#after", d.cuCtxSynchronize)
    r = call(d.cuMemAlloc, 4096)
    c.record("cuMemAlloc#after", r.name)
    if r.ok:
        call(d.cuMemFree, r.v)


@case("A_memset_past_end", isolated=True)
def a_memset_past(c: Case):
    p = dalloc(c, 4096)
    c("cuMemsetD8(N=4096+256)", d.cuMemsetD8, p, 1, 4096 + 256)
    c("cuMemsetD8(p+4000, N=200)", d.cuMemsetD8, P(p) + 4000, 1, 200)
    c("cuMemsetD8(N=64MiB)", d.cuMemsetD8, p, 1, 64 * MiB)
    ctx_after(c)


@case("A_memset_bad_ptrs", isolated=True)
def a_memset_bad(c: Case):
    c("cuMemsetD8(0)", d.cuMemsetD8, 0, 1, 16)
    arr, addr = host_buf(PAGE)
    c("cuMemsetD8(numpy pageable)", d.cuMemsetD8, addr, 7, 16)
    c.val("numpy_bytes_after", list(host_bytes(addr, 4)))
    ctx_after(c)
    del arr


@case("A_unknown_ptr_memset", isolated=True)
def a_unknown_memset(c: Case):
    c("cuMemsetD8(0x1234000) unknown", d.cuMemsetD8, 0x1234000, 1, 16)
    ctx_after(c)


@case("A_unknown_ptr_copies", isolated=True)
def a_unknown_copies(c: Case):
    p = dalloc(c, 4096)
    dst = np.zeros(16, np.uint8)
    c("cuMemcpyDtoH(src unknown 0x1234000)", d.cuMemcpyDtoH, dst, 0x1234000, 16)
    c("cuCtxSynchronize#mid", d.cuCtxSynchronize)
    c("cuMemcpyDtoD(dst unknown 0x1234000)", d.cuMemcpyDtoD, 0x1234000, p, 16)
    ctx_after(c)


@case("A_memcpy_oversize", isolated=True)
def a_memcpy_over(c: Case):
    p = dalloc(c, 4096)
    src = np.zeros(8192, np.uint8)
    c("cuMemcpyHtoD(8192 into 4096 alloc)", d.cuMemcpyHtoD, p, src, 8192)
    c("cuMemcpyDtoH(8192 from 4096 alloc)", d.cuMemcpyDtoH, src, p, 8192)
    q = dalloc(c, 4096)
    c("cuMemcpyDtoD(8192)", d.cuMemcpyDtoD, q, p, 8192)
    ctx_after(c)


@case("A_memcpy_host_as_device", isolated=True)
def a_memcpy_hostdst(c: Case):
    p = dalloc(c, 4096)
    call(d.cuMemsetD8, p, 0x5A, 4096)
    src = np.full(4096, 3, np.uint8)
    dst = np.zeros(4096, np.uint8)
    c("cuMemcpyHtoD(dst=numpy addr)", d.cuMemcpyHtoD, dst.ctypes.data, src, 4096)
    c.val("htod_hostdst_copied", bool(DRY or (dst == 3).all()))
    dst2 = np.zeros(4096, np.uint8)
    c("cuMemcpyDtoH(src=numpy addr)", d.cuMemcpyDtoH, dst2, src.ctypes.data, 4096)
    c.val("dtoh_hostsrc_copied", bool(DRY or (dst2 == 3).all()))
    c("cuMemcpyDtoD(numpy->numpy)", d.cuMemcpyDtoD, dst.ctypes.data, src.ctypes.data, 16)
    c("cuMemcpyHtoD(src=device ptr)", d.cuMemcpyHtoD, P(p), P(p) + 0, 0)
    ctx_after(c)


@case("A_stream_double_destroy", isolated=True)
def a_stream_dd(c: Case):
    r = ok(d.cuStreamCreate, 0)
    s = r.v
    c("cuStreamDestroy#1", d.cuStreamDestroy, s)
    c("cuStreamDestroy#2", d.cuStreamDestroy, s)
    ctx_after(c)


@case("A_event_double_destroy", isolated=True)
def a_event_dd(c: Case):
    r = ok(d.cuEventCreate, 0)
    e = r.v
    c("cuEventDestroy#1", d.cuEventDestroy, e)
    c("cuEventDestroy#2", d.cuEventDestroy, e)
    c("cuEventQuery(destroyed)", d.cuEventQuery, e)
    ctx_after(c)


@case("A_destroyed_stream_ops", isolated=True)
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


# ===========================================================================
# B. Pinned host memory
# ===========================================================================


@case("B_hostalloc_flags")
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


@case("B_freehost_misuse", isolated=True)
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


@case("B_host_register")
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


@case("B_register_readonly_write", isolated=True)
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


@case("B_timing_hostalloc")
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


# ===========================================================================
# C. Managed memory
# ===========================================================================

ADV = d.CUmem_advise
RA = d.CUmem_range_attribute


@case("C_alloc_managed")
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


@case("C_advise")
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


@case("C_prefetch")
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


@case("C_prefetch_unusual_targets", isolated=True)
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


@case("C_range_attributes")
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


@case("C_prefetch_batch")
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


@case("C_stream_attach")
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


@case("C_timing_prefetch")
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


# ===========================================================================
# D. Virtual memory management (cuMemCreate / cuMemMap)
# ===========================================================================

AT = d.CUmemAllocationType
HT = d.CUmemAllocationHandleType
GF = d.CUmemAllocationGranularity_flags
POSIX_FD = HT.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
RW = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE


def access_desc(loc_, flags=RW):
    a = d.CUmemAccessDesc()
    a.location = loc_
    a.flags = flags
    return a


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


@case("D_granularity")
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


@case("D_reserve")
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


@case("D_create")
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


@case("D_map_access")
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


@case("D_no_access_use", isolated=True)
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


@case("D_release_free_while_mapped", isolated=True)
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


@case("D_export_import")
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


@case("D_timing")
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


# ===========================================================================
# E. Stream-ordered memory pools
# ===========================================================================

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


@case("E_pool_create")
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


@case("E_pool_attributes")
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


@case("E_pool_stats")
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


@case("E_pool_alloc_misuse")
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


@case("E_free_async_twice", isolated=True)
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


@case("E_pool_destroy_live", isolated=True)
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


@case("E_pool_access")
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


@case("E_pool_ipc")
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
        if not DRY:
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


@case("E_pool_import_pointer_garbage", isolated=True)
def e_import_garbage(c: Case):
    ipc = new_pool(c, handle_types=POSIX_FD)
    plain = new_pool(c)
    garbage = d.CUmemPoolPtrExportData()
    if not DRY:
        ctypes.memmove(garbage.getPtr(), b"\xab" * 64, 64)
    c("importPointer(ipc pool, garbage 0xab*64)", d.cuMemPoolImportPointer, ipc, garbage)
    c("importPointer(ipc pool, zeroed)", d.cuMemPoolImportPointer, ipc, d.CUmemPoolPtrExportData())
    c("importPointer(non-ipc pool, garbage)", d.cuMemPoolImportPointer, plain, garbage)
    ctx_after(c)


@case("E_timing")
def e_timing(c: Case):
    pool = new_pool(c)
    set_u64(pool, "RELEASE_THRESHOLD", UINT64_MAX)
    s = new_stream(c)
    A, F = d.cuMemAllocFromPoolAsync, d.cuMemFreeAsync
    if DRY:  # raw calls would raise without libcuda

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
        if r[0] != d.CUresult.CUDA_SUCCESS and not DRY:
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
            if r[0] != d.CUresult.CUDA_SUCCESS and not DRY:
                c.record("host 4KiB pairs", r[0].name)
                break
            F(r[1], s)
        t1 = time.perf_counter()
        call(d.cuStreamSynchronize, s)
        c.val("pinned_host_pool_4KiB_pair_us", round((t1 - t0) / N * 1e6, 3))
    c.note("raw binding calls, created stream, release threshold UINT64_MAX, sync after the loop")


@case("E_free_async_destroyed_stream", isolated=True)
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


# ===========================================================================
# driver loop
# ===========================================================================


def vmm_prop(dev=0, handle_types=0, loc_=None, type_=None):
    prop = d.CUmemAllocationProp()
    prop.type = type_ if type_ is not None else d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location = loc_ if loc_ is not None else dev_loc(dev)
    prop.requestedHandleTypes = handle_types
    return prop


def run_case(name, fn) -> dict:
    global CALL_IDX
    CALL_IDX = 0
    c = Case(name)
    set_primary()
    t0 = time.perf_counter()
    try:
        fn(c)
    except Exception as e:
        c.record("python_exception", exc_rec(e))
        c.note("case aborted: " + "".join(traceback.format_exception_only(type(e), e)).strip())
    finally:
        try:
            set_primary()
            c.finish()
        except Exception:
            pass
    out = c.as_json()
    out["seconds"] = round(time.perf_counter() - t0, 3)
    return out


def child_main(spec: dict) -> int:
    """Run ``spec["cases"]`` in order in this (child) process."""
    global SKIP_CALLS, CUR_CASE
    POISON.update(spec.get("poison", []))
    init_driver()
    table = {n: f for n, f, _ in CASES}
    for name in spec["cases"]:
        SKIP_CALLS = set(spec.get("skip", {}).get(name, []))
        CUR_CASE = name
        print("BEGIN " + name, flush=True)
        out = run_case(name, table[name])
        print("CASE " + json.dumps({"name": name, "out": out}, default=repr), flush=True)
    return 0


def spawn(names, skip, poison, idle_timeout=30.0):
    """Run cases ``names`` in one child; returns (finished, partial, rc, stderr tail).

    ``partial`` describes the case the child died in (None when it ended normally):
    {"name", "steps", "values", "last_call": (index, function) or None}.
    """
    import queue

    spec = {"cases": names, "skip": skip, "poison": sorted(poison)}
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)]
    if DRY:
        cmd.append("--dry")
    pr = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    q: queue.Queue = queue.Queue()

    def reader():
        for line in pr.stdout:
            q.put(line)
        q.put(None)

    err_chunks: list = []

    def ereader():
        for line in pr.stderr:
            err_chunks.append(line)
            del err_chunks[:-40]

    threading.Thread(target=reader, daemon=True).start()
    threading.Thread(target=ereader, daemon=True).start()
    finished: dict = {}
    cur, steps, vals, last = None, {}, {}, None
    timed_out = False
    while True:
        try:
            line = q.get(timeout=idle_timeout)
        except Exception:  # queue.Empty: the child hangs
            timed_out = True
            pr.kill()
            break
        if line is None:
            break
        line = line.rstrip("\n")
        if line.startswith("BEGIN "):
            cur, steps, vals, last = line[6:], {}, {}, None
            print(f"    child: {cur}", flush=True)
        elif line.startswith("CALL "):
            parts = line.split(" ")
            last = (int(parts[1]), parts[2], parts[3] if len(parts) > 3 else "")
        elif line.startswith("STEP "):
            steps.update(json.loads(line[5:]))
        elif line.startswith("VAL "):
            vals.update(json.loads(line[4:]))
        elif line.startswith("CASE "):
            obj = json.loads(line[5:])
            finished[obj["name"]] = obj["out"]
            cur = None
    rc = pr.wait()
    if timed_out:
        rc = f"hung>{idle_timeout}s(killed)"
    partial = None
    if cur is not None:
        partial = {"name": cur, "steps": steps, "values": vals, "last_call": last}
    return finished, partial, rc, "".join(err_chunks)[-400:]


def run_all(names, isolated_set, results, out_path, t_all, max_attempts=10, budget_s=170.0):
    """Run every case in a child process; a case that kills its child is re-run
    with the fatal call skipped (recorded as {"crash": ...})."""
    skip: dict = {}
    crashes: dict = {}
    poison: set = set()
    sig_seen: set = set()
    i = 0
    while i < len(names):
        name = names[i]
        if name in isolated_set:
            batch = [name]
        else:
            batch = []
            for n in names[i:]:
                if n in isolated_set:
                    break
                batch.append(n)
        print(
            f"[{time.perf_counter() - t_all:7.2f}s] child for {batch[0]} (+{len(batch) - 1})",
            flush=True,
        )
        t0 = time.perf_counter()
        finished, partial, rc, err = spawn(batch, skip, poison)
        for n in batch:
            if n in finished:
                out = finished[n]
                if n in crashes:
                    out["crashes"] = crashes[n]
                    msg = (
                        f"the process died {len(crashes[n])}x in this case: "
                        "the fatal calls were skipped on re-run (see crashes)"
                    )
                    out["note"] = "; ".join(x for x in (out.get("note"), msg) if x)
                if n in isolated_set:
                    out["isolated"] = True
                results[n] = out
                i += 1
        if partial is not None:
            pname = partial["name"]
            last = partial["last_call"]
            crashes.setdefault(pname, []).append(
                {
                    "call_index": last[0] if last else None,
                    "function": last[1] if last else None,
                    "signature": last[2] if last else None,
                    "rc": rc,
                    "steps_before": len(partial["steps"]),
                    "stderr": err[-200:],
                }
            )
            print(f"    !! child died in {pname} at call {last} rc={rc}", flush=True)
            in_budget = time.perf_counter() - t_all < budget_s
            if last is not None and len(crashes[pname]) < max_attempts and in_budget:
                skip.setdefault(pname, []).append(last[0])
                if last[2]:  # the same enum signature died twice: skip it everywhere
                    if last[2] in sig_seen:
                        poison.add(last[2])
                    sig_seen.add(last[2])
            else:
                results[pname] = {
                    "result": partial["steps"],
                    "values": partial["values"],
                    "note": "process died; partial results",
                    "crashes": crashes[pname],
                }
                i += 1
        elif len(finished) < len(batch):
            # child ended without running everything (e.g. init failure)
            n = batch[len(finished)]
            results[n] = {"result": {}, "values": {}, "note": f"child ended rc={rc}: {err}"}
            i += 1
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True, default=repr)
        del t0


def init_driver(parent=False) -> dict:
    r = call(d.cuInit, 0)
    if isinstance(r.name, dict):
        msg = r.name.get("message", "")
        print(
            "gpu_probe: the CUDA driver library (libcuda) could not be loaded: "
            f"{r.name.get('exception')}: {msg}\n"
            "Run this on a machine with an NVIDIA GPU and driver, or use --dry.",
            file=sys.stderr,
        )
        sys.exit(2)
    if not r.ok:
        print(f"gpu_probe: cuInit(0) returned {r.name}", file=sys.stderr)
        sys.exit(2)
    Ctx.count = ok(d.cuDeviceGetCount).v
    Ctx.dev = ok(d.cuDeviceGet, 0).v
    if parent:  # the parent only reports; every case runs in a child process
        return {"result": r.name, "values": {"device_count": Ctx.count}, "note": "first cuInit(0)"}
    Ctx.ctx = ok(d.cuDevicePrimaryCtxRetain, Ctx.dev).v
    ok(d.cuCtxSetCurrent, Ctx.ctx)
    return {
        "result": "CUDA_SUCCESS",
        "values": {"device_count": Ctx.count},
        "note": "first cuInit(0)",
    }


def main(argv) -> int:
    global DRY, ISOLATED_CHILD
    args = list(argv[1:])
    if "--dry" in args:
        DRY = True
        args.remove("--dry")
    only = None
    if "--only" in args:
        i = args.index("--only")
        only = args[i + 1]
        del args[i : i + 2]
    if args and args[0] == "--child":
        ISOLATED_CHILD = True
        return child_main(json.loads(args[1]))
    if not args:
        print(__doc__)
        return 1
    out_path = args[0]
    results = {
        "_meta": {
            "dry": DRY,
            "python": sys.version.split()[0],
            "bindings": getattr(__import__("cuda.bindings").bindings, "__version__", "?"),
            "numpy": np.__version__,
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
    }
    t_all = time.perf_counter()
    results["A_first_cuInit"] = init_driver(parent=True)
    r = call(d.cuDeviceGetName, 256, Ctx.dev)
    results["_meta"]["device"] = jv(r.v).split("\x00")[0] if r.ok else r.name
    r = call(d.cuDriverGetVersion)
    results["_meta"]["driver_version"] = r.v
    names = [n for n, _, _ in CASES if not only or re.search(only, n)]
    isolated_set = {n for n, _, iso in CASES if iso}
    run_all(names, isolated_set, results, out_path, t_all)
    crashed = sorted(k for k, v in results.items() if isinstance(v, dict) and v.get("crashes"))
    if crashed:
        results["_meta"]["crashed_cases"] = crashed
    results["_meta"]["total_seconds"] = round(time.perf_counter() - t_all, 2)
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True, default=repr)
    print_table(results)
    return 0


def _short(x, n=60):
    if isinstance(x, dict):
        if "exception" in x:
            s = f"EXC {x['exception']}"
        else:
            s = ", ".join(f"{k}={_short(v, 30)}" for k, v in x.items())
    else:
        s = str(x)
    s = s.replace("CUDA_ERROR_", "E_").replace("CUDA_SUCCESS", "OK")
    return s if len(s) <= n else s[: n - 3] + "..."


def print_table(results):
    print("\n=== gpu_probe summary ===")
    for name, out in results.items():
        if name.startswith("_") or not isinstance(out, dict):
            continue
        res = out.get("result")
        if isinstance(res, dict) and "exception" not in res:
            print(
                f"{name} ({out.get('seconds', '')}s){' [isolated]' if out.get('isolated') else ''}"
            )
            for k, v in res.items():
                print(f"    {k:<58} {_short(v, 70)}")
        else:
            print(f"{name:<62} {_short(res, 70)}")
        if out.get("note"):
            print(f"    note: {_short(out['note'], 150)}")
    print("\n=== per-case result counts ===")
    for name, out in results.items():
        if name.startswith("_") or not isinstance(out, dict):
            continue
        res = out.get("result")
        vals = list(res.values()) if isinstance(res, dict) and "exception" not in res else [res]
        counts: dict = {}
        for v in vals:
            k = _short(v, 40)
            counts[k] = counts.get(k, 0) + 1
        print(
            f"{name:<34} {out.get('seconds', '')!s:>7}s  "
            + ", ".join(f"{k}x{n}" for k, n in counts.items())
        )
    print(f"total {results['_meta'].get('total_seconds')}s")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
