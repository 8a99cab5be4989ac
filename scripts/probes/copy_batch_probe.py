#!/usr/bin/env python3
"""Probe ``cuMemcpyBatchAsync`` on the real driver with raw ``cuda.bindings``.

Self-contained (numpy and cuda.bindings only). For each case it records the
``CUresult`` name of every step (``case -> {step: CUresult name}``; a Python
exception is ``{"exception": type, "message": ...}``) plus measured values,
so that the simulator (``cuda_memkit/sim/_copy_batch.py``) and the
conformance tests (``tests/conformance/test_copy_batch.py``) can follow the
H100 verbatim.

Groups run in child processes (a crash loses one group, recorded as
``{"crash": rc}``); the risky cases (null, freed and out-of-range pointers,
huge sizes) get one child each.

Usage::

    python3 scripts/probes/copy_batch_probe.py            # GPU; writes $OUT/copy_batch_probe.json
    python3 scripts/probes/copy_batch_probe.py --sim      # the CPU simulator (checks the script)
    python3 scripts/probes/copy_batch_probe.py --quick    # smaller timing rows

Total runtime on the H100: well under 3 minutes (mostly CUDA start-up of the
children and the 65536 x 4 KiB loop rows).
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np
from cuda.bindings import driver as cu  # types and enums (the simulator reuses them)

SIM = "--sim" in sys.argv
QUICK = "--quick" in sys.argv or SIM
if SIM:
    os.environ["CUDA_MEMKIT_BACKEND"] = "sim"
    from cuda_memkit.sim import driver as d
else:
    from cuda.bindings import driver as d

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
P = cu.CUdeviceptr
ORDER = cu.CUmemcpySrcAccessOrder
LT = cu.CUmemLocationType
STREAM, DURING, ANY = (ORDER.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
                       ORDER.CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL,
                       ORDER.CU_MEMCPY_SRC_ACCESS_ORDER_ANY)
OVERLAP = 1  # CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE


# -- call helpers --------------------------------------------------------------------


def rname(res: Any) -> Any:
    code = res[0]
    return getattr(code, "name", repr(code))


def exc(e: BaseException) -> dict[str, str]:
    return {"exception": type(e).__name__, "message": str(e)[:300]}


class Case:
    def __init__(self, name: str) -> None:
        self.name = name
        self.result: dict[str, Any] = {}
        self.values: dict[str, Any] = {}
        self.t0 = time.perf_counter()

    def step(self, label: str, fn: Any, *args: Any) -> Any:
        """Call; record the CUresult name (or exception); return the outputs or None."""
        base, k = label, 2
        while label in self.result:
            label = f"{base}#{k}"
            k += 1
        try:
            res = fn(*args)
        except Exception as e:  # the bindings' argument checks
            self.result[label] = exc(e)
            return None
        self.result[label] = rname(res)
        if int(res[0]) != 0:
            return None
        return res[1] if len(res) == 2 else res[1:] if len(res) > 2 else True

    def out(self) -> dict[str, Any]:
        return {"result": self.result, "values": self.values,
                "seconds": round(time.perf_counter() - self.t0, 3)}


def ok(fn: Any, *args: Any) -> Any:
    res = fn(*args)
    if int(res[0]) != 0:
        raise RuntimeError(f"setup call {getattr(fn, '__name__', fn)} failed: {rname(res)}")
    return res[1] if len(res) == 2 else res[1:] if len(res) > 2 else None


def init() -> None:
    ok(d.cuInit, 0)
    dev = ok(d.cuDeviceGet, 0)
    ctx = ok(d.cuDevicePrimaryCtxRetain, dev)
    ok(d.cuCtxSetCurrent, ctx)


def dalloc(n: int) -> int:
    return int(ok(d.cuMemAlloc, n))


def palloc(n: int) -> int:
    return int(ok(d.cuMemHostAlloc, n, 0))


def view(addr: int, n: int) -> np.ndarray:
    """numpy bytes over host-accessible memory."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(addr))


def attrs(order: Any = STREAM, flags: int = 0, src_hint: Any = None,
          dst_hint: Any = None) -> Any:
    a = cu.CUmemcpyAttributes()
    a.srcAccessOrder = order
    a.flags = flags
    if src_hint is not None:
        a.srcLocHint = src_hint
    if dst_hint is not None:
        a.dstLocHint = dst_hint
    return a


def loc(t: Any, i: int = 0) -> Any:
    m = cu.CUmemLocation()
    m.type = t
    m.id = i
    return m


def stream(flags: int = 1) -> int:
    return int(ok(d.cuStreamCreate, flags))


