#!/usr/bin/env python3
"""Tune a pinned-staging pipeline for pageable numpy <-> device copies (raw cuda.bindings).

Self-contained (numpy, threads and cuda.bindings; torch and CuPy as peers when
importable), independent of cuda_memkit, so its numbers choose the library's
defaults in ``cuda_memkit/_transfer/_staging.py``.

The pipeline, per direction (1 GiB by default):

* H2D: worker threads copy chunks of the pageable source into pinned staging
  buffers (numpy releases the GIL); the main thread issues
  ``cuMemcpyHtoDAsync`` of each filled buffer on one of S blocking streams
  and records the buffer's event; a buffer is refilled after its event.
* D2H: the main thread issues ``cuMemcpyDtoHAsync`` into a free buffer and
  records its event; a worker waits for the event and copies the buffer into
  the pageable destination; the buffer is reused once drained.

Grid: chunk size {1, 2, 4, 8, 16, 32} MiB x threads {1, 2, 4, 8} x buffers
(threads + {1, 2, 4}) on 2 streams; then 1-4 streams at the best point; then
the best points interleaved with the peers (driver pageable path,
register+copy+unregister, torch ``pin_memory().to()`` / ``.cpu()``, CuPy
``asarray`` / ``asnumpy``), host memcpy ceilings, fresh (unfaulted)
destinations, and the cost of getting the staging memory
(``cuMemHostAlloc`` vs a pinned memory pool).

Usage::

    python3 scripts/probes/staging_probe.py                # GPU; $OUT/staging_probe.json
    python3 scripts/probes/staging_probe.py --size 256     # MiB per transfer
    python3 scripts/probes/staging_probe.py --sim          # the CPU simulator (checks the script)

About 2-3 minutes on the H100.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import statistics
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
from cuda.bindings import driver as cu  # types and enums (the simulator reuses them)

SIM = "--sim" in sys.argv
if SIM:
    os.environ["CUDA_MEMKIT_BACKEND"] = "sim"
    from cuda_memkit.sim import driver as d
else:
    from cuda.bindings import driver as d

MiB, GiB = 1 << 20, 1 << 30
SIZE = (int(sys.argv[sys.argv.index("--size") + 1]) * MiB if "--size" in sys.argv
        else 32 * MiB if SIM else GiB)
CHUNKS = [1, 2, 4, 8, 16, 32]
THREADS = [1, 2, 4, 8]
EXTRA = [1, 2, 4]
REPS_GRID = 1 if SIM else 2
REPS_FINAL = 2 if SIM else 5
EVENT_DISABLE_TIMING = 2


def ok(fn: Any, *args: Any) -> Any:
    res = fn(*args)
    if int(res[0]) != 0:
        raise RuntimeError(f"{getattr(fn, '__name__', fn)} failed: {res[0]!r}")
    return res[1] if len(res) == 2 else res[1:] if len(res) > 2 else None


def view(addr: int, n: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(addr))


class Rig:
    """Device memory, a pinned arena, streams, events and the pageable arrays."""

    def __init__(self) -> None:
        ok(d.cuInit, 0)
        self.ctx = ok(d.cuDevicePrimaryCtxRetain, ok(d.cuDeviceGet, 0))
        ok(d.cuCtxSetCurrent, self.ctx)
        self.dev = int(ok(d.cuMemAlloc, SIZE))
        self.arena_size = (max(THREADS) + max(EXTRA)) * max(CHUNKS) * MiB
        self.arena = int(ok(d.cuMemHostAlloc, self.arena_size, 0))
        self.streams = [int(ok(d.cuStreamCreate, 0)) for _ in range(4)]  # blocking streams
        self.events = [ok(d.cuEventCreate, EVENT_DISABLE_TIMING)
                       for _ in range(max(THREADS) + max(EXTRA))]
        self.src = np.empty(SIZE, np.uint8)
        self.src[:] = (np.arange(SIZE // 8, dtype=np.uint64) * 0x9E3779B97F4A7C15).view(np.uint8)
        self.dst = np.zeros(SIZE, np.uint8)  # pre-faulted
        self.pools: dict[int, ThreadPoolExecutor] = {}

    def pool(self, threads: int) -> ThreadPoolExecutor:
        p = self.pools.get(threads)
        if p is None:
            ctx = self.ctx
            p = self.pools[threads] = ThreadPoolExecutor(
                threads, initializer=lambda: ok(d.cuCtxSetCurrent, ctx))
        return p

    def buffers(self, n: int, chunk: int) -> list[np.ndarray]:
        return [view(self.arena + i * chunk, chunk) for i in range(n)]

    def close(self) -> None:
        for p in self.pools.values():
            p.shutdown()
        for ev in self.events:
            ok(d.cuEventDestroy, ev)
        for s in self.streams:
            ok(d.cuStreamDestroy, s)
        ok(d.cuMemFreeHost, self.arena)
        ok(d.cuMemFree, self.dev)


def h2d(rig: Rig, src: np.ndarray, chunk: int, threads: int, nbuf: int, nstreams: int) -> None:
    """Pageable src -> rig.dev through the staging pipeline (complete on return)."""
    bufs = rig.buffers(nbuf, chunk)
    evs = rig.events[:nbuf]
    streams = rig.streams[:nstreams]
    pool = rig.pool(threads)
    n = src.nbytes
    nchunks = -(-n // chunk)
    used = [False] * nbuf

    def fill(i: int, b: int, wait: bool) -> None:
        if wait:
            ok(d.cuEventSynchronize, evs[b])
        lo = i * chunk
        k = min(chunk, n - lo)
        np.copyto(bufs[b][:k], src[lo:lo + k])

    futs: list[Future[None]] = []
    issued = 0

    def issue(j: int) -> None:
        futs[j].result()
        b = j % nbuf
        lo = j * chunk
        k = min(chunk, n - lo)
        s = streams[j % nstreams]
        ok(d.cuMemcpyHtoDAsync, rig.dev + lo, rig.arena + b * chunk, k, s)
        ok(d.cuEventRecord, evs[b], s)

    for i in range(nchunks):
        b = i % nbuf
        if i >= nbuf:
            while issued <= i - nbuf:
                issue(issued)
                issued += 1
        futs.append(pool.submit(fill, i, b, used[b]))
        used[b] = True
    while issued < nchunks:
        issue(issued)
        issued += 1
    for s in streams:
        ok(d.cuStreamSynchronize, s)


def d2h(rig: Rig, dst: np.ndarray, chunk: int, threads: int, nbuf: int, nstreams: int) -> None:
    """rig.dev -> pageable dst through the staging pipeline (complete on return)."""
    bufs = rig.buffers(nbuf, chunk)
    evs = rig.events[:nbuf]
    streams = rig.streams[:nstreams]
    pool = rig.pool(threads)
    n = dst.nbytes
    nchunks = -(-n // chunk)

    def drain(i: int, b: int) -> None:
        ok(d.cuEventSynchronize, evs[b])
        lo = i * chunk
        k = min(chunk, n - lo)
        np.copyto(dst[lo:lo + k], bufs[b][:k])

    futs: list[Future[None]] = []
    for i in range(nchunks):
        b = i % nbuf
        if i >= nbuf:
            futs[i - nbuf].result()
        lo = i * chunk
        k = min(chunk, n - lo)
        s = streams[i % nstreams]
        ok(d.cuMemcpyDtoHAsync, rig.arena + b * chunk, rig.dev + lo, k, s)
        ok(d.cuEventRecord, evs[b], s)
        futs.append(pool.submit(drain, i, b))
    for f in futs:
        f.result()


def timed(fn: Any, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def gbps(ts: list[float], n: int = SIZE) -> float:
    return round(n / statistics.median(ts) / 1e9, 2)


# -- peers ----------------------------------------------------------------------------


def peers(rig: Rig) -> dict[str, Any]:
    """Name -> zero-argument function doing one complete 1-transfer of SIZE bytes."""
    src, dst, dev = rig.src, rig.dst, rig.dev
    out: dict[str, Any] = {
        "H2D driver pageable cuMemcpyHtoD": lambda: ok(d.cuMemcpyHtoD, dev, src, SIZE),
        "D2H driver pageable cuMemcpyDtoH": lambda: ok(d.cuMemcpyDtoH, dst, dev, SIZE),
    }

    def reg(arr: np.ndarray, h2d_dir: bool) -> Any:
        def go() -> None:
            ok(d.cuMemHostRegister, arr.ctypes.data, SIZE, 0)
            try:
                if h2d_dir:
                    ok(d.cuMemcpyHtoD, dev, arr, SIZE)
                else:
                    ok(d.cuMemcpyDtoH, arr, dev, SIZE)
            finally:
                ok(d.cuMemHostUnregister, arr.ctypes.data)
        return go

    out["H2D register+copy+unregister"] = reg(src, True)
    out["D2H register+copy+unregister"] = reg(dst, False)
    if SIM:
        return out
    try:
        import torch

        if torch.cuda.is_available():
            tdev = torch.empty(SIZE, dtype=torch.uint8, device="cuda")

            def t_pin_to() -> None:
                x = torch.from_numpy(src).pin_memory().to("cuda")
                torch.cuda.synchronize()
                del x

            def t_to() -> None:
                x = torch.from_numpy(src).to("cuda")
                torch.cuda.synchronize()
                del x

            def t_cpu_into() -> None:
                torch.from_numpy(dst).copy_(tdev)

            def t_cpu() -> None:
                tdev.cpu()

            out["H2D torch pin_memory().to()"] = t_pin_to
            out["H2D torch .to('cuda') (pageable)"] = t_to
            out["D2H torch from_numpy(dst).copy_(t)"] = t_cpu_into
            out["D2H torch .cpu() (fresh memory)"] = t_cpu
    except ImportError:
        pass
    try:
        import cupy

        cdev = cupy.empty(SIZE, dtype=cupy.uint8)

        def c_asarray() -> None:
            x = cupy.asarray(src)
            cupy.cuda.runtime.deviceSynchronize()
            del x

        out["H2D cupy.asarray"] = c_asarray
        out["D2H cupy get(out=dst)"] = lambda: cdev.get(out=dst)
        out["D2H cupy.asnumpy (fresh memory)"] = lambda: cupy.asnumpy(cdev)
    except ImportError:
        pass
    return out


def host_ceiling(rig: Rig) -> dict[str, float]:
    """Host memcpy pageable <-> pinned with T threads (the fill/drain stage alone)."""
    out = {}
    chunk = 8 * MiB
    bufs = rig.buffers(max(THREADS), chunk)
    nchunks = SIZE // chunk

    def fill(t: int, i: int) -> None:
        np.copyto(bufs[i % t], rig.src[i * chunk:(i + 1) * chunk])

    def drain(t: int, i: int) -> None:
        np.copyto(rig.dst[i * chunk:(i + 1) * chunk], bufs[i % t])

    def run(fn: Any, t: int) -> None:
        list(rig.pool(t).map(functools.partial(fn, t), range(nchunks)))

    for t in THREADS:
        for name, fn in (("pageable->pinned", fill), ("pinned->pageable", drain)):
            ts = timed(functools.partial(run, fn, t), REPS_GRID + 1)
            out[f"host memcpy {name}, {t} threads"] = gbps(ts)
    return out


def alloc_costs() -> dict[str, Any]:
    """Milliseconds to get (and give back) staging memory: cuMemHostAlloc vs a pinned pool."""
    out: dict[str, Any] = {}
    for chunk_mib, count in ((8, 8), (32, 12)):
        n = chunk_mib * MiB
        t0 = time.perf_counter()
        ptrs = [int(ok(d.cuMemHostAlloc, n, 0)) for _ in range(count)]
        t1 = time.perf_counter()
        for p in ptrs:
            ok(d.cuMemFreeHost, p)
        t2 = time.perf_counter()
        out[f"cuMemHostAlloc {count} x {chunk_mib} MiB: alloc_ms, free_ms"] = [
            round((t1 - t0) * 1e3, 2), round((t2 - t1) * 1e3, 2)]
    try:
        props = cu.CUmemPoolProps()
        props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST
        props.location.id = 0
        pool = ok(d.cuMemPoolCreate, props)
        s = int(ok(d.cuStreamCreate, 1))
        thr = cu.cuuint64_t(1 << 40)
        ok(d.cuMemPoolSetAttribute, pool,
           cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, thr)
        for rnd in ("first", "second"):
            t0 = time.perf_counter()
            ptrs = [int(ok(d.cuMemAllocFromPoolAsync, 8 * MiB, pool, s)) for _ in range(8)]
            ok(d.cuStreamSynchronize, s)
            t1 = time.perf_counter()
            for p in ptrs:
                ok(d.cuMemFreeAsync, p, s)
            ok(d.cuStreamSynchronize, s)
            out[f"pinned pool 8 x 8 MiB ({rnd} round): alloc_ms"] = round((t1 - t0) * 1e3, 2)
        ok(d.cuMemPoolDestroy, pool)
        ok(d.cuStreamDestroy, s)
    except Exception as e:  # a driver without host pools: say so
        out["pinned pool"] = f"{type(e).__name__}: {e}"[:200]
    return out


def main() -> int:
    t_start = time.perf_counter()
    rig = Rig()
    result: dict[str, Any] = {"_meta": {"size": SIZE, "sim": SIM, "python": sys.version.split()[0],
                                        "numpy": np.__version__, "cpus": os.cpu_count(),
                                        "started": time.strftime("%Y-%m-%d %H:%M:%S")}}
    # correctness of both pipelines once
    h2d(rig, rig.src, 8 * MiB, 4, 6, 2)
    back = np.empty(SIZE, np.uint8)
    ok(d.cuMemcpyDtoH, back, rig.dev, SIZE)
    rig.dst[:] = 0
    d2h(rig, rig.dst, 8 * MiB, 4, 6, 2)
    result["_meta"]["h2d_correct"] = bool((back == rig.src).all())
    result["_meta"]["d2h_correct"] = bool((rig.dst == rig.src).all())
    # the grid (2 streams)
    grid: dict[str, float] = {}
    for chunk in CHUNKS:
        for t in THREADS:
            for extra in EXTRA:
                nbuf = t + extra
                c = chunk * MiB
                if SIZE // c < 2:
                    continue
                key = f"chunk {chunk} MiB, {t} threads, {nbuf} buffers, 2 streams"
                grid["H2D " + key] = gbps(timed(
                    functools.partial(h2d, rig, rig.src, c, t, nbuf, 2), REPS_GRID))
                grid["D2H " + key] = gbps(timed(
                    functools.partial(d2h, rig, rig.dst, c, t, nbuf, 2), REPS_GRID))
    result["grid GB/s"] = grid
    best: dict[str, tuple[int, int, int]] = {}
    for direction in ("H2D", "D2H"):
        k = max((k for k in grid if k.startswith(direction)), key=grid.__getitem__)
        parts = k.split(", ")
        best[direction] = (int(parts[0].split()[2]), int(parts[1].split()[0]),
                           int(parts[2].split()[0]))
    result["best"] = {k: {"chunk_mib": v[0], "threads": v[1], "buffers": v[2]}
                      for k, v in best.items()}
    streams: dict[str, float] = {}
    for direction, (chunk, t, nbuf) in best.items():
        fn = h2d if direction == "H2D" else d2h
        arr = rig.src if direction == "H2D" else rig.dst
        for ns in (1, 2, 3, 4):
            streams[f"{direction} best point, {ns} streams"] = gbps(timed(
                lambda fn=fn, arr=arr, chunk=chunk, t=t, nbuf=nbuf, ns=ns: fn(
                    rig, arr, chunk * MiB, t, nbuf, ns), REPS_GRID))
    result["streams GB/s"] = streams
    # the best points, interleaved with the peers
    final = dict(peers(rig))
    bc, bt, bb = best["H2D"]
    final[f"H2D staged (chunk {bc} MiB, {bt} threads, {bb} buffers)"] = (
        lambda: h2d(rig, rig.src, bc * MiB, bt, bb, 2))
    dc, dt, db = best["D2H"]
    final[f"D2H staged (chunk {dc} MiB, {dt} threads, {db} buffers)"] = (
        lambda: d2h(rig, rig.dst, dc * MiB, dt, db, 2))
    final[f"D2H staged into fresh np.empty (chunk {dc} MiB, {dt} threads)"] = (
        lambda: d2h(rig, np.empty(SIZE, np.uint8), dc * MiB, dt, db, 2))
    final["H2D staged, provisional default (8 MiB, 4 threads, 6 buffers)"] = (
        lambda: h2d(rig, rig.src, 8 * MiB, 4, 6, 2))
    final["D2H staged, provisional default (8 MiB, 4 threads, 6 buffers)"] = (
        lambda: d2h(rig, rig.dst, 8 * MiB, 4, 6, 2))
    samples: dict[str, list[float]] = {k: [] for k in final}
    for fn in final.values():
        fn()  # warm-up
    for _ in range(REPS_FINAL):
        for k, fn in final.items():
            samples[k] += timed(fn, 1)
    result["final GB/s"] = {k: gbps(v) for k, v in samples.items()}
    result["host memcpy GB/s"] = host_ceiling(rig)
    result["staging memory"] = alloc_costs()
    # a smaller transfer: where staging stops paying (threshold)
    small: dict[str, float] = {}
    for mib in (4, 16, 64):
        n = mib * MiB
        if n > SIZE:
            continue
        s_arr, d_arr = rig.src[:n], rig.dst[:n]
        small[f"{mib} MiB H2D driver pageable"] = gbps(timed(
            lambda n=n, s_arr=s_arr: ok(d.cuMemcpyHtoD, rig.dev, s_arr, n), 5), n)
        small[f"{mib} MiB H2D staged 2 MiB x 4 threads"] = gbps(timed(
            lambda s_arr=s_arr: h2d(rig, s_arr, 2 * MiB, 4, 6, 2), 5), n)
        small[f"{mib} MiB D2H driver pageable"] = gbps(timed(
            lambda n=n, d_arr=d_arr: ok(d.cuMemcpyDtoH, d_arr, rig.dev, n), 5), n)
        small[f"{mib} MiB D2H staged 2 MiB x 4 threads"] = gbps(timed(
            lambda d_arr=d_arr: d2h(rig, d_arr, 2 * MiB, 4, 6, 2), 5), n)
    result["small transfers GB/s"] = small
    rig.close()
    result["_meta"]["total_seconds"] = round(time.perf_counter() - t_start, 1)
    report(result)
    out_dir = os.environ.get("OUT")
    path = os.path.join(out_dir, "staging_probe.json") if out_dir else "staging_probe.json"
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {path}")
    return 0


def report(result: dict[str, Any]) -> None:
    print(json.dumps(result["_meta"]))
    for section in ("final GB/s", "streams GB/s", "host memcpy GB/s", "small transfers GB/s"):
        print(f"\n== {section}")
        for k, v in sorted(result[section].items(), key=lambda kv: -kv[1]):
            print(f"   {k:70s} {v:7.2f}")
    print("\n== staging memory")
    for k, v in result["staging memory"].items():
        print(f"   {k}: {v}")
    print("\n== grid, top 12 per direction (GB/s)")
    for direction in ("H2D", "D2H"):
        rows = sorted(((k, v) for k, v in result["grid GB/s"].items()
                       if k.startswith(direction)), key=lambda kv: -kv[1])
        for k, v in rows[:12]:
            print(f"   {k:70s} {v:7.2f}")


if __name__ == "__main__":
    sys.exit(main())