def readback(addr: int, n: int) -> np.ndarray:
    out = np.empty(n, np.uint8)
    ok(d.cuMemcpyDtoH, out, addr, n)
    return out


def fill(addr: int, n: int, seed: int) -> np.ndarray:
    """Write a pattern to device memory; return it."""
    pat = (np.arange(n, dtype=np.uint64) * 2654435761 + seed).astype(np.uint8)
    ok(d.cuMemcpyHtoD, addr, pat, n)
    return pat


def batch(dsts: list[int], srcs: list[int], sizes: list[int], s: int,
          at: list[Any] | None = None, idx: list[int] | None = None) -> Any:
    at = [attrs()] if at is None else at
    idx = [0] if idx is None else idx
    return (d.cuMemcpyBatchAsync, [P(x) for x in dsts], [P(x) for x in srcs], list(sizes),
            len(dsts), at, idx, len(at), s)


# -- group: argument forms, attributes, streams, sizes ---------------------------------


def group_forms() -> dict[str, Any]:
    init()
    c = Case("forms")
    dev = dalloc(8 * MiB)
    pin = palloc(8 * MiB)
    view(pin, 8 * MiB)[:] = np.arange(8 * MiB, dtype=np.uint64).astype(np.uint8)
    s = stream()
    dsts = [dev + i * MiB for i in range(4)]
    srcs = [pin + i * MiB for i in range(4)]
    sz = [MiB] * 4

    def run(label: str, *args: Any) -> Any:
        return c.step(label, *args)

    def sync(label: str = "sync") -> None:
        c.step(label, d.cuStreamSynchronize, s)

    fn, dl, sl, szl, n, at, ix, k, st = batch(dsts, srcs, sz, s)
    try:
        res = fn(dl, sl, szl, n, at, ix, k, st)
        c.values["returned_tuple_len"] = len(res)
        c.values["returned"] = [rname(res)] + [repr(x) for x in res[1:]]
    except Exception as e:
        c.values["returned"] = exc(e)
    sync()
    c.values["ok_data"] = bool((readback(dev, 4 * MiB) == view(pin, 4 * MiB)).all())
    run("ok 4 x 1MiB H2D, [STREAM], [0], 1, stream", *batch(dsts, srcs, sz, s))
    # argument forms
    run("count 0 (empty lists)", d.cuMemcpyBatchAsync, [], [], [], 0, [attrs()], [0], 1, s)
    run("count 0 (lists len 4)", d.cuMemcpyBatchAsync, dl, sl, szl, 0, [attrs()], [0], 1, s)
    run("count 0, numAttrs 0", d.cuMemcpyBatchAsync, [], [], [], 0, [], [], 0, s)
    run("count 2 (lists len 4)", d.cuMemcpyBatchAsync, dl, sl, szl, 2, [attrs()], [0], 1, s)
    run("count 5 (lists len 4)", d.cuMemcpyBatchAsync, dl, sl, szl, 5, [attrs()], [0], 1, s)
    run("sizes len 3, count 4", d.cuMemcpyBatchAsync, dl, sl, szl[:3], 4, [attrs()], [0], 1, s)
    run("ints instead of CUdeviceptr", d.cuMemcpyBatchAsync, dsts, srcs, szl, 4, [attrs()], [0],
        1, s)
    run("numpy ints in sizes", d.cuMemcpyBatchAsync, dl, sl, [np.uint64(MiB)] * 4, 4, [attrs()],
        [0], 1, s)
    run("tuples instead of lists", d.cuMemcpyBatchAsync, tuple(dl), tuple(sl), tuple(szl), 4,
        (attrs(),), (0,), 1, s)
    # CUdeviceptr objects that view a numpy array (_ptr=): the library's no-per-entry form
    slots_d = np.array(dsts, np.uint64)
    slots_s = np.array(srcs, np.uint64)
    vd = [P(_ptr=slots_d.ctypes.data + 8 * i) for i in range(4)]
    vs = [P(_ptr=slots_s.ctypes.data + 8 * i) for i in range(4)]
    ok(d.cuMemsetD8, dev, 0, 4 * MiB)
    slots_d[:] = slots_d[::-1].copy()  # rewrite the array after the views exist
    run("CUdeviceptr views (_ptr=) over numpy", d.cuMemcpyBatchAsync, vd, vs, szl, 4,
        [attrs()], [0], 1, s)
    sync()
    back = readback(dev, 4 * MiB).reshape(4, MiB)
    src = view(pin, 4 * MiB).reshape(4, MiB)
    c.values["views_follow_the_array"] = bool((back[::-1] == src).all())
    # attributes
    A = attrs
    run("numAttrs 0", d.cuMemcpyBatchAsync, dl, sl, szl, 4, [], [], 0, s)
    run("attrsIdxs [1]", d.cuMemcpyBatchAsync, dl, sl, szl, 4, [A()], [1], 1, s)
    run("attrsIdxs [0,2] (2 attrs)", d.cuMemcpyBatchAsync, dl, sl, szl, 4, [A(), A(ANY)], [0, 2],
        2, s)
    run("attrsIdxs [0,0]", d.cuMemcpyBatchAsync, dl, sl, szl, 4, [A(), A()], [0, 0], 2, s)
    run("attrsIdxs [0,3,1] (not increasing)", d.cuMemcpyBatchAsync, dl, sl, szl, 4,
        [A(), A(), A()], [0, 3, 1], 3, s)
    run("attrsIdxs [0,4] (== count)", d.cuMemcpyBatchAsync, dl, sl, szl, 4, [A(), A()], [0, 4],
        2, s)
    run("numAttrs 4 == count (per-copy attrs)", d.cuMemcpyBatchAsync, dl, sl, szl, 4,
        [A() for _ in range(4)], [0, 1, 2, 3], 4, s)
    run("numAttrs 5 > count 4", d.cuMemcpyBatchAsync, dl, sl, szl, 4, [A() for _ in range(5)],
        [0, 1, 2, 3, 4], 5, s)
    run("numAttrs 1 with 2 attrs listed", d.cuMemcpyBatchAsync, dl, sl, szl, 4, [A(), A()],
        [0, 2], 1, s)
    for label, order in (("INVALID", ORDER.CU_MEMCPY_SRC_ACCESS_ORDER_INVALID),
                         ("STREAM", STREAM), ("DURING_API_CALL", DURING), ("ANY", ANY),
                         ("MAX", ORDER.CU_MEMCPY_SRC_ACCESS_ORDER_MAX)):
        run(f"srcAccessOrder {label}", d.cuMemcpyBatchAsync, dl, sl, szl, 4, [A(order)], [0], 1,
            s)
    run("default CUmemcpyAttributes() (order unset)", d.cuMemcpyBatchAsync, dl, sl, szl, 4,
        [cu.CUmemcpyAttributes()], [0], 1, s)
    for flags in (1, 2, 0x80000000):
        run(f"flags {flags:#x}", d.cuMemcpyBatchAsync, dl, sl, szl, 4, [A(STREAM, flags)], [0],
            1, s)
    hints = {
        "DEVICE0": lambda: loc(LT.CU_MEM_LOCATION_TYPE_DEVICE, 0),
        "DEVICE7": lambda: loc(LT.CU_MEM_LOCATION_TYPE_DEVICE, 7),
        "HOST": lambda: loc(LT.CU_MEM_LOCATION_TYPE_HOST, 0),
        "HOST_NUMA0": lambda: loc(LT.CU_MEM_LOCATION_TYPE_HOST_NUMA, 0),
        "HOST_NUMA99": lambda: loc(LT.CU_MEM_LOCATION_TYPE_HOST_NUMA, 99),
        "HOST_NUMA_CURRENT": lambda: loc(LT.CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, 0),
        "MAX": lambda: loc(LT.CU_MEM_LOCATION_TYPE_MAX, 0),
    }
    for name, mk in hints.items():
        run(f"srcLocHint {name}", d.cuMemcpyBatchAsync, dl, sl, szl, 4,
            [A(STREAM, 0, mk(), None)], [0], 1, s)
        run(f"dstLocHint {name}", d.cuMemcpyBatchAsync, dl, sl, szl, 4,
            [A(STREAM, 0, None, mk())], [0], 1, s)
    # streams
    blocking = stream(0)
    for label, h in (("legacy NULL stream 0", 0), ("CU_STREAM_LEGACY (1)", 1),
                     ("CU_STREAM_PER_THREAD (2)", 2), ("blocking user stream", blocking),
                     ("non-blocking user stream", s)):
        run(f"stream: {label}", d.cuMemcpyBatchAsync, dl, sl, szl, 4, [A()], [0], 1, h)
    c.step("cuCtxSynchronize", d.cuCtxSynchronize)
    # sizes
    run("a size-0 entry", d.cuMemcpyBatchAsync, dl, sl, [MiB, 0, MiB, MiB], 4, [A()], [0], 1, s)
    run("all sizes 0", d.cuMemcpyBatchAsync, dl, sl, [0] * 4, 4, [A()], [0], 1, s)
    run("dst range past the end of its allocation", *batch([dev + 8 * MiB - 4096], [pin],
                                                           [8192], s))
    run("unaligned dst+1 src+3 size 1000", *batch([dev + 1], [pin + 3], [1000], s))
    # overlaps (the driver does not order copies within a batch)
    ok(d.cuMemsetD8, dev, 0, 8 * MiB)
    view(pin, 2 * MiB)[:MiB] = 1
    view(pin, 2 * MiB)[MiB:] = 2
    run("overlapping destinations (same 1 MiB twice)", *batch([dev, dev], [pin, pin + MiB],
                                                              [MiB, MiB], s))
    sync()
    c.values["overlap_winner_bytes"] = np.unique(readback(dev, MiB)).tolist()
    run("src of one copy = dst of another (D2D chain)", *batch([dev + MiB, dev + 2 * MiB],
                                                               [dev, dev + MiB], [MiB, MiB], s))
    run("the same copy twice", *batch([dev, dev], [pin, pin], [MiB, MiB], s))
    run("src and dst the same range (in place)", *batch([dev], [dev], [MiB], s))
    sync()
    c.step("cuStreamDestroy", d.cuStreamDestroy, blocking)
    c.step("cuStreamDestroy#2", d.cuStreamDestroy, s)
    ok(d.cuMemFree, dev)
    ok(d.cuMemFreeHost, pin)
    return c.out()


# -- group: data movement by kind, pageable memory, all-or-nothing ---------------------


def group_data() -> dict[str, Any]:
    init()
    c = Case("data")
    s = stream()
    n = 4 * MiB
    dev_a, dev_b = dalloc(n), dalloc(n)
    pin_a, pin_b = palloc(n), palloc(n)
    view(pin_a, n)[:] = (np.arange(n) % 251).astype(np.uint8)

    def check(label: str, dst_read: Any, expect: np.ndarray) -> None:
        c.values[f"data_ok: {label}"] = bool((dst_read() == expect).all())

    quarter = n // 4
    offs = [3, 0, 2, 1]  # block i goes to slot offs[i]

    def scattered(dst: int, src: int) -> tuple[list[int], list[int], list[int]]:
        return ([dst + o * quarter for o in offs], [src + i * quarter for i in range(4)],
                [quarter] * 4)

    src_pat = view(pin_a, n).reshape(4, quarter)
    want = np.empty_like(src_pat)
    for i, o in enumerate(offs):
        want[o] = src_pat[i]
    want = want.reshape(-1)
    # H2D, D2H, D2D, H2H (pinned)
    c.step("H2D pinned->device", *batch(*scattered(dev_a, pin_a), s))
    c.step("sync", d.cuStreamSynchronize, s)
    check("H2D", lambda: readback(dev_a, n), want)
    c.step("D2D device->device", *batch(*scattered(dev_b, dev_a), s))
    c.step("sync", d.cuStreamSynchronize, s)
    got_b = readback(dev_b, n).reshape(4, quarter)
    src_a = readback(dev_a, n).reshape(4, quarter)
    exp_b = np.empty_like(src_a)
    for i, o in enumerate(offs):
        exp_b[o] = src_a[i]
    c.values["data_ok: D2D"] = bool((got_b == exp_b).all())
    c.step("D2H device->pinned", *batch(*scattered(pin_b, dev_a), s))
    c.step("sync", d.cuStreamSynchronize, s)
    exp_h = np.empty_like(src_a)
    for i, o in enumerate(offs):
        exp_h[o] = src_a[i]
    c.values["data_ok: D2H"] = bool((view(pin_b, n).reshape(4, quarter) == exp_h).all())
    view(pin_b, n)[:] = 0
    c.step("H2H pinned->pinned", *batch([pin_b], [pin_a], [n], s))
    c.step("sync", d.cuStreamSynchronize, s)
    check("H2H pinned", lambda: view(pin_b, n), view(pin_a, n))
    # mixed directions in one batch: H2D + D2H + D2D, one attrs entry and one per copy
    ok(d.cuMemsetD8, dev_b, 0, n)
    view(pin_b, n)[:] = 0
    mixed = ([dev_b, pin_b + quarter, dev_b + 2 * quarter],
             [pin_a, dev_a + quarter, dev_a + 2 * quarter], [quarter] * 3)
    c.step("mixed H2D+D2H+D2D, 1 attrs", *batch(*mixed, s))
    c.step("sync", d.cuStreamSynchronize, s)
    c.values["data_ok: mixed"] = bool(
        (readback(dev_b, quarter) == view(pin_a, quarter)).all()
        and (view(pin_b + quarter, quarter) == readback(dev_a + quarter, quarter)).all()
        and (readback(dev_b + 2 * quarter, quarter)
             == readback(dev_a + 2 * quarter, quarter)).all())
    c.step("mixed H2D+D2H+D2D, 3 attrs", *batch(*mixed, s, [attrs(), attrs(), attrs()],
                                                [0, 1, 2]))
    c.step("sync", d.cuStreamSynchronize, s)
    # pageable host memory: each source access order, source and destination
    pg = np.arange(n, dtype=np.uint64).astype(np.uint8)
    pg_addr = pg.ctypes.data
    for label, order in (("STREAM", STREAM), ("DURING_API_CALL", DURING), ("ANY", ANY)):
        ok(d.cuMemsetD8, dev_b, 0, n)
        c.step(f"pageable src H2D, order {label}",
               *batch([dev_b + i * MiB for i in range(4)], [pg_addr + i * MiB for i in range(4)],
                      [MiB] * 4, s, [attrs(order)], [0]))
        c.step("sync", d.cuStreamSynchronize, s)
        c.values[f"data_ok: pageable src, {label}"] = bool((readback(dev_b, n) == pg).all())
        dst = np.zeros(n, np.uint8)
        c.step(f"pageable dst D2H, order {label}",
               *batch([dst.ctypes.data + i * MiB for i in range(4)],
                      [dev_b + i * MiB for i in range(4)], [MiB] * 4, s, [attrs(order)], [0]))
        c.step("sync", d.cuStreamSynchronize, s)
        c.values[f"data_ok: pageable dst, {label}"] = bool((dst == pg).all())
    # does the call return before the copy of a pageable source is done? (64 MiB)
    big = np.ones(64 * MiB, np.uint8)
    dev_big = dalloc(64 * MiB)
    for label, order in (("STREAM", STREAM), ("DURING_API_CALL", DURING), ("ANY", ANY)):
        fn, *args = batch([dev_big + i * MiB for i in range(64)],
                          [big.ctypes.data + i * MiB for i in range(64)], [MiB] * 64, s,
                          [attrs(order)], [0])
        ok(d.cuStreamSynchronize, s)
        t0 = time.perf_counter()
        r = fn(*args)
        t1 = time.perf_counter()
        ok(d.cuStreamSynchronize, s)
        t2 = time.perf_counter()
        c.result[f"pageable 64 MiB timing, order {label}"] = rname(r)
        c.values[f"pageable 64MiB {label}: call_ms, total_ms"] = [round((t1 - t0) * 1e3, 3),
                                                                 round((t2 - t0) * 1e3, 3)]
    ok(d.cuMemFree, dev_big)
    # registered host memory (cuMemHostRegister) as a source
    reg = np.arange(n, dtype=np.uint64).astype(np.uint8)
    reg[:] = reg[::-1]
    if c.step("cuMemHostRegister", d.cuMemHostRegister, reg.ctypes.data, n, 0) is not None:
        c.step("registered src H2D", *batch([dev_b], [reg.ctypes.data], [n], s))
        c.step("sync", d.cuStreamSynchronize, s)
        c.values["data_ok: registered src"] = bool((readback(dev_b, n) == reg).all())
        c.step("cuMemHostUnregister", d.cuMemHostUnregister, reg.ctypes.data)
    # managed memory, with and without location hints
    man = c.step("cuMemAllocManaged", d.cuMemAllocManaged, n, 1)
    if man is not None:
        man = int(man)
        view(man, n)[:] = 7
        dev0 = loc(LT.CU_MEM_LOCATION_TYPE_DEVICE, 0)
        host = loc(LT.CU_MEM_LOCATION_TYPE_HOST, 0)
        c.step("managed src -> device", *batch([dev_b], [man], [n], s))
        c.step("managed src -> device, srcLocHint HOST", *batch([dev_b], [man], [n], s,
                                                               [attrs(STREAM, 0, host)], [0]))
        c.step("device -> managed dst, dstLocHint DEVICE0",
               *batch([man], [dev_a], [n], s, [attrs(STREAM, 0, None, dev0)], [0]))
        c.step("sync", d.cuStreamSynchronize, s)
        c.values["data_ok: device->managed"] = bool((view(man, n) == readback(dev_a, n)).all())
        ok(d.cuMemFree, man)
    # all or nothing: 4 copies, the third past the end of its allocation
    ok(d.cuMemsetD8, dev_b, 0, n)
    fn, dl, sl, szl, cnt, at, ix, k, st = batch(
        [dev_b, dev_b + MiB, dev_b + n - 4096, dev_b + 2 * MiB],
        [pin_a, pin_a + MiB, pin_a, pin_a + 2 * MiB], [MiB, MiB, MiB, MiB], s)
    c.step("4 copies, the third past the end", fn, dl, sl, szl, cnt, at, ix, k, st)
    c.step("sync", d.cuStreamSynchronize, s)
    got = readback(dev_b, 3 * MiB).reshape(3, MiB)
    c.values["after failed batch: copies 0,1,3 landed"] = [
        bool((got[0] == view(pin_a, MiB)).all()),
        bool((got[1] == view(pin_a + MiB, MiB)).all()),
        bool((got[2] == view(pin_a + 2 * MiB, MiB)).all())]
    c.step("cuStreamDestroy", d.cuStreamDestroy, s)
    for p in (dev_a, dev_b):
        ok(d.cuMemFree, p)
    for p in (pin_a, pin_b):
        ok(d.cuMemFreeHost, p)
    return c.out()


# -- risky cases: one child each ----------------------------------------------------------


def _risky(label: str, make: Any) -> dict[str, Any]:
    init()
    c = Case(label)
    s = stream()
    dev = dalloc(4 * MiB)
    pin = palloc(4 * MiB)
    c.step(label, *make(dev, pin, s))
    c.step("cuStreamSynchronize#after", d.cuStreamSynchronize, s)
    c.step("cuCtxSynchronize#after", d.cuCtxSynchronize)
    p = c.step("cuMemAlloc#after", d.cuMemAlloc, MiB)
    if p is not None:
        ok(d.cuMemFree, p)
    return c.out()


def _freed(dev: int, pin: int, s: int) -> Any:
    q = dalloc(MiB)
    ok(d.cuMemFree, q)
    return batch([q], [pin], [MiB], s)


RISKY: dict[str, Any] = {
    "null dst pointer": lambda dev, pin, s: batch([0], [pin], [4096], s),
    "null src pointer": lambda dev, pin, s: batch([dev], [0], [4096], s),
    "freed device pointer as dst": _freed,
    "pinned src range past its end": lambda dev, pin, s: batch([dev], [pin + 4 * MiB - 4096],
                                                               [8192], s),
    "size 1<<40 device->device": lambda dev, pin, s: batch([dev], [dev + MiB], [1 << 40], s),
    "unknown address in the device window as src": lambda dev, pin, s: batch(
        [dev], [dev + 64 * GiB], [4096], s),
}


def group_big_count() -> dict[str, Any]:
    init()
    c = Case("big count")
    s = stream()
    for count, size in ((65536, 64), (262144, 64)):
        src, dst = dalloc(count * size), dalloc(count * size)
        rng = np.random.default_rng(1)
        perm = rng.permutation(count)
        fn, *args = batch((dst + perm * size).tolist(), (src + np.arange(count) * size).tolist(),
                          [size] * count, s)
        t0 = time.perf_counter()
        c.step(f"count {count} x {size} B D2D", fn, *args)
        c.step("sync", d.cuStreamSynchronize, s)
        c.values[f"count {count} x {size} B D2D: seconds"] = round(time.perf_counter() - t0, 4)
        ok(d.cuMemFree, src)
        ok(d.cuMemFree, dst)
    c.step("cuStreamDestroy", d.cuStreamDestroy, s)
    return c.out()


# -- timing ---------------------------------------------------------------------------------


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def _time_shape(c: Case, n: int, b: int, bufs: tuple[int, ...], s: int, s2: int, reps: int,
                rng: Any, first: bool) -> dict[str, float]:
    """GB/s of every variant for n blocks of b bytes (interleaved samples, medians)."""
    hostA, hostB, devA, devB, devC = bufs
    rows: dict[str, float] = {}
    a_stream, a_any = [attrs(STREAM)], [attrs(ANY)]
    a_overlap = [attrs(STREAM, OVERLAP)]
    nbytes = n * b
    perm = rng.permutation(n)
    dps = (devA + perm * b).tolist()
    hps = (hostA + np.arange(n) * b).tolist()
    dl, hl, szl = [P(x) for x in dps], [P(x) for x in hps], [b] * n
    dst_d2h = (hostB + perm * b).tolist()
    src_d2h = (devB + np.arange(n) * b).tolist()
    dl2, sl2 = [P(x) for x in dst_d2h], [P(x) for x in src_d2h]
    dl3 = [P(x) for x in (devC + perm * b).tolist()]
    per_copy = [attrs(STREAM) for _ in range(n)]
    per_idx = list(range(n))
    tag = f"{n}x{b // KiB}KiB"
    h2d = d.cuMemcpyHtoDAsync
    d2h = d.cuMemcpyDtoHAsync
    bat = d.cuMemcpyBatchAsync

    def loop_h2d() -> None:
        for x, y in zip(dps, hps, strict=True):
            if h2d(x, y, b, s)[0]:
                raise RuntimeError("loop copy failed")

    def loop_d2h() -> None:
        for x, y in zip(dst_d2h, src_d2h, strict=True):
            if d2h(x, y, b, s)[0]:
                raise RuntimeError("loop copy failed")

    def one(fn: Any, *args: Any) -> Any:
        def go() -> None:
            r = fn(*args)
            if int(r[0]):
                raise RuntimeError(f"{fn.__name__}: {rname(r)}")
        return go

    def chunked(k: int, ats: list[Any]) -> Any:
        step = n // k

        def go() -> None:
            for j in range(0, n, step):
                r = bat(dl[j:j + step], hl[j:j + step], szl[j:j + step], step, ats, [0], 1, s)
                if int(r[0]):
                    raise RuntimeError(rname(r))
        return go

    def build_and_batch() -> None:  # lists of new CUdeviceptr objects from arrays
        r = bat(list(map(P, (devA + perm * b).tolist())),
                list(map(P, (hostA + np.arange(n) * b).tolist())), [b] * n, n, a_stream,
                [0], 1, s)
        if int(r[0]):
            raise RuntimeError(rname(r))

    variants: dict[str, Any] = {
        f"H2D {tag} contiguous": one(h2d, devA, hostA, nbytes, s),
        f"H2D {tag} loop cuMemcpyHtoDAsync": loop_h2d,
        f"H2D {tag} batch prebuilt [STREAM]": one(bat, dl, hl, szl, n, a_stream, [0], 1, s),
        f"H2D {tag} batch built from arrays": build_and_batch,
        f"H2D {tag} batch [ANY]": one(bat, dl, hl, szl, n, a_any, [0], 1, s),
        f"H2D {tag} batch [PREFER_OVERLAP]": one(bat, dl, hl, szl, n, a_overlap, [0], 1, s),
        f"H2D {tag} batch per-copy attrs": one(bat, dl, hl, szl, n, per_copy, per_idx, n, s),
        f"D2H {tag} contiguous": one(d2h, hostB, devB, nbytes, s),
        f"D2H {tag} loop cuMemcpyDtoHAsync": loop_d2h,
        f"D2H {tag} batch prebuilt": one(bat, dl2, sl2, szl, n, a_stream, [0], 1, s),
        f"D2D {tag} batch (device scatter)": one(bat, dl3, [P(x) for x in src_d2h], szl, n,
                                                 a_stream, [0], 1, s),
    }
    if n >= 1024:
        for k in (2, 4, 8, 16):
            variants[f"H2D {tag} batch in {k} calls"] = chunked(k, a_stream)
    if first:
        def duplex_one() -> None:
            r = bat(dl + dl2, hl + sl2, szl + szl, 2 * n, [attrs(), attrs()], [0, n], 2, s)
            if int(r[0]):
                raise RuntimeError(rname(r))

        def duplex_two_streams() -> None:
            for lst_d, lst_s, st in ((dl, hl, s), (dl2, sl2, s2)):
                r = bat(lst_d, lst_s, szl, n, a_stream, [0], 1, st)
                if int(r[0]):
                    raise RuntimeError(rname(r))
            ok(d.cuStreamSynchronize, s2)

        def duplex_same_stream() -> None:
            for lst_d, lst_s in ((dl, hl), (dl2, sl2)):
                r = bat(lst_d, lst_s, szl, n, a_stream, [0], 1, s)
                if int(r[0]):
                    raise RuntimeError(rname(r))

        variants[f"H2D+D2H {tag} one batch (2 attrs)"] = duplex_one
        variants[f"H2D+D2H {tag} two batches, one stream"] = duplex_same_stream
        variants[f"H2D+D2H {tag} two batches, two streams"] = duplex_two_streams
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for fn in variants.values():  # warm-up
        fn()
        ok(d.cuStreamSynchronize, s)
    for _ in range(reps):
        for k, fn in variants.items():  # interleaved
            ok(d.cuStreamSynchronize, s)
            t0 = time.perf_counter()
            fn()
            ok(d.cuStreamSynchronize, s)
            samples[k].append(time.perf_counter() - t0)
    for k, xs in samples.items():
        moved = 2 * nbytes if k.startswith("H2D+D2H") else nbytes
        rows[k] = round(moved / _median(xs) / 1e9, 3)
    # host-side cost of building the pointer lists, 2 x n entries
    addrs = devA + perm * b
    slots = np.zeros(n, np.uint64)
    views = [P(_ptr=slots.ctypes.data + 8 * i) for i in range(n)]
    t_obj, t_view = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        _ = list(map(P, addrs.tolist())), list(map(P, addrs.tolist()))
        t_obj.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        slots[:] = addrs
        _ = views[:n], views[:n]
        t_view.append(time.perf_counter() - t0)
    c.values[f"build 2x{n} CUdeviceptr objects: us"] = round(_median(t_obj) * 1e6, 1)
    c.values[f"write 2x{n} CUdeviceptr views: us"] = round(_median(t_view) * 1e6, 1)
    return rows


def group_timing() -> dict[str, Any]:
    init()
    c = Case("timing")
    s, s2 = stream(), stream()
    reps = 3 if QUICK else 5
    rng = np.random.default_rng(0)
    total = (16 if QUICK else 256) * MiB
    hostA, hostB = palloc(total), palloc(total)
    devA, devB, devC = dalloc(total), dalloc(total), dalloc(total)
    view(hostA, total)[:] = 1
    rows: dict[str, float] = {}
    shapes = [(4096, 64 * KiB), (1024, 256 * KiB), (65536, 4 * KiB)]
    if QUICK:
        shapes = [(n * total // (256 * MiB), b) for n, b in shapes]
    bufs = (hostA, hostB, devA, devB, devC)
    for i, (n, b) in enumerate(shapes):
        rows.update(_time_shape(c, n, b, bufs, s, s2, reps, rng, i == 0))
    c.values["GB/s"] = rows
    for p in (hostA, hostB):
        ok(d.cuMemFreeHost, p)
    for p in (devA, devB, devC):
        ok(d.cuMemFree, p)
    ok(d.cuStreamDestroy, s)
    ok(d.cuStreamDestroy, s2)
    return c.out()


GROUPS: dict[str, Any] = {"forms": group_forms, "data": group_data, "big_count": group_big_count,
                          "timing": group_timing}
for _label, _make in RISKY.items():
    GROUPS[f"risky: {_label}"] = (lambda lab, mk: lambda: _risky(lab, mk))(_label, _make)

TIMEOUTS = {"timing": 150, "big_count": 60}


def child(name: str) -> None:
    try:
        out = GROUPS[name]()
    except Exception as e:  # a setup failure: report it, do not lose the group silently
        import traceback

        out = {"error": exc(e), "traceback": traceback.format_exc()[-2000:]}
    print("@@JSON " + json.dumps(out), flush=True)


def meta() -> dict[str, Any]:
    info: dict[str, Any] = {"sim": SIM, "quick": QUICK, "python": sys.version.split()[0],
                            "numpy": np.__version__, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        import cuda.bindings

        info["bindings"] = cuda.bindings.__version__
    except Exception:
        pass
    try:
        init()
        info["driver_version"] = ok(d.cuDriverGetVersion)
        name = ok(d.cuDeviceGetName, 256, ok(d.cuDeviceGet, 0))
        info["device"] = name.split(b"\0")[0].decode()
        info["has_cuMemcpyBatchAsync"] = hasattr(d, "cuMemcpyBatchAsync")
    except Exception as e:
        info["init_error"] = exc(e)
    return info


def main() -> int:
    if "--child" in sys.argv:
        child(sys.argv[sys.argv.index("--child") + 1])
        return 0
    t_start = time.perf_counter()
    results: dict[str, Any] = {"_meta": meta()}
    extra = [a for a in ("--sim", "--quick") if a in sys.argv]
    for name in GROUPS:
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, __file__, "--child", name, *extra],
                                  capture_output=True, text=True,
                                  timeout=TIMEOUTS.get(name, 40))
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("@@JSON ")), None)
            if line is None:
                results[name] = {"crash": proc.returncode, "stderr": proc.stderr[-1500:]}
            else:
                results[name] = json.loads(line[7:])
        except subprocess.TimeoutExpired:
            results[name] = {"crash": "timeout"}
        print(f"  {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    results["_meta"]["total_seconds"] = round(time.perf_counter() - t_start, 1)
    report(results)
    out_dir = os.environ.get("OUT")
    path = os.path.join(out_dir, "copy_batch_probe.json") if out_dir else "copy_batch_probe.json"
    with open(path, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    print(f"wrote {path}")
    return 0


def report(results: dict[str, Any]) -> None:
    print(json.dumps(results["_meta"]))
    for name, rec in results.items():
        if name.startswith("_"):
            continue
        print(f"\n== {name}")
        if "result" not in rec:
            print("   ", json.dumps(rec)[:800])
            continue
        for step, res in rec["result"].items():
            print(f"   {step:60s} {res if isinstance(res, str) else json.dumps(res)[:120]}")
        for k, v in rec["values"].items():
            if k == "GB/s":
                continue
            print(f"   = {k}: {v}")
    timing = results.get("timing", {}).get("values", {}).get("GB/s", {})
    if timing:
        print("\n== timing (GB/s, median of interleaved samples; wall clock incl. the call)")
        for k, v in timing.items():
            print(f"   {k:60s} {v:8.2f}")


if __name__ == "__main__":
    sys.exit(main())
